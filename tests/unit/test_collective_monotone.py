"""A collective over a group is never priced below the same collective over a smaller group it holds, on the same
fabric: every bundled device, with its shipped calibration and without (the device YAML's analytic fabric), for
all_reduce, all_gather and reduce_scatter, 1 KiB to 16 GiB, full-node groups of 1 to 64 nodes.

What "the same collective" is (nccl-tests size convention, hardware.md §0):
* all_reduce: the same S bytes on every rank, whatever the group;
* all_gather / reduce_scatter: the same per-rank shard s = S / GPUs per node, so the gathered output (or the
  scattered input) of n ranks is n x s bytes. A fixed total would shrink each rank's share as the group grows, and a
  larger group could rightly be faster.

An audit found all-reduce prices falling as the group grew where a calibration curve was measured: on MI325X a 16 MiB
all-reduce over 64 ranks on 8 nodes at 0.724 ms, over 128 on 16 nodes at 0.175 ms (the 8-node sweep, run with
NCCL_ALGO=Ring forced, priced every size there as a ring of 126 latency steps); on MI300X 1 MiB at 0.370 ms on
2 nodes and 0.127 ms on 4 (the 2-node sweep slower than the analytic hierarchical algorithm on 4 nodes)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from projection import api
from projection.calibrate.calibration import Calibration, CollectiveRow
from projection.calibrate.fit import fit_calibration, forced_algorithm
from projection.cost.calibrated import CalibratedCostModel, held_time_s, subgroup_floor
from projection.cost.collectives import (
    CollectiveKind,
    CurveSegment,
    Fabric,
    GroupPlacement,
    MeasuredCurve,
    ring_steps,
)
from projection.cost.model import CostModel
from projection.cost.roofline import RooflineCostModel
from projection.perf import default_cost_model
from projection.perf.costmodel import shipped_calibration
from projection.specs.hardware import list_devices, load_device

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"
DEVICES = list_devices()
KINDS: tuple[CollectiveKind, ...] = ("all_reduce", "all_gather", "reduce_scatter")
SIZES = [2**k for k in range(10, 35)]  # 1 KiB .. 16 GiB
NODES = (1, 2, 4, 8, 16, 32, 64)
TOLERANCE = 1e-9  # relative: rounding only

# (device, model, kind, smaller node count, larger node count) -> why a larger group is priced faster there. Both
# are measured placements, and a measured time stands at its own placement (the tuner's choice; with a forced
# algorithm, a time the tuner can reach): large all-reduces measured faster on 2 nodes than on 1. A ring across nodes
# also sends over the NICs, which a ring inside one node leaves idle (xGMI mesh nodes; 50 GB/s per GPU beside the
# ring's 316-319 GB/s).
ACROSS_NODES = "a 2-node ring also sends over the NICs"
EXCLUDED: dict[tuple[str, str, CollectiveKind, int, int], str] = {
    ("mi325x", "calibrated", "all_reduce", 1, 2):
        f"{ACROSS_NODES}: one cluster, one algorithm (AAC11, NCCL_ALGO=Ring, calibrations/mi325x.json): 16 GiB busbw "
        "319.08 GB/s on 1 node, 350.24 on 2 (94.22 vs 91.97 ms), so from 1 GiB up 2 nodes are priced up to 2.4 % "
        "below 1 node",
    ("mi300x", "calibrated", "all_reduce", 1, 2):
        f"{ACROSS_NODES}: the 2-node sweep (AAC10, calibrations/mi300x.json) reaches 357 GB/s busbw at 16 GiB, above "
        "both 1-node sweeps (316, Azure and AAC8), so from 1 GiB up 2 nodes are priced up to 5 % below 1 node",
}


@cache
def _models(device: str) -> dict[str, CostModel]:
    scenario = api.load(EXAMPLE, hardware=device, nodes=8)
    cluster = scenario.cluster
    out: dict[str, CostModel] = {"analytic": RooflineCostModel(cluster.device, fabric=Fabric.from_specs(
        cluster.device, cluster))}
    if shipped_calibration(device) is not None:
        out["calibrated"] = default_cost_model(scenario)
    return out


def _calibrated(device: str) -> CalibratedCostModel:
    cm = _models(device)["calibrated"]
    assert isinstance(cm, CalibratedCostModel) and cm.fabric is not None
    return cm


def _seconds(cm: CostModel, kind: CollectiveKind, size: int, nodes: int, gpus: int) -> float:
    """size: all_reduce S; all_gather / reduce_scatter: the shard of each rank is size / gpus (its one-node total)."""
    n = nodes * gpus
    total = size if kind == "all_reduce" else size / gpus * n
    return cm.collective_seconds(kind, total, GroupPlacement(n, gpus, nodes))


@pytest.mark.parametrize("device", DEVICES)
def test_a_larger_group_is_never_priced_faster(device: str) -> None:
    gpus = load_device(device).gpus_per_node
    failures = []
    for name, cm in _models(device).items():
        for kind in KINDS:
            for size in SIZES:
                times = [_seconds(cm, kind, size, m, gpus) for m in NODES]
                for i, small in enumerate(NODES):
                    for j in range(i + 1, len(NODES)):
                        if (device, name, kind, small, NODES[j]) in EXCLUDED:
                            continue
                        if times[j] < times[i] * (1 - TOLERANCE):
                            failures.append(f"{name} {kind} {size} B: {small} nodes {times[i] * 1e3:.4f} ms, "
                                            f"{NODES[j]} nodes {times[j] * 1e3:.4f} ms")
    assert not failures, f"{device}: {len(failures)} pairs, e.g. {failures[:5]}"


@pytest.mark.parametrize("key", sorted(EXCLUDED))
def test_each_exclusion_is_still_needed(key: tuple[str, str, CollectiveKind, int, int]) -> None:
    """An exclusion that no longer applies is dropped, not kept as a blind spot."""
    device, name, kind, small, large = key
    cm, gpus = _models(device)[name], load_device(device).gpus_per_node
    assert any(_seconds(cm, kind, s, large, gpus) < _seconds(cm, kind, s, small, gpus) for s in SIZES)


def test_the_audited_prices_now_rise_with_the_group() -> None:
    mi325x, mi300x = _calibrated("mi325x"), _calibrated("mi300x")
    mib = 2**20
    assert mi325x.collective_seconds("all_reduce", 16 * mib, GroupPlacement(64, 8, 8)) <= \
        mi325x.collective_seconds("all_reduce", 16 * mib, GroupPlacement(128, 8, 16))
    assert mi300x.collective_seconds("all_reduce", mib, GroupPlacement(16, 8, 2)) <= \
        mi300x.collective_seconds("all_reduce", mib, GroupPlacement(32, 8, 4))


def test_a_forced_algorithm_is_read_from_the_source() -> None:
    """NCCL_ALGO is a comma list of the algorithms left to the tuner, '^' excluding (parseList, NVIDIA/nccl
    src/graph/tuning.cc): only a single name forces one."""
    assert forced_algorithm("R: AAC11 (bnxt_re RoCE, NCCL_ALGO=Ring), all_reduce 2 node(s)") == "ring"
    assert forced_algorithm('NCCL_ALGO="Tree" all_reduce_perf') == "tree"
    for free in ("NCCL_ALGO=Ring,Tree", "NCCL_ALGO=^Tree", "NCCL_ALGO=allreduce:ring", "rccl-tests all_reduce", ""):
        assert forced_algorithm(free) is None
    for device, forced in (("mi325x", {"ring"}), ("mi300x", {None})):
        fabric = _calibrated(device).fabric
        assert fabric is not None and {c.algorithm for c in fabric.curves} == forced


def test_a_forced_ring_is_one_candidate_at_its_own_placement() -> None:
    """At 8 MI325X nodes, where the 16 GiB ring was measured with NCCL_ALGO=Ring: the measured row is the price at its
    size (the ring is the fastest there), a 16 MiB all-reduce is not a ring of 126 latency steps (0.724 ms before)."""
    cm = _calibrated("mi325x")
    fabric = cm.fabric
    assert fabric is not None
    group = GroupPlacement(64, 8, 8)
    (row,) = [r for r in cm.calibration.collective if r.n_nodes == 8]
    assert cm.collective_seconds("all_reduce", row.size_bytes, group) == pytest.approx(row.time_s, rel=1e-9)
    curve = fabric.curve_for("all_reduce", group)
    assert curve is not None and not curve.stands_at(group)
    as_ring = curve.time_s(16 * 2**20)
    assert cm.collective_seconds("all_reduce", 16 * 2**20, group) < 0.5 * as_ring


def test_a_curve_measured_with_the_tuner_free_stands_at_its_own_placement() -> None:
    """From its smallest measured size (16 MiB, MI300X on 2 nodes) up; below it the fit's intercept (0.36 ms) is no
    measurement, so the curve is one candidate among the tuner's algorithms there, as a forced one is."""
    cm = _calibrated("mi300x")
    fabric = cm.fabric
    assert fabric is not None
    group = GroupPlacement(16, 8, 2)
    curve = fabric.curve_for("all_reduce", group)
    assert curve is not None and curve.stands_at(group) and curve.segments[0].first_bytes == 2**24
    for size in (2**24, 2**27, 2**30, 2**34):
        assert curve.stands_at(group, size)
        assert cm.collective_seconds("all_reduce", size, group) == pytest.approx(curve.time_s(size), rel=1e-12)
    for size in (2**20, 2**22):
        assert not curve.stands_at(group, size)
        assert cm.collective_seconds("all_reduce", size, group) < 0.5 * curve.time_s(size)


