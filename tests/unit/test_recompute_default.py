"""A selective recompute without modules recomputes Megatron's default module (specs/plan.RecomputeSpec)."""

from __future__ import annotations

from pathlib import Path

from projection import api
from projection.perf import project


def test_selective_recompute_without_modules_recomputes_megatrons_default() -> None:
    """An audit set plan.recompute.granularity=selective on a native file: hardware FLOPs equal model FLOPs, nothing
    recomputed, no word. Without modules selective now means Megatron's default --recompute-modules, core_attn, as a
    Megatron file resolves it: one more forward of the attention core (causal as priced, full in the FLOP count)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"
    sel = api.load(example, overrides={"plan.recompute.granularity": "selective"})
    assert sel.plan.recompute.modules == ("core_attn",)
    named = api.load(example, overrides={"plan.recompute.granularity": "selective",
                                          "plan.recompute.modules": ["core_attn"]})
    p, q = project(sel), project(named)
    assert p.hardware_flops_per_step == q.hardware_flops_per_step > p.model_flops_per_step
    m, t = sel.model, sel.training
    attention_fwd = 4 * t.seq_length**2 * m.hidden_size * m.num_layers * t.resolved_global_batch(sel.plan.dp_())
    assert p.hardware_flops_per_step - p.model_flops_per_step == attention_fwd  # QK^T and PV, 2 FLOPs a MAC
