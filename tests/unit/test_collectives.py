"""Collective cost model: alpha-beta arithmetic per algorithm, fabric tiers from the device specs, placement of
communicators from Megatron's rank order, and pricing from measured curves. Expected values are written out by hand
from the formulas in projection/cost/collectives.py's docstring."""

from __future__ import annotations

import math

import pytest

from projection.calibrate.fit import tier_from_curve
from projection.cost.collectives import (
    CurveSegment,
    Fabric,
    GroupPlacement,
    MeasuredCurve,
    TierParams,
    algorithm_times_s,
    bus_factor,
    collective_time_s,
    group_placement,
    ring_steps,
)
from projection.errors import PlanError
from projection.specs.hardware import ClusterSpec, load_device

GB = 1e9
MIB = 2**20


def switch_fabric(**kw: object) -> Fabric:
    """8 GPUs per node on a switch at 400 GB/s, 2 us per intra step; NICs 50 GB/s per GPU, 10 us per inter step."""
    args: dict[str, object] = dict(gpus_per_node=8, intra=TierParams(2e-6, 400 * GB), inter=TierParams(10e-6, 50 * GB))
    args.update(kw)
    return Fabric(**args)  # type: ignore[arg-type]


def mesh_fabric(**kw: object) -> Fabric:
    return switch_fabric(intra_topology="mesh", intra_links_per_gpu=7, **kw)


def test_bus_factors_follow_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == bus_factor("all_to_all", 8) == 0.875
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == bus_factor("send_recv", 2) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("all_gather", 8) == 7 and ring_steps("send_recv", 2) == 1


def test_ring_on_one_node_is_alpha_beta() -> None:
    group = GroupPlacement(8, 8, 1)
    size = 256 * MIB
    t = collective_time_s("all_reduce", size, group, switch_fabric(), algorithm="ring")
    assert t == pytest.approx(14 * 2e-6 + 1.75 * size / (400 * GB))
    t = collective_time_s("all_gather", size, group, switch_fabric(), algorithm="ring")
    assert t == pytest.approx(7 * 2e-6 + 0.875 * size / (400 * GB))


def test_mesh_gives_a_small_group_only_its_links() -> None:
    size = 64 * MIB
    # 2 ranks on a 7-link mesh share one link (400/7 GB/s); on a switch they get the full 400 GB/s
    two = GroupPlacement(2, 2, 1)
    assert collective_time_s("all_reduce", size, two, mesh_fabric(), "ring") == pytest.approx(
        2 * 2e-6 + 1.0 * size / (400 * GB / 7))
    assert collective_time_s("all_reduce", size, two, switch_fabric(), "ring") == pytest.approx(
        2 * 2e-6 + 1.0 * size / (400 * GB))
    four = GroupPlacement(4, 4, 1)
    assert mesh_fabric().intra_bandwidth(4) == pytest.approx(400 * GB * 3 / 7)
    assert mesh_fabric().intra_bandwidth(8) == pytest.approx(400 * GB)
    assert collective_time_s("send_recv", size, two, mesh_fabric()) == pytest.approx(2e-6 + size / (400 * GB / 7))
    assert collective_time_s("all_gather", size, four, mesh_fabric(), "ring") == pytest.approx(
        3 * 2e-6 + 0.75 * size / (400 * GB * 3 / 7))


def test_multi_node_ring_bottleneck_is_intra_or_the_nodes_nics() -> None:
    size = 1024 * MIB
    # 16 ranks, 8 per node: min(400, 8 x 50) = 400 GB/s; 2 per node on 8 nodes: min(400, 2 x 50) = 100 GB/s
    t = collective_time_s("all_reduce", size, GroupPlacement(16, 8, 2), switch_fabric(), "ring")
    assert t == pytest.approx(30 * 10e-6 + 2 * 15 / 16 * size / (400 * GB))
    t = collective_time_s("all_reduce", size, GroupPlacement(16, 2, 8), switch_fabric(), "ring")
    assert t == pytest.approx(30 * 10e-6 + 2 * 15 / 16 * size / (100 * GB))
    # one rank per node: the ring runs on the NICs alone
    t = collective_time_s("all_gather", size, GroupPlacement(4, 1, 4), switch_fabric(), "ring")
    assert t == pytest.approx(3 * 10e-6 + 0.75 * size / (50 * GB))