def test_a_one_point_curve_takes_its_latency_from_the_device_yaml() -> None:
    """One size cannot separate a latency from a bandwidth: each one-point MI325X curve's latency is the device YAML's
    per-step latency times the ring's steps (the inter-node NIC latency across nodes, the link's inside one)."""
    cm = _calibrated("mi325x")
    fabric = cm.fabric
    assert fabric is not None
    device = load_device("mi325x")
    for c in fabric.curves:
        (seg,) = c.segments
        step = device.nic.latency_s if c.n_nodes > 1 else device.intra_node.latency_s
        assert seg.alpha_s == pytest.approx(step * ring_steps(c.kind, c.n_ranks), rel=1e-12)
    row = CollectiveRow(kind="all_reduce", n_ranks=16, n_nodes=2, size_bytes=2**34, time_s=0.09,
                        source="x NCCL_ALGO=Ring")
    base = Fabric.from_specs(device, api.load(EXAMPLE, hardware="mi325x", nodes=8).cluster)
    (fit,) = fit_calibration(Calibration(collective=(row,)), base).curves
    assert fit.algorithm == "ring" and fit.segments[0].alpha_s == pytest.approx(30 * base.inter.alpha_s)


def test_a_gather_curve_floors_the_groups_holding_it() -> None:
    """A slow all_gather measured on 2 nodes: 4 and 8 nodes gathering the same shard per rank are no faster; the
    floor is the 2-node time of that shard (a total of 16 shards), not of the larger group's total."""
    base = Fabric.from_specs(load_device("mi300x"), api.load(EXAMPLE, hardware="mi300x", nodes=8).cluster)
    slow = MeasuredCurve("all_gather", 16, 8, 2, (CurveSegment(0, 2e-3, 5e9),))
    fabric = base.with_fit(curves=[slow])
    shard = 2**20
    at = [held_time_s("all_gather", shard * 8 * m, GroupPlacement(8 * m, 8, m), fabric)[0] for m in (2, 4, 8)]
    assert at[0] == pytest.approx(slow.time_s(shard * 16))
    assert at[0] <= at[1] <= at[2]
    floor_s, curve = subgroup_floor("all_gather", shard * 32, GroupPlacement(32, 8, 4), fabric)
    assert curve == slow and floor_s == pytest.approx(slow.time_s(shard * 16))
    assert subgroup_floor("all_gather", shard * 16, GroupPlacement(16, 8, 2), fabric) == (0.0, None)  # its own
    assert subgroup_floor("all_to_all", shard * 32, GroupPlacement(32, 8, 4), fabric) == (0.0, None)
