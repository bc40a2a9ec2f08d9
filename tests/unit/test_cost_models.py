"""Cost models: roofline arithmetic with efficiency curves, calibrated interpolation (exact at measured points, monotone
between them, roofline outside the measured range and flagged), and the efficiency data in hardware_specs/."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from projection.calibrate.calibration import AttentionRow, Calibration, GemmRow, MemoryBoundRow
from projection.cost.calibrated import CLAMPED, OUT_OF_RANGE, CalibratedCostModel
from projection.cost.collectives import Fabric, GroupPlacement, collective_time_s
from projection.cost.model import CostModel, group_placements
from projection.cost.roofline import RooflineCostModel, interpolate_log
from projection.errors import ConfigError
from projection.specs.hardware import (
    BytesEfficiencyPoint,
    ClusterSpec,
    EfficiencySpec,
    FlopEfficiencyPoint,
    list_devices,
    load_device,
)
from projection.specs.plan import ParallelPlan
from projection.workload.ops import Op

REPO = Path(__file__).resolve().parents[2]

MI300X = load_device("mi300x")
CURVES = EfficiencySpec(
    gemm={"bf16": (FlopEfficiencyPoint(flop=1e9, efficiency=0.1, source="A: test"),
                   FlopEfficiencyPoint(flop=1e12, efficiency=0.7, source="A: test"))},
    attention={"bf16": (FlopEfficiencyPoint(flop=1e10, efficiency=0.2, source="A: test"),)},
    memory=(BytesEfficiencyPoint(bytes=1e6, efficiency=0.2, source="A: test"),
            BytesEfficiencyPoint(bytes=1e9, efficiency=0.8, source="A: test")))
DEVICE = MI300X.model_copy(update={"efficiency": CURVES})
PEAK, HBM = 1307.4e12, 5.3e12


def gemm(m: int, n: int, k: int, dtype: str = "bf16", layout: str = "TN", phase: str = "F") -> Op:
    b = 1 if dtype == "fp8" else 2
    return Op("g", "gemm", phase, dtype=dtype, m=m, n=n, k=k, layout=layout, flop=2.0 * m * n * k,  # type: ignore[arg-type]
              bytes_read=(m * k + k * n) * b, bytes_written=m * n * 2)


# ------------------------------------------------------------------------------------------------ roofline


def test_interpolation_is_log_linear_and_flat_outside() -> None:
    pts = [(1e3, 0.1), (1e5, 0.5)]
    assert interpolate_log(pts, 1.0) == 0.1 and interpolate_log(pts, 1e9) == 0.5
    assert interpolate_log(pts, 1e4) == pytest.approx(0.3)
    assert interpolate_log([], 5.0) == 1.0


def test_roofline_gemm_uses_peak_times_size_dependent_efficiency() -> None:
    rf = RooflineCostModel(DEVICE)
    big = gemm(8192, 8192, 8192)  # 1.1e12 FLOP: beyond the last point -> 0.7
    assert rf.op_seconds(big) == pytest.approx(big.flop / (PEAK * 0.7))
    mid = gemm(1000, 1000, 15811)  # ~3.16e10 FLOP, halfway (in log) between 1e9 and 1e12
    eff = 0.1 + 0.6 * math.log(mid.flop / 1e9) / math.log(1e3)
    assert rf.op_seconds(mid) == pytest.approx(mid.flop / (PEAK * eff))
    assert rf.provenance(big) == "roofline"


def test_roofline_skinny_gemm_is_memory_bound() -> None:
    rf = RooflineCostModel(DEVICE)
    skinny = gemm(16384, 16384, 1)  # 5.4e8 FLOP, 537 MB of output
    moved = skinny.bytes_read + skinny.bytes_written
    mem_eff = 0.2 + 0.6 * math.log(moved / 1e6) / math.log(1e3)
    assert rf.op_seconds(skinny) == pytest.approx(moved / (HBM * mem_eff))
    assert rf.op_seconds(skinny) > skinny.flop / (PEAK * 0.1)


def test_roofline_attention_backward_counts_the_recomputed_scores() -> None:
    rf = RooflineCostModel(DEVICE)
    fwd = Op("a", "attention", "F", dtype="bf16", flop=1e12, m=8192, n=8192, k=128, batch=1, heads=32, causal=True)
    bwd = Op("a", "attention", "I", dtype="bf16", flop=2e12, m=8192, n=8192, k=128, batch=1, heads=32, causal=True)
    assert rf.op_seconds(fwd) == pytest.approx(1e12 / (PEAK * 0.2))
    assert rf.op_seconds(bwd) == pytest.approx(2.5 * rf.op_seconds(fwd))  # FlashAttention-2: 2.5x the forward


def test_roofline_memory_bound_and_missing_peaks() -> None:
    rf = RooflineCostModel(DEVICE)
    op = Op("n", "memory_bound", "F", bytes_read=5e8, bytes_written=5e8, count=3)
    assert rf.op_seconds(op) == pytest.approx(3 * 1e9 / (HBM * 0.8))
    bare = RooflineCostModel(MI300X.model_copy(update={"efficiency": None}))
    assert bare.op_seconds(gemm(4096, 4096, 4096)) == pytest.approx(2 * 4096**3 / PEAK)
    a100 = RooflineCostModel(load_device("a100-80g"))  # no fp8 tensor cores: the nearest 16-bit peak, said so
    assert "bf16 peak" in a100.provenance(gemm(4096, 4096, 4096, "fp8"))


def test_fp32_matrix_math_is_priced_at_the_fp32_peak_never_a_16_bit_one() -> None:
    """MI300X (no TF32): an fp32 GEMM at max(FLOP / FP32 peak 163.4 TFLOP/s, the bf16 GEMM's time); H100: on the
    TF32 tensor cores (494.7) with the bf16 curve's efficiency; a device with neither peak is refused."""
    rf = RooflineCostModel(DEVICE)
    flop = 2 * 4096**3
    big, small = gemm(4096, 4096, 4096, "fp32"), gemm(64, 64, 64, "fp32")
    assert rf.op_seconds(big) == pytest.approx(flop / 163.4e12)  # the FP32 peak binds at this size
    assert rf.op_seconds(small) == pytest.approx(rf.op_seconds(gemm(64, 64, 64)))  # the bf16 time binds
    assert rf.op_seconds(big) >= rf.op_seconds(gemm(4096, 4096, 4096)) * (1 - 1e-12)
    assert rf.provenance(big) == "roofline (fp32 at the FP32 peak, at least its bf16 time)"
    h100 = RooflineCostModel(load_device("h100-sxm"))
    assert h100.peak_dtype("fp32") == "tf32"
    assert h100.op_seconds(big) == pytest.approx(flop / (494.7e12 * h100.gemm_efficiency("bf16", flop)))
    assert h100.provenance(big) == "roofline (tf32 peak for fp32; bf16 efficiency curve for fp32)"
    peaks = {k: v for k, v in MI300X.peak_flop_per_s.items() if k != "fp32"}
    no_fp32 = RooflineCostModel(MI300X.model_copy(update={"peak_flop_per_s": peaks}))
    with pytest.raises(ConfigError) as err:
        no_fp32.op_seconds(big)
    assert err.value.problems[0].key == "peak_flop_per_s.fp32"


def test_roofline_prices_collectives_on_the_cluster_placement() -> None:
    cluster = ClusterSpec(device=DEVICE, nodes=2)
    plan = ParallelPlan(tp=8, dp=2)
    rf = RooflineCostModel(DEVICE, cluster, plan)
    op = Op("ar", "collective", "F", coll="all_reduce", coll_bytes=2**28, group="dp", count=2)
    groups = group_placements(cluster, plan)
    assert groups["tp"] == GroupPlacement(8, 8, 1) and groups["dp"].n_nodes == 2
    expected = 2 * collective_time_s("all_reduce", 2**28, groups["dp"], Fabric.from_specs(DEVICE, cluster))
    assert rf.op_seconds(op) == pytest.approx(expected)
    model: CostModel = rf  # satisfies the protocol
    assert model.collective_seconds("all_reduce", 2**28, groups["dp"]) == pytest.approx(expected / 2)


# ------------------------------------------------------------------------------------------------ calibrated

CUBES = {512: 40e12, 1024: 200e12, 2048: 500e12, 4096: 700e12}  # FLOP/s at n^3, TN bf16


def table() -> Calibration:
    rows = [GemmRow(m=n, n=n, k=n, dtype="bf16", layout="TN", time_s=2.0 * n**3 / r, flop_per_s=r, source=f"t{n}")
            for n, r in CUBES.items()]
    rows.append(GemmRow(m=1024, n=4096, k=2048, dtype="bf16", layout="TN", time_s=2.0 * 1024 * 4096 * 2048 / 6e14,
                        flop_per_s=6e14, source="odd"))
    mem = [MemoryBoundRow(op="copy", size_bytes=s, time_s=t) for s, t in ((1e6, 5e-6), (1e8, 5e-5), (1e9, 3e-4))]
    att = [AttentionRow(direction=d, batch=2, heads=16, kv_heads=16, head_dim=128, seq_q=s, seq_kv=s, causal=True,
                        dtype="bf16", time_s=t) for d, s, t in (("fwd", 4096, 2e-4), ("fwd", 8192, 7e-4),
                                                                 ("bwd", 4096, 5e-4))]
    return Calibration(gemm=tuple(rows), memory_bound=tuple(mem), attention=tuple(att))


def test_calibrated_is_exact_at_measured_points() -> None:
    cm = CalibratedCostModel(table(), RooflineCostModel(DEVICE), name="t")
    for row in table().gemm:
        op = gemm(row.m, row.n, row.k)
        assert cm.op_seconds(op) == pytest.approx(row.time_s, rel=1e-12)
        assert cm.provenance(op) == "calibrated: t gemm bf16 TN"
    for row in table().memory_bound:
        op = Op("m", "memory_bound", "F", bytes_read=row.size_bytes, bytes_written=0)
        assert cm.op_seconds(op) == pytest.approx(row.time_s, rel=1e-12)
    for row in table().attention:
        flop = 4.0 * 2 * 16 * row.seq_q**2 * 128 * 0.5 * (2 if row.direction == "bwd" else 1)
        op = Op("a", "attention", "I" if row.direction == "bwd" else "F", dtype="bf16", flop=flop, m=row.seq_q,
                n=row.seq_kv, k=128, batch=2, heads=16, kv_heads=16, head_dim_v=128, causal=True)
        assert cm.op_seconds(op) == pytest.approx(row.time_s, rel=1e-12)
    swapped = gemm(4096, 1024, 2048)  # the transposed view of the measured 1024x4096x2048
    assert cm.op_seconds(swapped) == pytest.approx(2.0 * 1024 * 4096 * 2048 / 6e14, rel=1e-12)


def test_a_row_faster_than_the_datasheet_peak_is_capped_at_it() -> None:
    """A GEMM measured above the device's peak (another part's table, or a bad row) cannot be this device's: the op
    takes its FLOPs at the peak, said in the provenance, so MFU cannot pass 100 %."""
    peak = MI300X.peak_flop_per_s["bf16"]
    n = 4096
    fast = Calibration(gemm=(GemmRow(m=n, n=n, k=n, dtype="bf16", layout="TN", time_s=2.0 * n**3 / (3 * peak),
                                     flop_per_s=3 * peak, source="too fast"),))
    cm = CalibratedCostModel(fast, RooflineCostModel(DEVICE), name="t")
    op = gemm(n, n, n)
    assert cm.op_seconds(op) == pytest.approx(op.flop / peak, rel=1e-12)
    assert cm.provenance(op) == "calibrated: t gemm bf16 TN (above the datasheet peak: capped at it)"
    ok = CalibratedCostModel(table(), RooflineCostModel(DEVICE), name="t")  # below the peak: untouched
    assert "capped" not in ok.provenance(gemm(1024, 1024, 1024))


def test_calibrated_is_monotone_between_measured_points() -> None:
    cm = CalibratedCostModel(table(), RooflineCostModel(DEVICE))
    sizes = [round(512 * 2 ** (i / 16)) for i in range(49)]  # 512 .. 4096
    times = [cm.op_seconds(gemm(n, n, n)) for n in sizes]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    rates = [2.0 * n**3 / t for n, t in zip(sizes, times, strict=True)]
    assert min(rates) >= min(CUBES.values()) * (1 - 1e-9) and max(rates) <= 7e14 * (1 + 1e-9)
    mem = [cm.op_seconds(Op("m", "memory_bound", "F", bytes_read=s)) for s in (1e6, 3e6, 1e7, 3e7, 1e8, 5e8, 1e9)]
    assert all(b > a for a, b in zip(mem, mem[1:], strict=False))


def test_calibrated_falls_back_to_roofline_outside_and_flags_it() -> None:
    rf = RooflineCostModel(DEVICE)
    cm = CalibratedCostModel(table(), rf)
    for op, label in ((gemm(16384, 16384, 16384), "gemm bf16 TN"), (gemm(256, 256, 256), "gemm bf16 TN"),
                      (gemm(1024, 1024, 8192), "gemm bf16 TN"), (Op("m", "memory_bound", "F", bytes_read=1e11),
                                                                  "memory_bound")):
        assert cm.op_seconds(op) == pytest.approx(rf.op_seconds(op))
        assert cm.provenance(op) == f"{OUT_OF_RANGE}: calibration {label}"  # the table it fell out of, named
    fp8 = gemm(1024, 1024, 1024, "fp8")  # no fp8 rows at all: plain roofline
    assert cm.provenance(fp8) == "roofline" and cm.op_seconds(fp8) == pytest.approx(rf.op_seconds(fp8))
    nn = gemm(2048, 2048, 2048, layout="NN")  # another layout: the pooled table of the dtype
    assert cm.provenance(nn) == "calibrated: calibration gemm bf16 pooled layouts"
    assert cm.op_seconds(nn) == pytest.approx(2.0 * 2048**3 / 5e14, rel=1e-12)


def test_calibrated_without_fallback_clamps_to_the_nearest_measured_rate() -> None:
    cm = CalibratedCostModel(table())
    op = gemm(16384, 16384, 16384)
    assert cm.provenance(op) == f"{CLAMPED}: calibration gemm bf16 TN"
    assert cm.op_seconds(op) == pytest.approx(op.flop / 700e12, rel=1e-12)


def test_grouped_gemm_without_grouped_rows_uses_the_stacked_gemm() -> None:
    cm = CalibratedCostModel(table(), RooflineCostModel(DEVICE), name="t")
    grouped = Op("e", "grouped_gemm", "F", dtype="bf16", m=2048, n=256, k=2048, batch=8, layout="TN",
                 flop=2.0 * 2048 * 2048 * 2048)
    assert cm.op_seconds(grouped) == pytest.approx(2.0 * 2048**3 / 5e14, rel=1e-12)
    assert "groups stacked" in cm.provenance(grouped)


# ------------------------------------------------------------------------------------------------ bundled data


@pytest.mark.parametrize("name", list_devices())
def test_efficiency_points_are_sourced_and_consistent(name: str) -> None:
    """Every point cites a tagged source; a point derived as 'X TFLOP/s / peak' reproduces that ratio."""
    dev = load_device(name)
    if dev.efficiency is None:
        return
    points = [(p.efficiency, p.source) for curve in (*dev.efficiency.gemm.values(), *dev.efficiency.attention.values())
              for p in curve] + [(p.efficiency, p.source) for p in dev.efficiency.memory]
    for eff, source in points:
        assert re.match(r"(R|R2|D|A): \S", source), source
        assert 0 < eff <= 1
        ratio = re.search(r"\b([\d.]+) TFLOP/s / ([\d.]+)(?: peak)?\b", source)
        if source.startswith("D:") and ratio and not re.search(r"mean of|median|ratio", source):
            assert eff == pytest.approx(float(ratio[1]) / float(ratio[2]), rel=2e-3), source


def test_roofline_says_when_it_runs_at_the_datasheet_peak(tmp_path: Path) -> None:
    """A device YAML without efficiency curves prices at 100 % of the datasheet, and the provenance says so; one with
    curves does not carry the note."""
    text = (REPO / "hardware_specs" / "b200.yaml").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("efficiency:"))
    end = next(i for i, line in enumerate(lines) if line.startswith("sources:"))
    (tmp_path / "bare.yaml").write_text("\n".join(lines[:start] + lines[end:]) + "\n")
    device = load_device(str(tmp_path / "bare.yaml"))
    bare = RooflineCostModel(device)
    op = gemm(4096, 4096, 4096)
    assert "no efficiency curve" in bare.provenance(op) and not bare.has_curve(op)
    assert bare.op_seconds(op) == pytest.approx(op.flop / device.peak_flop_per_s["bf16"])
    assert RooflineCostModel(MI300X).provenance(op) == "roofline" and RooflineCostModel(MI300X).has_curve(op)
    mem = Op("m", "memory_bound", "F", bytes_read=1e9)
    assert "no efficiency curve" in bare.provenance(mem)



