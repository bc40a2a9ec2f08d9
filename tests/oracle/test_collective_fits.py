"""Collective fits: known alpha / beta recovered from synthetic curves within 2 %; on the A100 nccl-tests sweeps of
shared/fixtures/collectives and on the published busbw tables of shared/reference/hardware.md §2 (typed in below
with their sources: they are the oracle) the fitted model reproduces busbw within 10 % from 1 MiB to 8 GiB.
Run with -s to see the tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from projection.calibrate.calibration import Calibration, CollectiveRow
from projection.calibrate.errors import CalibrationError
from projection.calibrate.fit import FLAT_BUSBW, fit_calibration, fit_curve
from projection.calibrate.importers import import_files
from projection.cost.collectives import CollectiveKind, Fabric, GroupPlacement, bus_factor, collective_time_s
from projection.specs.hardware import ClusterSpec, load_device

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
MIB, GIB = 2**20, 2**30
SWEEP = [2**p for p in range(10, 35)]  # 1 KiB .. 16 GiB, doubling as nccl-tests -f 2


def rows_from(kind: CollectiveKind, n_ranks: int, n_nodes: int, sizes: list[int], times: list[float],
              source: str) -> tuple[CollectiveRow, ...]:
    return tuple(CollectiveRow(kind=kind, n_ranks=n_ranks, n_nodes=n_nodes, size_bytes=s, time_s=t, source=source)
                 for s, t in zip(sizes, times, strict=True))


SYNTHETIC = [  # kind, ranks, nodes, alpha (s), busbw (bytes/s)
    ("all_reduce", 8, 1, 25e-6, 300e9), ("all_gather", 16, 2, 40e-6, 90e9), ("reduce_scatter", 8, 1, 12e-6, 250e9),
    ("all_to_all", 64, 8, 120e-6, 40e9), ("broadcast", 8, 1, 10e-6, 200e9), ("send_recv", 2, 2, 8e-6, 45e9)]


@pytest.mark.parametrize(("kind", "n", "nodes", "alpha", "busbw"), SYNTHETIC)
def test_fit_recovers_alpha_beta_of_a_synthetic_curve(kind: CollectiveKind, n: int, nodes: int, alpha: float,
                                                      busbw: float) -> None:
    rng = np.random.default_rng(seed=5)  # +-0.5 % measurement noise, explicit seed
    times = [(alpha + bus_factor(kind, n) * s / busbw) * (1 + rng.uniform(-0.005, 0.005)) for s in SWEEP]
    fit = fit_calibration(Calibration(collective=rows_from(kind, n, nodes, SWEEP, times, "synthetic")))
    (curve,) = fit.curves
    (seg,) = curve.segments
    print(f"\n{kind} n={n}: alpha {seg.alpha_s * 1e6:.3f} us (true {alpha * 1e6:.3f}), busbw "
          f"{seg.busbw_bytes_per_s / 1e9:.2f} GB/s (true {busbw / 1e9:.2f}), max error {curve.max_abs_rel_error:.2%}")
    assert seg.alpha_s == pytest.approx(alpha, rel=0.02)
    assert seg.busbw_bytes_per_s == pytest.approx(busbw, rel=0.02)
    assert curve.tier == ("intra_node" if nodes == 1 else "inter_node")


def test_fit_recovers_two_protocol_regimes() -> None:
    # LL-like regime below 1 MiB (5 us, 30 GB/s), Simple-like above (40 us, 300 GB/s), noise-free
    kind, n = "all_reduce", 8

    def truth(s: int) -> float:
        return (5e-6 + 1.75 * s / 30e9) if s < MIB else (40e-6 + 1.75 * s / 300e9)

    segs = fit_curve(np.array(SWEEP, float), np.array([truth(s) for s in SWEEP]), bus_factor(kind, n))
    assert len(segs) == 2 and 512 * 1024 < segs[1].min_bytes <= MIB
    assert (segs[0].alpha_s, segs[0].busbw_bytes_per_s) == (pytest.approx(5e-6, rel=0.02),
                                                            pytest.approx(30e9, rel=0.02))
    assert (segs[1].alpha_s, segs[1].busbw_bytes_per_s) == (pytest.approx(40e-6, rel=0.02),
                                                            pytest.approx(300e9, rel=0.02))
    flat = fit_curve(np.array([8.0, 16.0, 32.0]), np.array([3e-5, 3e-5, 3e-5]), 1.75)
    assert flat[0].busbw_bytes_per_s == FLAT_BUSBW and flat[0].alpha_s == pytest.approx(3e-5)
    with pytest.raises(ValueError):
        fit_curve(np.array([8.0]), np.array([1e-5]), 1.0)


def print_table(title: str, points: list[tuple[int, float, float]]) -> None:
    print(f"\n{title}\n  {'size':>10} {'measured':>9} {'fitted':>9} {'error':>7}  (busbw GB/s)")
    for size, measured, fitted in points:
        print(f"  {size:>10} {measured:9.2f} {fitted:9.2f} {fitted / measured - 1:7.1%}")


def test_fit_reproduces_the_a100_nccl_tests_sweeps() -> None:
    logs = sorted((FIXTURES / "collectives").glob("nccl_*.log")) if FIXTURES.is_dir() else []
    if not logs:
        pytest.skip("shared fixtures absent (user clone)")
    cal = import_files(logs)
    fit = fit_calibration(cal)
    print("\n" + fit.to_table())
    assert {c.kind for c in fit.curves} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                            "reduce"}
    for curve in fit.curves:
        rows = [r for r in cal.collective if r.kind == curve.kind and MIB <= r.size_bytes <= 8 * GIB]
        points = [(r.size_bytes, r.busbw_bytes_per_s / 1e9, curve.busbw_bytes_per_s(r.size_bytes) / 1e9)
                  for r in rows]
        print_table(f"8x A100-SXM4-40GB {curve.kind} (out-of-place and in-place "
                    "rows, superbenchmark tests/data)", points)
        worst = max(abs(f / m - 1) for _, m, f in points)
        print(f"{curve.kind}: worst |fit / measured - 1| {worst:.2%}")
        assert worst <= 0.08, (curve.kind, worst)  # raw in-place and out-of-place rows: up to 6.4 % apart
        assert len(rows) == 28
    assert {q.name for q in fit.quality()} >= {"intra_node", "all_reduce"}


# Published all_reduce busbw (GB/s) of hardware.md §2; sizes are the nccl-tests doubling steps the tables print as
# 1M, 16M, 134M/128M, 1G, 8G, 16G (2^20, 2^24, 2^27, 2^30, 2^33, 2^34 bytes).
PUBLISHED = {
    "8x H100 SXM NVLS (Azure ND H100 v5, in-place; Azure/AI-benchmarking-guide Azure_Results/ND_H100_v5_results.md)":
        (8, 1, {2**20: 43.70, 2**24: 234.45, 2**27: 400.61, 2**30: 466.35, 2**33: 478.87}),
    "8x H200 NVLS (Azure ND H200 v5; Azure/AI-benchmarking-guide Azure_Results/ND_H200_v5_results.md)":
        (8, 1, {2**20: 52.96, 2**24: 240.41, 2**27: 412.45, 2**30: 467.58, 2**33: 479.98}),
    "8x MI300X xGMI, RCCL 2.22.3 (samuel-bohman/AI-benchmarking-guide Azure_Results/ND_MI300X_v5_results.md)":
        (8, 1, {2**20: 22.41, 2**24: 171.46, 2**27: 290.81, 2**30: 313.92, 2**33: 316.82}),
    "8x MI300X xGMI, AAC8 (hisohara/ai-scripts training/01_rccl-smoketest/README.md)":
        (8, 1, {2**20: 64.64, 2**24: 195.85, 2**27: 293.50, 2**30: 313.66, 2**33: 315.69}),
    "2 nodes x 8 MI300X, 8x RoCE, AAC10 (hisohara/ai-scripts training/01_rccl-smoketest/README.md)":
        (16, 2, {2**24: 63.26, 2**27: 173.70, 2**30: 340.75, 2**33: 356.14, 2**34: 357.46}),
    "8x MI325X xGMI, NCCL_ALGO=Ring, AAC11 (hisohara/ai-scripts training/01_rccl-smoketest/README.md)":
        (8, 1, {2**32: 316.88, 2**33: 318.37, 2**34: 319.08}),
    "8 nodes x 8 MI325X, 8x bnxt_re RoCE, AAC11 (hisohara/ai-scripts training/01_rccl-smoketest/README.md)":
        (64, 8, {2**32: 344.13, 2**33: 349.98, 2**34: 350.84}),
    "2 nodes x 8 MI355X, Pollara 400, AAC14 (hisohara/ai-scripts training/01_rccl-smoketest/README.md)":
        (16, 2, {2**24: 120.23, 2**27: 241.57, 2**30: 364.39, 2**33: 369.04}),
    "2 nodes x 8 H100, GCP A3 Mega (lessizzmore/create-a3mega-ztan-fork ztan-NCCL-test-result)":
        (16, 2, {2**24: 32.18, 2**27: 152.32, 2**30: 297.86, 2**33: 338.82}),
}


@pytest.mark.parametrize("title", sorted(PUBLISHED))
def test_fit_reproduces_published_busbw(title: str) -> None:
    n, nodes, table = PUBLISHED[title]
    sizes = sorted(table)
    times = [bus_factor("all_reduce", n) * s / (table[s] * 1e9) for s in sizes]
    fit = fit_calibration(Calibration(collective=rows_from("all_reduce", n, nodes, sizes, times, title)))
    (curve,) = fit.curves
    points = [(s, table[s], curve.busbw_bytes_per_s(s) / 1e9) for s in sizes]
    print_table(f"{title}: {len(curve.segments)} segment(s) " + ", ".join(
        f"[{s.min_bytes} B: {s.alpha_s * 1e6:.1f} us, {s.busbw_bytes_per_s / 1e9:.1f} GB/s]" for s in curve.segments),
        points)
    print(f"worst |fit / published - 1| {max(abs(f / m - 1) for _, m, f in points):.2%}")
    # a fit of 4-5 points with up to two segments nearly interpolates them (docs/calibration.md: within 1.6 %); what it
    # predicts is checked by the held-out test below
    assert all(abs(f / m - 1) <= 0.02 for _, m, f in points)
    # the fitted fabric prices the measured placement exactly as the curve does
    device = load_device("mi300x")
    fabric = fit.apply(Fabric.from_specs(device, ClusterSpec(device=device, nodes=nodes)))
    group = GroupPlacement(n, n // nodes, nodes)
    for s in sizes:
        assert collective_time_s("all_reduce", s, group, fabric) == pytest.approx(curve.time_s(s), rel=1e-12)


@pytest.mark.parametrize("title", sorted(PUBLISHED))
def test_fit_without_the_largest_size_predicts_it(title: str) -> None:
    """Held out: fitted on every published size but the largest, the curve predicts the largest size's busbw (the
    bandwidth regime the data-parallel collectives of a large job run in) within 10 % (measured 2026-11-30: 0.0-1.3 %
    on six tables, 6.0 % on 2x8 MI355X). Small sizes are not predicted this way: the 1 MiB / 16 MiB point left out
    is missed by 3-55 % (docs/calibration.md), which is why a calibration should cover the sizes a job uses."""
    n, nodes, table = PUBLISHED[title]
    sizes = sorted(table)
    held, fitted = sizes[-1], sizes[:-1]
    times = [bus_factor("all_reduce", n) * s / (table[s] * 1e9) for s in fitted]
    (curve,) = fit_calibration(Calibration(collective=rows_from("all_reduce", n, nodes, fitted, times, title))).curves
    predicted = curve.busbw_bytes_per_s(held) / 1e9
    print(f"\n{title}: {held} B held out, published {table[held]:.1f} GB/s, predicted {predicted:.1f} "
          f"({predicted / table[held] - 1:+.1%})")
    assert predicted == pytest.approx(table[held], rel=0.10)


def test_single_alpha_beta_is_not_enough_for_nvls() -> None:
    """Why the fit is piecewise: one alpha-beta pair misses the H100 table by far more than 10 %."""
    n, _, table = next(v for k, v in PUBLISHED.items() if k.startswith("8x H100"))
    sizes = sorted(table)
    times = np.array([1.75 * s / (table[s] * 1e9) for s in sizes])
    (seg,) = fit_curve(np.array(sizes, float), times, 1.75, max_segments=1)
    worst = max(abs((seg.alpha_s + 1.75 * s / seg.busbw_bytes_per_s) / t - 1) for s, t in zip(sizes, times,
                                                                                             strict=True))
    print(f"\none alpha-beta pair on 8x H100 NVLS: largest time error {worst:.1%}")
    assert worst > 0.15


def test_inter_node_tier_from_the_two_node_mi300x_sweep() -> None:
    n, nodes, table = next(v for k, v in PUBLISHED.items() if k.startswith("2 nodes x 8 MI300X"))
    sizes = sorted(table)
    rows = rows_from("all_reduce", n, nodes, sizes, [1.875 * s / (table[s] * 1e9) for s in sizes], "AAC10")
    device = load_device("mi300x")
    fabric = Fabric.from_specs(device, ClusterSpec(device=device, nodes=2))
    fit = fit_calibration(Calibration(collective=rows), fabric)
    (tier,) = fit.tiers
    print(f"\ninter-node tier from 2x8 MI300X all_reduce: alpha {tier.alpha_s * 1e6:.1f} us per step, beta "
          f"{tier.beta_bytes_per_s / 1e9:.1f} GB/s per GPU (NIC spec {fabric.inter.beta_bytes_per_s / 1e9:.0f})")
    assert tier.tier == "inter_node"
    assert 0.5 * fabric.inter.beta_bytes_per_s < tier.beta_bytes_per_s <= fabric.inter.beta_bytes_per_s
    priced = fit.apply(fabric)
    # a 4-node group of the same tier is priced from the curve, scaled: slower in latency, same bus bandwidth
    four = GroupPlacement(32, 8, 4)
    big = 8 * GIB
    t4, t2 = collective_time_s("all_reduce", big, four, priced), collective_time_s("all_reduce", big,
                                                                                   GroupPlacement(16, 8, 2), priced)
    assert bus_factor("all_reduce", 32) * big / t4 == pytest.approx(bus_factor("all_reduce", 16) * big / t2, rel=0.05)


def test_a_sweep_that_ends_flat_gives_no_tier_bandwidth_and_prices_nothing_at_latency_only() -> None:
    """Two sizes whose larger one ran (by noise) a little faster fit one flat, latency-only segment. That segment
    carries no bandwidth: no tier gets 1e18 B/s, and the curve is not installed, so a 1 GiB all-reduce is not priced
    at the small messages' latency."""
    rows = rows_from("all_reduce", 2, 1, [4096, 65536], [5.12e-4, 4.68e-4], "noisy")
    fitted = fit_calibration(Calibration(collective=rows))
    (curve,) = fitted.curves
    assert curve.segments[-1].busbw_bytes_per_s >= FLAT_BUSBW
    assert fitted.tiers == () and any("flat" in s for s in fitted.skipped)
    base = Fabric.from_specs(load_device("h100-sxm"), ClusterSpec(device=load_device("h100-sxm"), nodes=1))
    place = GroupPlacement(2, 2, 1)
    assert fitted.apply(base).curves == ()
    assert collective_time_s("all_reduce", GIB, place, fitted.apply(base)) == collective_time_s("all_reduce", GIB,
                                                                                                place, base)