def test_oversubscription_slows_fat_tree_and_cross_rail_traffic_only() -> None:
    size = 1024 * MIB
    aligned, crossed = GroupPlacement(4, 1, 4), GroupPlacement(4, 1, 4, rail_aligned=False)
    rail = switch_fabric(oversubscription=2.0)
    fat = switch_fabric(inter_topology="fat_tree", oversubscription=2.0)
    base = collective_time_s("all_gather", size, aligned, switch_fabric(), "ring")
    assert collective_time_s("all_gather", size, aligned, rail, "ring") == pytest.approx(base)
    slow = 3 * 10e-6 + 0.75 * size / (25 * GB)
    assert collective_time_s("all_gather", size, crossed, rail, "ring") == pytest.approx(slow)
    assert collective_time_s("all_gather", size, aligned, fat, "ring") == pytest.approx(slow)


def test_hierarchical_all_reduce() -> None:
    size, r, m = 512 * MIB, 8, 4
    fabric = switch_fabric()
    intra_half = (r - 1) * 2e-6 + (r - 1) / r * size / (400 * GB)
    inter = 2 * (m - 1) * 10e-6 + 2 * (m - 1) / m * (size / r) / (50 * GB)
    t = collective_time_s("all_reduce", size, GroupPlacement(32, 8, 4), fabric, "hierarchical")
    assert t == pytest.approx(2 * intra_half + inter)


def test_only_all_reduce_has_algorithms_besides_the_ring() -> None:
    """NCCL runs all-gather, reduce-scatter, broadcast and reduce as rings (its tree and NVLS-tree are all-reduce
    algorithms, NVIDIA/nccl #1473, #1594): a reduce-scatter over 2 nodes x 2 ranks is the flat ring, bounded by the
    2 NICs a node gives it, (n-1)/n S / (2 x 50 GB/s), not an intra-node phase plus S/2 across the nodes."""
    fabric, size = switch_fabric(), 512 * MIB
    group = GroupPlacement(4, 2, 2)
    for kind in ("all_gather", "reduce_scatter", "broadcast", "reduce"):
        assert set(algorithm_times_s(kind, size, group, fabric)) == {"ring"}
        with pytest.raises(ValueError):
            collective_time_s(kind, size, group, fabric, "hierarchical")
    ring = 3 * 10e-6 + 3 / 4 * size / (2 * 50 * GB)
    assert collective_time_s("reduce_scatter", size, group, fabric) == pytest.approx(ring)


def test_tree_has_log_latency_and_auto_takes_the_fastest() -> None:
    group = GroupPlacement(64, 8, 8)
    fabric = switch_fabric()
    small = algorithm_times_s("all_reduce", 1024, group, fabric)
    assert set(small) == {"ring", "tree", "hierarchical"}
    assert small["tree"] == pytest.approx(2 * 6 * 10e-6 + 2 * 1024 / (400 * GB))
    assert small["tree"] < small["ring"]
    for size in (1024, MIB, 1024 * MIB):
        times = algorithm_times_s("all_reduce", size, group, fabric)
        assert collective_time_s("all_reduce", size, group, fabric) == min(times.values())
    assert set(algorithm_times_s("all_to_all", MIB, group, fabric)) == {"ring"}
    with pytest.raises(ValueError, match="does not apply"):
        collective_time_s("all_to_all", MIB, group, fabric, "tree")


def test_all_to_all_splits_local_and_remote_bytes() -> None:
    size = 256 * MIB
    group = GroupPlacement(16, 8, 2)
    # 7/16 of the bytes over the intra links, 8/16 over the rank's own NIC, concurrently
    expected = 15 * 10e-6 + max(7 / 16 * size / (400 * GB), 8 / 16 * size / (50 * GB))
    assert collective_time_s("all_to_all", size, group, switch_fabric()) == pytest.approx(expected)


