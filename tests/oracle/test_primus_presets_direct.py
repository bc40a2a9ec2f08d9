"""A Primus model preset passed directly as the config (primus/configs/models/megatron/<name>.yaml, whose `extends:`
chain carries most of the model) is loaded as the experiment naming it would build it
(projection/formats/primus_preset.py). Oracles: the parameter count of the resulting model equals what PyTorch counts
on the same architecture built by HuggingFace `transformers` on the meta device (tests/oracle/hf_models.py), and the
model equals the one an experiment naming the preset resolves to through the Primus checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ConfigError
from projection.formats.detect import load_raw
from projection.specs.model import ModelSpec
from projection.workload.params import model_params

PRIMUS = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "primus"
PRESETS = PRIMUS / "primus" / "configs" / "models" / "megatron"
if not PRESETS.is_dir():
    pytest.skip(f"shared Primus fixtures not present at {PRIMUS}", allow_module_level=True)
# the presets that describe a whole model (the *_base.yaml files and language_model.yaml are fragments)
NAMES = ["mixtral_8x7B_v0.1", "llama2_7B", "llama3_8B", "llama3.1_8B", "llama3.1_70B", "qwen2.5_72B",
         "deepseek_v2_lite", "deepseek_v3"]


def _model(path: Path, **kw: object) -> ModelSpec:
    return ModelSpec.model_validate(load_raw(path, **kw).data["model"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
def test_direct_preset_counts_like_transformers(name: str) -> None:
    hf = pytest.importorskip("tests.oracle.hf_models")
    model = _model(PRESETS / f"{name}.yaml")
    ours = model_params(model)
    hf_cfg = hf.hf_config_for(model, vocab=model.padded_vocab(1))
    assert sum(ours.values()) - ours["mtp"] == hf.count(hf.meta_model(hf_cfg))


@pytest.mark.parametrize("name", ["mixtral_8x7B_v0.1", "deepseek_v3"])
def test_direct_preset_equals_the_experiment_naming_it(name: str, tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"modules:\n  pre_trainer:\n    framework: megatron\n    config: pre_trainer.yaml\n"
                   f"    model: {name}.yaml\n", encoding="utf-8")
    assert _model(PRESETS / f"{name}.yaml", primus_root=PRIMUS) == _model(exp, primus_root=PRIMUS)


def test_published_sizes() -> None:
    # Mixtral 8x7B: 46.7 B parameters (Mistral AI's model card); DeepSeek-V3: 671 B + 14 B MTP module (the technical
    # report, arXiv 2412.19437), with the padded vocabulary of Megatron here
    names = ("mixtral_8x7B_v0.1", "deepseek_v3")
    totals = {n: sum(model_params(_model(PRESETS / f"{n}.yaml")).values()) for n in names}
    assert totals["mixtral_8x7B_v0.1"] == pytest.approx(46.7e9, rel=0.01)
    assert totals["deepseek_v3"] == pytest.approx(671e9 + 14e9, rel=0.02)


def test_fragment_with_extends_but_no_model_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("tokenizer_type: Llama2Tokenizer\n", encoding="utf-8")
    top = tmp_path / "top.yaml"
    top.write_text("extends:\n  - base.yaml\nmax_position_embeddings: 4096\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        api.load(top, hardware="mi300x")
    msg = str(info.value)
    assert str(top) in msg and "extends" in msg and "modules:" in msg
