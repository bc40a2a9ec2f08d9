"""`--explain` formulas evaluate to the estimator's own numbers (the printed formula is the computed one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.memory.activations import layer_tensors
from projection.memory.estimate import estimate_memory
from projection.memory.explain import _MAIN_TERMS, explain, layer_formula, state_formulas

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides", [[], ["plan.sharding.zero_stage=3", "plan.sharding.fsdp=megatron_fsdp"],
                                       ["plan.sharding.zero_stage=2"], ["training.params_dtype=fp32"],
                                       ["plan.offload.optimizer=true", "plan.offload.optimizer_fraction=0.5"],
                                       ["training.fp8.format=hybrid"]])
def test_state_formulas_equal_terms(overrides: list[str]) -> None:
    """Each formula equals its main term, and with the addends --explain lists under it (fp8 copies, FSDP units in
    flight, ...) the table's category: what --explain shows adds up to what the table and JSON report."""
    sc = api.load(REPO / "examples/llama3.1_70B-mi300x.yaml", overrides=overrides)
    rep = estimate_memory(sc)
    text = explain(rep)
    for r in rep.ranks:
        (_, w, ws), (_, g, gs), (_, o, os_) = state_formulas(sc, r.pp_rank)
        assert float(w.subs(ws)) == pytest.approx(r.terms.get("weights.params", r.terms.get("weights.sharded")))
        assert float(g.subs(gs)) == pytest.approx(r.bytes["gradients"])
        assert float(o.subs(os_)) == pytest.approx(r.bytes["optimizer"], abs=2)
        extra = sum(v for k, v in r.terms.items() if k.startswith("weights.") and k not in _MAIN_TERMS["weights"])
        assert float(w.subs(ws)) + extra == pytest.approx(r.bytes["weights"], abs=2)
        if extra:
            assert f"{r.bytes['weights']:,.0f}" in text


def test_layer_formula_equals_inventory() -> None:
    sc = api.load(REPO / "examples/llama3.1_70B-mi300x.yaml")
    expr, subs = layer_formula(sc, 0)
    assert float(expr.subs(subs)) == pytest.approx(sum(layer_tensors(sc.model, sc.training, sc.plan, 0).values()))
    text = explain(estimate_memory(sc))
    assert "pp_rank 3" in text and "b*s*" in text


FP16_TP4 = REPO.parent / "shared/fixtures/megatron/gpt3_mcore_tp4_pp1_resume_torch_dist/model_config.yaml"


@pytest.mark.parametrize(("config", "overrides"), [
    ("examples/llama3.1_70B-mi300x.yaml", []), ("examples/llama3.1_70B-mi300x.yaml", ["training.seq_length=128"]),
    (str(FP16_TP4), []), (str(FP16_TP4), ["seq_length=128"])])  # fp16: 16-bit main grads, fp32 copies at the step
def test_terms_are_the_addends_of_the_peak(config: str, overrides: list[str]) -> None:
    """`terms` names every addend of the peak: those of the moment it is at (the forward/backward with its
    activations and working set, or the optimizer step with its own buffers), never both."""
    if config == str(FP16_TP4) and not FP16_TP4.is_file():
        pytest.skip("shared/fixtures/megatron absent (user clone)")
    sc = api.load(REPO / config, overrides=overrides, nodes=1 if config == str(FP16_TP4) else None,
                  gpus_per_node=8 if config == str(FP16_TP4) else None)
    for r in estimate_memory(sc).ranks:
        assert sum(r.terms.values()) == pytest.approx(r.peak_bytes, abs=len(r.terms))


def test_attention_and_hidden_dropout_are_separate() -> None:
    """Megatron's two rates: --attention-dropout drops the attention probabilities (a 1-byte mask and the dropped
    copy, saved only without flash attention, Korthikanti et al. 2022's 5 a s^2 b term: 2 + 2 + 1 bytes), and
    --hidden-dropout the residual and embedding outputs (a 1-byte mask each). Zeroing one keeps the other's tensors
    (they used to be one rate: the larger of the two)."""
    from projection.memory.activations import layer_tensors
    from projection.specs.model import ModelSpec
    from projection.specs.plan import ParallelPlan
    from projection.specs.training import TrainingSpec

    gpt = ModelSpec(num_layers=2, hidden_size=512, num_attention_heads=8, ffn_hidden_size=2048, vocab_size=1000,
                    gated_mlp=False)
    plan = ParallelPlan(dp=1)

    def names(dropout: float, attention: float) -> set[str]:
        t = TrainingSpec(seq_length=256, micro_batch_size=2, attention_backend="unfused", dropout=dropout,
                         attention_dropout=attention)
        return {k for k, v in layer_tensors(gpt, t, plan, 0).items() if "dropout" in k and v > 0}

    both = {"attn.dropout_mask", "attn.dropout", "attn.out_dropout_mask", "mlp.dropout_mask"}
    assert names(0.1, 0.1) == both
    assert names(0.1, 0.0) == {"attn.out_dropout_mask", "mlp.dropout_mask"}
    assert names(0.0, 0.1) == {"attn.dropout_mask", "attn.dropout"}
    assert TrainingSpec(seq_length=8, dropout=0.1).attention_dropout_ == 0.1  # one rate given: both