def test_trivial_groups_cost_nothing() -> None:
    assert collective_time_s("all_reduce", MIB, GroupPlacement(1, 1, 1), switch_fabric()) == 0.0
    assert collective_time_s("all_reduce", 0, GroupPlacement(8, 8, 1), switch_fabric()) == 0.0
    with pytest.raises(ValueError):
        GroupPlacement(8, 3, 2)


def test_fabric_from_device_and_cluster_specs() -> None:
    mi300x = load_device("mi300x")
    fabric = Fabric.from_specs(mi300x, ClusterSpec(device=mi300x, nodes=4, inter_node_topology="fat_tree",
                                                   oversubscription=2.0))
    assert fabric.intra == TierParams(2e-6, 448e9)  # hardware_specs/mi300x.yaml: 448 GB/s per direction, 2 us
    assert fabric.inter == TierParams(5e-6, 8 * 50e9 / 8)  # 8 NICs x 400 Gb/s per node, 8 GPUs
    assert (fabric.intra_topology, fabric.intra_links_per_gpu) == ("mesh", 7)
    assert fabric.nic_bandwidth(rail_aligned=True) == pytest.approx(25e9)
    h100 = load_device("h100-sxm")
    nv = Fabric.from_specs(h100, ClusterSpec(device=h100, nodes=1), efficiency=0.5)
    # NVLink4's 450 GB/s line rate at the 0.822 ring efficiency NCCL's developers state (370 GB/s), then halved
    assert nv.intra_topology == "switch" and nv.intra.beta_bytes_per_s == pytest.approx(450e9 * 0.822 * 0.5)
    assert nv.intra_line_rate_bytes_per_s == pytest.approx(450e9)
    with pytest.raises(ValueError):
        Fabric.from_specs(h100, ClusterSpec(device=h100, nodes=1), efficiency=0.0)


def test_inter_node_tier_takes_the_nics_measured_bus_bandwidth() -> None:
    # NCCL's developers (NVIDIA/nccl-tests #319): around 48 GB/s of ring bus bandwidth per 400 Gb/s NDR NIC;
    # (NVIDIA/nccl #812): 192 GB/s all-reduce bus bandwidth on a DGX A100's 8 x 200 Gb/s HDR NICs, 24 GB/s per NIC.
    for name, per_nic in (("h100-sxm", 48e9), ("h200", 48e9), ("b200", 48e9), ("a100-80g", 192e9 / 8)):
        device = load_device(name)
        fabric = Fabric.from_specs(device, ClusterSpec(device=device, nodes=2))
        assert fabric.inter.beta_bytes_per_s == pytest.approx(per_nic)  # one NIC per GPU on every one of these
    mi355x = load_device("mi355x")  # no published per-NIC figure: line rate
    assert mi355x.nic.efficiency is None
    assert Fabric.from_specs(mi355x, ClusterSpec(device=mi355x, nodes=2)).inter.beta_bytes_per_s == 50e9


@pytest.fixture
def cluster16() -> ClusterSpec:
    return ClusterSpec(device=load_device("mi300x"), nodes=2)


def test_placement_follows_megatron_rank_order(cluster16: ClusterSpec) -> None:
    def place(axis: str, tp: int = 1, cp: int = 1, ep: int = 1, dp: int = 1, pp: int = 1) -> GroupPlacement:
        return group_placement(cluster16, tp=tp, cp=cp, ep=ep, dp=dp, pp=pp, axis=axis)

    assert place(tp=8, dp=2, axis="tp") == GroupPlacement(8, 8, 1)
    assert place(tp=8, dp=2, axis="dp") == GroupPlacement(2, 1, 2, rail_aligned=True)
    assert place(tp=2, dp=8, axis="dp") == GroupPlacement(8, 4, 2)  # ranks 0, 2, ..., 14
    assert place(tp=8, pp=2, axis="pp") == GroupPlacement(2, 1, 2)
    assert place(tp=16, axis="tp") == GroupPlacement(16, 8, 2)
    assert place(tp=2, cp=2, dp=4, axis="cp") == GroupPlacement(2, 2, 1)  # ranks 0 and 2
    assert place(tp=2, cp=2, dp=4, axis="dp-cp") == GroupPlacement(8, 4, 2)
    assert place(tp=2, cp=2, dp=4, axis="tp-cp") == GroupPlacement(4, 4, 1)
    assert place(tp=1, ep=8, dp=2, axis="ep") == GroupPlacement(8, 8, 1)
    assert place(tp=2, ep=4, dp=2, axis="dp").tier == "inter_node"  # stride 8: ranks 0 and 8
    assert place(tp=2, ep=4, dp=2, axis="ep").tier == "intra_node"


