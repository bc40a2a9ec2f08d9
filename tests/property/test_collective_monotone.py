"""A bigger message never takes less time: every shipped calibration's collective pricing is non-decreasing in size
for every kind and a spread of placements (inside one node, one or several GPUs per node across nodes). The fitted
curves are piecewise; between two segments, where nothing was measured, the time is interpolated (a step at the
boundary used to make a 372 MiB all-reduce on 8 MI300X nodes 33 % cheaper than a 357 MiB one)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projection import api
from projection.cost.collectives import CollectiveKind, GroupPlacement
from projection.cost.model import CostModel
from projection.perf import default_cost_model
from projection.perf.costmodel import CALIBRATIONS_DIR

DEVICES = sorted(p.stem for p in CALIBRATIONS_DIR.glob("*.json") if p.stem != "framework_host")
PLACEMENTS = [GroupPlacement(2, 2, 1), GroupPlacement(4, 4, 1), GroupPlacement(8, 8, 1), GroupPlacement(8, 1, 8),
              GroupPlacement(16, 8, 2), GroupPlacement(64, 8, 8), GroupPlacement(32, 4, 8)]
KINDS: list[CollectiveKind] = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]


def _model(device: str) -> CostModel:
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"
    return default_cost_model(api.load(example, hardware=device, nodes=8))


MODELS = {d: _model(d) for d in DEVICES}


@settings(max_examples=300, deadline=None)
@given(device=st.sampled_from(DEVICES), kind=st.sampled_from(KINDS), where=st.sampled_from(PLACEMENTS),
       size=st.floats(min_value=1e3, max_value=3e10), ratio=st.floats(min_value=1.0, max_value=1.5))
def test_collective_time_is_non_decreasing_in_size(device: str, kind: CollectiveKind, where: GroupPlacement,
                                                   size: float, ratio: float) -> None:
    cm = MODELS[device]
    if kind == "send_recv" and where.n_ranks != 2:
        where = GroupPlacement(2, where.ranks_per_node if where.ranks_per_node <= 2 else 2, min(where.n_nodes, 2))
    small, big = cm.collective_seconds(kind, size, where), cm.collective_seconds(kind, size * ratio, where)
    assert big >= small * (1 - 1e-12), (device, kind, where, size, ratio, small, big)


@pytest.mark.parametrize("device", ["mi300x", "mi355x", "h100-sxm"])
def test_the_reported_boundaries(device: str) -> None:
    cm = MODELS[device]
    for where, lo, hi in ((GroupPlacement(8, 1, 8), 357.1 * 2**20, 372.2 * 2**20),
                          (GroupPlacement(8, 8, 1), 44.6 * 2**20, 46.5 * 2**20)):
        assert cm.collective_seconds("all_reduce", hi, where) >= cm.collective_seconds("all_reduce", lo, where)


def _oversubscribed(device: str, topology: str, ratio: float) -> CostModel:
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"
    return default_cost_model(api.load(example, hardware=device, nodes=8, overrides={
        "cluster.inter_node_topology": topology, "cluster.oversubscription": ratio}))


OVER = {(d, t): (_oversubscribed(d, t, 1.0), _oversubscribed(d, t, 4.0))
        for d in ("mi300x", "mi355x", "h100-sxm") for t in ("rail_optimized", "fat_tree")}
CROSS = [*PLACEMENTS, GroupPlacement(16, 2, 8, rail_aligned=False)]


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(OVER)), kind=st.sampled_from(KINDS[:5]), where=st.sampled_from(CROSS),
       size=st.floats(min_value=1e3, max_value=3e10))
def test_oversubscription_never_lowers_a_price(key: tuple[str, str], kind: CollectiveKind, where: GroupPlacement,
                                               size: float) -> None:
    """A 4:1 upper tier can only slow a collective, the measured sweep's own placement (16 ranks on 2 nodes)
    included; rail-aligned traffic on a rail-optimised fabric does not cross it at all."""
    free, tight = OVER[key]
    a, b = free.collective_seconds(kind, size, where), tight.collective_seconds(kind, size, where)
    assert b >= a * (1 - 1e-12), (key, kind, where, size, a, b)
    if key[1] == "rail_optimized" and where.rail_aligned:
        assert b == pytest.approx(a, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(noise=st.lists(st.floats(min_value=0.8, max_value=1.25), min_size=12, max_size=12),
       size=st.floats(min_value=4.0, max_value=3e9), ratio=st.floats(min_value=1.0, max_value=2.0))
def test_a_curve_fitted_to_a_noisy_sweep_never_falls(noise: list[float], size: float, ratio: float) -> None:
    """Imported sweeps are noisy where they are latency-bound (an audit found a fitted A100 all-reduce cheaper at
    256 B than at 128 B, its first segment chasing one slow row): a later segment never prices below where an
    earlier one ended."""
    from projection.calibrate.calibration import Calibration, CollectiveRow
    from projection.calibrate.fit import fit_calibration

    sizes = [4 << (3 * i) for i in range(12)]  # 4 B .. 8 GiB
    rows = tuple(CollectiveRow(kind="all_reduce", n_ranks=8, n_nodes=1, size_bytes=s,
                               time_s=(30e-6 + 1.75 * s / 200e9) * f) for s, f in zip(sizes, noise, strict=True))
    curve = fit_calibration(Calibration(collective=rows)).curves[0].to_curve()
    assert curve.time_s(size * ratio) >= curve.time_s(size) * (1 - 1e-12)
