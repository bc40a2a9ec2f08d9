"""One problem does not hide the layout's own: a key that names nothing (a misspelt section, field or `--set` key) is
dropped by every loader, which keeps going, and a model whose own cross-field checks fail (heads and hidden size
disagree) is still checked against the layout; the error lists all of them together with every layout violation
(build_scenario). Before, each of these stopped at the first, and the layout was checked only once it was fixed
(fuzz audit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection.api import load
from projection.errors import ConfigError
from tests.cli.test_bad_input import FIXTURES, GOOD

REPO = Path(__file__).resolve().parents[2]
BRIDGE = REPO / "benchmarks/bridge_runs/llama32_1b_bf16_8xh100.yaml"  # TP 1 in the file, 8 GPUs
PRIMUS = FIXTURES / "primus/examples/megatron/configs/MI300X/llama3_8B-BF16-pretrain.yaml"
MEGATRON = ("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 "
            "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 32000 "
            "--tensor-model-parallel-size 3\n")
TP3 = "tp = 3 does not divide num_attention_heads"  # the layout's own problem, in every case below


def messages(path: Path, overrides: dict[str, str] | None = None, **kwargs: object) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load(path, overrides=overrides, **kwargs)  # type: ignore[arg-type]
    return [f"{p.key}: {p.message}" for p in err.value.problems]


def assert_both(found: list[str], unknown: str) -> None:
    assert any(unknown in m for m in found), found
    assert any(TP3 in m for m in found), found
    assert len([m for m in found if unknown in m]) == 1, found  # named once, not again as an "unknown argument"


def test_native_top_level_key(tmp_path: Path) -> None:
    p = tmp_path / "exp.yaml"
    p.write_text(GOOD.replace("  tp: 2", "  tp: 3") + "clusterr: {nodes: 2}\n")
    assert_both(messages(p), "clusterr: unknown top-level key")


@pytest.mark.parametrize("key", ["tensr_model_parallel_size", "trainig.seq_length"])
def test_megatron_set_key(tmp_path: Path, key: str) -> None:
    p = tmp_path / "train.sh"
    p.write_text(MEGATRON)
    assert_both(messages(p, {key: "2"}, gpus_per_node=8), f"{key}: --set {key}")


def test_megatron_flat_preset_names_the_misspelt_training_key(tmp_path: Path) -> None:
    """A model-only file with `--set trainig.seq_length`: the misspelling is named beside "describes a model only"."""
    p = tmp_path / "model.yaml"
    p.write_text("num_layers: 2\nhidden_size: 1024\nnum_attention_heads: 16\n")
    found = messages(p, {"trainig.seq_length": "1024"}, fmt="megatron")
    assert any("'trainig' is not a section" in m for m in found), found
    assert any("describes a model only" in m for m in found), found


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared fixtures absent (user clone)")
@pytest.mark.parametrize("key", ["tensor_model_paralel_size", "modules.pre_trainer.tensor_model_paralel_size"])
def test_primus_set_key(key: str) -> None:
    found = messages(PRIMUS, {key: "2", "tensor_model_parallel_size": "3"}, gpus_per_node=8)
    assert_both(found, f"{key}: --set {key}: not a Megatron argument")


def test_bridge_set_key() -> None:
    found = messages(BRIDGE, {"model.tensor_model_paralel_size": "2", "model.tensor_model_parallel_size": "3"})
    assert_both(found, "model.tensor_model_paralel_size: --set model.tensor_model_paralel_size")


def test_bridge_misspelt_field_and_section(tmp_path: Path) -> None:
    text = BRIDGE.read_text()
    assert "\n  tensor_model_parallel_size: 1\n" in text and "\ntrain:\n" in text
    text = text.replace("\n  tensor_model_parallel_size: 1\n",
                        "\n  tensor_model_parallel_size: 3\n  tensor_model_paralel_size: 2\n")
    p = tmp_path / "run_config.yaml"
    p.write_text(text.replace("\ntrain:\n", "\ntrian: {}\ntrain:\n"))
    found = messages(p)
    assert_both(found, "model.tensor_model_paralel_size: unknown field")
    assert any("trian: unknown Megatron-Bridge section" in m for m in found), found


def test_model_cross_checks_with_the_layout(tmp_path: Path) -> None:
    """Heads that divide neither the hidden size nor by the kv heads, a misspelt plan key and tp = 3 on 8 GPUs:
    all reported at once."""
    p = tmp_path / "exp.yaml"
    p.write_text(GOOD.replace("  tp: 2", "  tp: 3\n  tpp: 1").replace("num_attention_heads: 32",
                                                                       "num_attention_heads: 30"))
    found = messages(p)
    for needle in ("model.hidden_size: hidden_size 4096 is not divisible by num_attention_heads 30",
                   "model.num_attention_heads: num_attention_heads 30 is not a multiple of num_kv_heads 8",
                   "plan.tpp: unknown key", "plan.tp: world size 8 is not divisible by tp * cp * pp = 3 * 1 * 2",
                   "plan.tp: num_query_groups = 8 is neither a multiple nor a divisor of tp = 3"):
        assert sum(needle in m for m in found) == 1, (needle, found)


@pytest.mark.parametrize("hardware", ["mi300z", "missing/dev.yaml"])
def test_an_unknown_device_does_not_hide_the_sections_problems(tmp_path: Path, hardware: str) -> None:
    """No device to check the layout against, but the model, training and plan sections are checked all the same:
    a wrong value type and a misspelt key are listed with the device's problem (before, only the device was)."""
    p = tmp_path / "exp.yaml"
    p.write_text(GOOD.replace("hardware: mi300x", f"hardware: {hardware}").replace("seq_length: 4096", "seq_length: "
                 "eight").replace("  tp: 2", "  tp: 2\n  tpp: 4"))
    found = messages(p)
    assert len(found) == 3, found
    assert found[0].startswith("cluster.hardware: ") and ("unknown device" in found[0] or "not found" in found[0])
    assert any(m.startswith("training.seq_length: Input should be a valid integer") for m in found), found
    assert any(m.startswith("plan.tpp: unknown key") for m in found), found