def test_placement_straddling_nodes_is_not_rail_aligned() -> None:
    cluster = ClusterSpec(device=load_device("mi300x"), nodes=3, gpus_per_node=4)
    dp = group_placement(cluster, tp=3, cp=1, ep=1, dp=4, pp=1, axis="dp")  # ranks 0 3 6 9 -> nodes 0 0 1 2
    assert (dp.n_ranks, dp.n_nodes, dp.ranks_per_node, dp.rail_aligned) == (4, 3, 2, False)


def test_placement_errors_name_the_fix(cluster16: ClusterSpec) -> None:
    with pytest.raises(PlanError, match="16 GPUs"):
        group_placement(cluster16, tp=8, cp=1, ep=1, dp=1, pp=1, axis="tp")
    with pytest.raises(PlanError, match="unknown parallel axis 'xx'"):
        group_placement(cluster16, tp=8, cp=1, ep=1, dp=2, pp=1, axis="xx")


def test_measured_curve_prices_its_own_and_other_placements() -> None:
    fabric = mesh_fabric()
    curve = MeasuredCurve("all_reduce", 8, 8, 1, (CurveSegment(0, 20e-6, 100 * GB), CurveSegment(MIB, 60e-6, 300 * GB)))
    fitted = fabric.with_fit(curves=[curve])
    eight = GroupPlacement(8, 8, 1)
    assert collective_time_s("all_reduce", 1024, eight, fitted) == pytest.approx(20e-6 + 1.75 * 1024 / (100 * GB))
    assert collective_time_s("all_reduce", 64 * MIB, eight, fitted) == pytest.approx(60e-6 + 1.75 * 64 * MIB / (300 *
                                                                                                              GB))
    # 4 ranks on the mesh: latency x 6/14 ring steps, bandwidth x (3/7) / (7/7)
    four = GroupPlacement(4, 4, 1)
    expected = 60e-6 * 6 / 14 + 1.5 * 64 * MIB / (300 * GB * 3 / 7)
    assert collective_time_s("all_reduce", 64 * MIB, four, fitted) == pytest.approx(expected)
    # a kind without a curve, or an explicit algorithm, stays analytic
    assert collective_time_s("all_gather", MIB, eight, fitted) == collective_time_s("all_gather", MIB, eight, fabric)
    assert collective_time_s("all_reduce", MIB, eight, fitted, "ring") == collective_time_s("all_reduce", MIB, eight,
                                                                                           fabric, "ring")
    # the inter-node tier has no curve: analytic
    assert fitted.curve_for("all_reduce", GroupPlacement(16, 8, 2)) is None


def test_tier_parameters_recovered_from_a_curve() -> None:
    fabric = mesh_fabric()
    intra = MeasuredCurve("all_reduce", 8, 8, 1, (CurveSegment(0, 14 * 3e-6, 320 * GB),))
    assert tier_from_curve(intra, fabric) == TierParams(pytest.approx(3e-6), pytest.approx(320 * GB))  # type: ignore[arg-type]
    inter = MeasuredCurve("all_reduce", 16, 8, 2, (CurveSegment(0, 30 * 8e-6, 360 * GB),))
    params = tier_from_curve(inter, fabric)
    assert params.alpha_s == pytest.approx(8e-6) and params.beta_bytes_per_s == pytest.approx(45 * GB)
    refit = fabric.with_fit({"intra_node": TierParams(3e-6, 320 * GB)})
    assert refit.intra == TierParams(3e-6, 320 * GB) and refit.inter == fabric.inter
    with pytest.raises(ValueError, match="unknown tiers"):
        fabric.with_fit({"pod": TierParams(1e-6, GB)})
    assert math.isinf(fabric.intra_bandwidth(1))


