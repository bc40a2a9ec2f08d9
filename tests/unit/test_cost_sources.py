"""`cost sources` of `projection performance` says where every priced second comes from, collectives included (an
audit found the data-parallel and FSDP collectives missing from it, all-gathers priced with tiers fitted to the
calibration's all-reduce curve labelled "roofline", and curves used far outside what they measured labelled as
measured). Checked against the calibration's own curve: its placement and its measured sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.cost.collectives import GroupPlacement
from projection.perf import default_cost_model, project

HF = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "hf" / "Meta-Llama-3.1-8B.config.json"
needs_fixture = pytest.mark.skipif(not HF.is_file(), reason=f"shared fixtures absent at {HF}")


@needs_fixture
def test_data_parallel_collectives_are_a_cost_source() -> None:
    sc = api.load(HF, hardware="a100-80g", nodes=1)  # dp 8: one gradient all-reduce of the whole buffer
    r = project(sc)
    (bucket,) = r.dp.grad_buckets
    curve = default_cost_model(sc).fabric.curve_for("all_reduce", GroupPlacement(8, 8, 1))
    assert curve is not None and bucket.size_bytes > max(s.last_bytes for s in curve.segments)
    label = "calibrated: a100-80g.json all_reduce curve (outside the measured sizes)"
    assert r.provenance[label] > 0.1  # the bucket's 0.24 s of a ~1.3 s step's priced seconds
    assert sum(r.provenance.values()) == pytest.approx(1.0)


@needs_fixture
def test_a_kind_without_a_curve_names_the_fitted_tier_and_a_scaled_curve_its_placement() -> None:
    sc = api.load(HF, hardware="a100-80g", nodes=1, overrides={"plan.tp": 8, "plan.sp": True})
    cm = default_cost_model(sc)
    tier = "calibrated: a100-80g.json intra_node tier (fitted to its measured curves)"
    assert cm.collective_provenance("all_gather", 1 << 24, GroupPlacement(8, 8, 1)) == tier
    assert tier in project(sc).provenance
    assert cm.collective_provenance("all_reduce", 1 << 24, GroupPlacement(8, 8, 1)) == \
        "calibrated: a100-80g.json all_reduce curve"
    assert cm.collective_provenance("all_reduce", 1 << 24, GroupPlacement(4, 4, 1)) == \
        "calibrated: a100-80g.json all_reduce curve (scaled from 8 ranks on 1 node(s))"
