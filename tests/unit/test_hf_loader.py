"""HuggingFace config.json: what the file says of training (its checkpoint dtype) and what it leaves to flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection import api

LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8,
         "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 32000, "max_position_embeddings": 2048}


@pytest.mark.parametrize(("torch_dtype", "params_dtype", "from_file"),
                         [("bfloat16", "bf16", True), ("float16", "fp16", True), ("float32", "bf16", False),
                          (None, "bf16", False)])
def test_checkpoint_dtype_sets_training_dtype_only_when_16_bit(tmp_path: Path, torch_dtype: str | None,
                                                               params_dtype: str, from_file: bool) -> None:
    """A float32 checkpoint is not an fp32 training job (mixed-precision runs often save float32 weights): it keeps
    the bf16 default, which --set overrides."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **({"torch_dtype": torch_dtype} if torch_dtype else {})}))
    sc = api.load(path, hardware="h100-sxm")
    assert sc.training.params_dtype == params_dtype
    assert ("(torch_dtype)" in sc.origins.get("training.params_dtype", "")) == from_file
    assert api.load(path, hardware="h100-sxm", overrides={"training.params_dtype": "fp32"}).training.params_dtype \
        == "fp32"


@pytest.mark.parametrize(("extra", "window", "first"), [
    ({"model_type": "mistral", "sliding_window": 256}, 256, 0),
    ({"model_type": "mistral", "sliding_window": None}, None, 0),
    ({"model_type": "qwen2", "sliding_window": 256, "use_sliding_window": False, "max_window_layers": 2}, None, 0),
    ({"model_type": "qwen2", "sliding_window": 256, "use_sliding_window": True, "max_window_layers": 2}, 256, 2),
])
def test_sliding_window_as_transformers_applies_it(tmp_path: Path, extra: dict, window: int | None,
                                                   first: int) -> None:
    """Mistral windows every layer when sliding_window is set; Qwen2 only with use_sliding_window, from
    max_window_layers on (the window used to be ignored: full causal attention at any length)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **extra}))
    model = api.load(path, hardware="h100-sxm").model
    assert (model.sliding_window, model.sliding_window_from_layer) == (window, first)


def test_windowed_attention_counts_the_band_it_computes() -> None:
    """Keys per query of a causal sliding window, against the band's own count: the ones of a lower-triangular mask
    cut to the last w keys (torch builds it, independently of the formula); a flash kernel skips the blocks outside
    the band, so the attention op's FLOPs scale with it, and layers before sliding_window_from_layer attend fully."""
    torch = pytest.importorskip("torch")
    from projection.specs.model import ModelSpec
    from projection.specs.plan import ParallelPlan
    from projection.specs.training import TrainingSpec
    from projection.workload.ops import layer_ops

    s, w = 512, 96
    band = torch.ones(s, s).tril().triu(-(w - 1))  # query i sees keys i-w+1 .. i
    model = ModelSpec(num_layers=2, hidden_size=256, num_attention_heads=4, ffn_hidden_size=512, vocab_size=1000,
                      sliding_window=w, sliding_window_from_layer=1)
    assert model.keys_per_query(1, s, causal=True) * s == pytest.approx(float(band.sum()))
    assert model.keys_per_query(0, s, causal=True) == s / 2 and model.keys_per_query(1, s, causal=False) == w
    training = TrainingSpec(seq_length=s, micro_batch_size=1, attention_backend="flash")

    def attn_flop(i: int) -> float:
        return sum(o.total_flop for o in layer_ops(model, training, ParallelPlan(dp=1), i) if o.kind == "attention")

    assert attn_flop(1) / attn_flop(0) == pytest.approx(float(band.sum()) / (s * s / 2))

    # hardware FLOPs count the recomputed forward in the formula's convention (min(s, w) keys per query), not the
    # band's: under full recompute the extra is 2 x tokens x the layers' forward multiply-accumulates
    from projection.perf import project
    from projection.specs.hardware import ClusterSpec, load_device
    from projection.specs.plan import RecomputeSpec
    from projection.specs.scenario import Scenario
    from projection.workload.model_flops import layer_macs_per_token

    plan = ParallelPlan(dp=1, recompute=RecomputeSpec(granularity="full", method="uniform", num_layers=1))
    sc = Scenario(model=model, training=training.model_copy(update={"global_batch_size": 1}), plan=plan,
                  cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=1))
    proj = project(sc)
    extra = 2 * s * sum(layer_macs_per_token(model, i, s) for i in range(model.num_layers))
    assert proj.hardware_flops_per_step - proj.model_flops_per_step == pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize(("extra", "key"), [
    ({"model_type": "mistral", "sliding_window": -4096}, "sliding_window"),
    ({"model_type": "mistral", "sliding_window": "4096"}, "sliding_window"),
    ({"model_type": "mistral", "sliding_window": 0}, "sliding_window"),
    ({"model_type": "mistral", "sliding_window": 2.5}, "sliding_window"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"dtype": 16}, "dtype"),
])
def test_a_bad_window_or_dtype_is_refused_not_dropped(tmp_path: Path, extra: dict, key: str) -> None:
    """An invalid sliding_window used to be dropped (full attention, exit 0) and an unknown dtype to become bf16."""
    from projection.errors import ConfigError

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, **extra}))
    with pytest.raises(ConfigError) as err:
        api.load(path, hardware="h100-sxm")
    assert err.value.problems[0].key == key and str(path) in str(err.value)