def test_one_bandwidth_bound_size_gives_the_sweeps_bandwidth() -> None:
    """A calibration with a single message size (rccl-tests smoke runs at 16 GiB, calibrations/mi325x.json) used to
    be dropped whole. Its bandwidth is taken with the device's latency: from the 2 x 8 MI300X sweep's largest row
    alone, the inter-node tier's bandwidth is the one the whole sweep's fit gives; a single latency-bound size (8
    KiB) is still skipped, saying why."""
    n, nodes, table = next(v for k, v in PUBLISHED.items() if k.startswith("2 nodes x 8 MI300X"))
    sizes = sorted(table)
    rows = rows_from("all_reduce", n, nodes, sizes, [1.875 * s / (table[s] * 1e9) for s in sizes], "AAC10")
    device = load_device("mi300x")
    fabric = Fabric.from_specs(device, ClusterSpec(device=device, nodes=2))
    (whole,) = fit_calibration(Calibration(collective=rows), fabric).tiers
    one = fit_calibration(Calibration(collective=rows[-1:]), fabric)
    (tier,) = one.tiers
    (curve,) = one.curves
    print(f"\ninter-node beta from {sizes[-1] / GIB:g} GiB alone {tier.beta_bytes_per_s / 1e9:.2f} GB/s, from the "
          f"sweep {whole.beta_bytes_per_s / 1e9:.2f} GB/s; skipped: {one.skipped}")
    assert tier.beta_bytes_per_s == pytest.approx(whole.beta_bytes_per_s, rel=0.05)
    assert tier.alpha_s == pytest.approx(fabric.inter.alpha_s)  # the device's latency, not a fitted one
    assert curve.residuals[0].rel_error == pytest.approx(0.0, abs=1e-9)
    assert any("1 message size" in s and "latency" in s for s in one.skipped)
    with pytest.raises(CalibrationError, match="1 message size, at which the device's latency is not negligible"):
        fit_calibration(Calibration(collective=rows[:1]), fabric)  # the sweep's smallest size