def _calibrated(device: str, topology: str, oversubscription: float) -> CostModel:
    from projection import api
    from projection.perf import default_cost_model

    example = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"
    return default_cost_model(api.load(example, hardware=device, nodes=8, overrides={
        "cluster.inter_node_topology": topology, "cluster.oversubscription": oversubscription}))


@pytest.mark.parametrize("device", ["mi300x", "h100-sxm"])
def test_oversubscription_divides_measured_and_analytic_inter_node_bandwidth(device: str) -> None:
    """A measured inter-node sweep (mi300x) is taken under one leaf: a 4:1 upper tier slows whatever crosses it,
    as it does on the analytic tiers (h100-sxm). Large messages are bandwidth-bound, so the time goes up ~4x."""
    ring = GroupPlacement(8, 1, 8)  # one GPU per node: the ring's inter-node hops carry all of it
    cross = GroupPlacement(16, 2, 8, rail_aligned=False)
    free, fat, rail = (_calibrated(device, topo, ov) for topo, ov in
                       (("fat_tree", 1.0), ("fat_tree", 4.0), ("rail_optimized", 4.0)))
    size = 8 * 2**30
    t0 = free.collective_seconds("all_reduce", size, ring)
    assert fat.collective_seconds("all_reduce", size, ring) == pytest.approx(4 * t0, rel=0.05)
    assert rail.collective_seconds("all_reduce", size, ring) == pytest.approx(t0, rel=1e-9)  # rail-aligned: leaf
    a2a = [m.collective_seconds("all_to_all", size, cross) for m in (free, fat, rail)]
    assert a2a[1] == pytest.approx(a2a[2], rel=1e-9) and a2a[1] > 3 * a2a[0]
