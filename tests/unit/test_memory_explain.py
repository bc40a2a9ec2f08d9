"""`--explain` formulas evaluate to the estimator's own numbers (the printed formula is the computed one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.memory.activations import layer_tensors
from projection.memory.estimate import estimate_memory
from projection.memory.explain import explain, layer_formula, state_formulas

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides", [[], ["plan.sharding.zero_stage=3", "plan.sharding.fsdp=megatron_fsdp"],
                                       ["plan.sharding.zero_stage=2"], ["training.params_dtype=fp32"]])
def test_state_formulas_equal_terms(overrides: list[str]) -> None:
    sc = api.load(REPO / "examples/llama3.1_70B-mi300x.yaml", overrides=overrides)
    rep = estimate_memory(sc)
    for r in rep.ranks:
        (_, w, ws), (_, g, gs), (_, o, os_) = state_formulas(sc, r.pp_rank)
        assert float(w.subs(ws)) == pytest.approx(r.terms.get("weights.params", r.terms.get("weights.sharded")))
        assert float(g.subs(gs)) == pytest.approx(r.bytes["gradients"])
        assert float(o.subs(os_)) == pytest.approx(r.bytes["optimizer"])


def test_layer_formula_equals_inventory() -> None:
    sc = api.load(REPO / "examples/llama3.1_70B-mi300x.yaml")
    expr, subs = layer_formula(sc, 0)
    assert float(expr.subs(subs)) == pytest.approx(sum(layer_tensors(sc.model, sc.training, sc.plan, 0).values()))
    text = explain(estimate_memory(sc))
    assert "pp_rank 3" in text and "b*s*" in text