@pytest.mark.parametrize(("name", "ring"), [("h100-sxm", 370e9), ("h200", 370e9), ("b200", 695e9)])
def test_nvlink_tier_is_the_ring_bus_bandwidth_nccl_reaches(name: str, ring: float) -> None:
    """NCCL's developers: 370 GB/s of ring bus bandwidth on H100's 450 GB/s NVLink4 (NVIDIA/nccl-tests #212, nccl
    #2140 with NVLS off), 695 GB/s on B300's 900 GB/s NVLink5 (nccl #2140): the analytic intra-node tier, within
    0.1 %."""
    device = load_device(name)
    fabric = Fabric.from_specs(device, ClusterSpec(device=device, nodes=1))
    assert fabric.intra.beta_bytes_per_s == pytest.approx(ring, rel=1e-3)


def test_an_nvls_all_reduce_curve_does_not_set_the_ring_tier() -> None:
    """The shipped H100 calibration holds only NVLS all-reduce rows (busbw up to 479 GB/s, above the 450 GB/s line
    rate: an in-network reduction). It prices all-reduce, but the all-gather of an 8-GPU TP group runs on the ring
    tier: 8 x 7/8 x 1 GiB at 370 GB/s."""
    from projection.perf import default_cost_model
    from projection.specs.hardware import ClusterSpec as Cluster
    from projection.specs.model import ModelSpec
    from projection.specs.plan import ParallelPlan
    from projection.specs.scenario import Scenario
    from projection.specs.training import TrainingSpec

    h100 = load_device("h100-sxm")
    sc = Scenario(model=ModelSpec(num_layers=1, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                                  vocab_size=1000),
                  training=TrainingSpec(seq_length=1024), plan=ParallelPlan(tp=8, dp=1),
                  cluster=Cluster(device=h100, nodes=1))
    cm = default_cost_model(sc)
    size = 2**30
    t = cm.collective_seconds("all_gather", size, GroupPlacement(8, 8, 1))
    assert t == pytest.approx(2e-6 * 7 + size * 7 / 8 / 370e9, rel=0.02)
    ar = cm.collective_seconds("all_reduce", size, GroupPlacement(8, 8, 1))
    assert ar < 2 * size * 7 / 8 / 370e9  # the measured NVLS curve, faster than a ring on the same links


def test_mi325x_intra_node_tier_reproduces_the_aac11_ring_rows() -> None:
    """hardware_specs/mi325x.yaml's intra_node.efficiency is the 16 GiB ring all-reduce of one AAC11 node (319.08 GB/s
    busbw over the 448 GB/s line rate); held out, the same sweep's 4 GiB and 8 GiB rows (hisohara/ai-scripts
    training/01_rccl-smoketest/README.md, 316.88 and 318.37 GB/s) are priced within 1 %. The multi-node rows of that
    run (2-8 nodes, 347-351 GB/s, above the one-node figure) are priced at the intra-node ring rate, 9-10 % low
    (hardware_specs/README.md)."""
    device = load_device("mi325x")
    fabric = Fabric.from_specs(device, ClusterSpec(device=device, nodes=1))
    place = GroupPlacement(8, 8, 1)
    for size, measured in ((2**32, 316.88), (2**33, 318.37)):  # held out (the 16 GiB row set the efficiency)
        busbw = bus_factor("all_reduce", 8) * size / collective_time_s("all_reduce", size, place, fabric) / 1e9
        assert busbw == pytest.approx(measured, rel=0.01)
    eight = Fabric.from_specs(device, ClusterSpec(device=device, nodes=8))
    busbw = bus_factor("all_reduce", 64) * 2**34 / collective_time_s("all_reduce", 2**34, GroupPlacement(64, 8, 8),
                                                                    eight) / 1e9
    assert busbw < 350.84  # never faster than the run measured (it is -9.5 %: hardware_specs/README.md)
