"""Which rows price which device, and collectives above the measured sizes (an audit of the calibrated model):

* a calibration of several devices (--allow-mixed-devices) priced the projected device with another device's rows:
  H100 all_reduce rows priced an MI300X's tensor parallelism, two devices' host rows were averaged, and MI300X GEMM
  rows priced an H100 (projection/cost/device_rows.py);
* `NVIDIA A100-PG509-200` (a 40 GB A100 board) counted as a100-80g (projection/specs/device_names.py);
* a collective above the largest measured size was priced from the last fitted segment, a small-message bandwidth
  when the sweep stopped early (projection/cost/above_range.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from projection.calibrate.calibration import (
    Calibration,
    CollectiveRow,
    GemmRow,
    HostRow,
    Provenance,
    merge_calibrations,
)
from projection.calibrate.errors import CalibrationError
from projection.cost.calibrated import CalibratedCostModel
from projection.cost.collectives import Fabric, GroupPlacement
from projection.cost.roofline import RooflineCostModel
from projection.specs.device_names import device_match
from projection.specs.hardware import ClusterSpec, load_device

H100, MI300X = "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"
NODE8 = GroupPlacement(8, 8, 1)


def _model(cal: Calibration, hardware: str) -> CalibratedCostModel:
    device = load_device(hardware)
    cluster = ClusterSpec(device=device, nodes=1, gpus_per_node=8)
    roofline = RooflineCostModel(device, fabric=Fabric.from_specs(device, cluster))
    return CalibratedCostModel(cal, roofline, groups={"tp": NODE8}, name="cal.json")


def _sweep(device: str | None, busbw: float, sizes: list[int], source: str) -> Calibration:
    rows = tuple(CollectiveRow(kind="all_reduce", n_ranks=8, n_nodes=1, size_bytes=s, time_s=10e-6 + 1.75 * s / busbw,
                               device=device, source=f"{source}:{i}") for i, s in enumerate(sizes))
    return Calibration(provenance=(Provenance(device_name=device, source_files=(source,)),), collective=rows)


def _gemm(device: str, rate: float, source: str) -> Calibration:
    rows = tuple(GemmRow(m=m, n=m, k=m, dtype="bf16", layout="TN", time_s=2.0 * m ** 3 / rate, source=f"{source}:{i}")
                 for i, m in enumerate((1024, 2048, 4096, 8192)))
    return Calibration(provenance=(Provenance(device_name=device, source_files=(source,)),), gemm=rows)


def _host(device: str, host_s: float, source: str) -> Calibration:
    return Calibration(provenance=(Provenance(device_name=device, source_files=(source,)),),
                       host=(HostRow(host_s=host_s, kernels=1000, device=device, source=f"{source}: intervals"),))


SIZES = [1 << p for p in range(20, 31)]


def test_a_mixed_calibration_prices_each_table_from_the_projected_devices_rows() -> None:
    """H100 collectives + MI300X GEMMs + both hosts: the MI300X's collectives fall back to its roofline fabric, its
    GEMMs and host time are its own; the H100's are the other way round. Before, the H100 rows priced the MI300X's
    all-reduce (no MI300X collective rows), the host time was the mean of both, and MI300X GEMMs priced the H100."""
    h100 = merge_calibrations([_sweep(H100, 370e9, SIZES, "h100_ar.log"), _host(H100, 31.5e-6, "h100.json")])
    mi300 = merge_calibrations([_gemm(MI300X, 500e12, "mi300_gemm.txt"), _host(MI300X, 27.2e-6, "mi300.json")])
    mixed = merge_calibrations([h100, mi300], allow_mixed_devices=True)

    mi = _model(mixed, "mi300x")
    bare = _model(Calibration(), "mi300x")
    assert mi.collective_seconds("all_reduce", 64 << 20, NODE8) == \
        pytest.approx(bare.collective_seconds("all_reduce", 64 << 20, NODE8), rel=1e-12)
    assert mi.collective_provenance("all_reduce", 64 << 20, NODE8) == "roofline"
    assert mi.host_kernel_issue_s == pytest.approx(27.2e-6)
    assert len(mi.rows.gemm) == 4 and not mi.rows.collective

    h = _model(mixed, "h100-sxm")
    alone = _model(h100, "h100-sxm")
    assert h.collective_seconds("all_reduce", 64 << 20, NODE8) == \
        pytest.approx(alone.collective_seconds("all_reduce", 64 << 20, NODE8), rel=1e-12)
    assert h.host_kernel_issue_s == pytest.approx(31.5e-6)
    assert not h.gemm  # the MI300X GEMMs price no H100 op: the H100's GEMMs fall back to its roofline

    note = mi.device_rows_note()
    assert note is not None and H100 in note and "mi300x is priced from its own rows only" in note
    assert "collective" in note.split("; its ")[1]  # its collectives are all another device's: said, not hidden


def test_a_calibration_of_one_device_or_only_of_others_is_used_whole() -> None:
    h100 = _sweep(H100, 370e9, SIZES, "h100_ar.log")
    assert _model(h100, "h100-sxm").device_rows_note() is None
    foreign = _model(h100, "mi300x")  # a mismatched --calibration: used as it is (project.py's note names it)
    assert foreign.device_rows_note() is None and len(foreign.rows.collective) == len(SIZES)
    assert foreign.collective_provenance("all_reduce", 64 << 20, NODE8).startswith("calibrated: cal.json")


def test_rows_without_a_device_field_take_their_source_files_device() -> None:
    from projection.cost.device_rows import row_device

    sources = [("traces/h100/q.json.gz", H100), ("traces/mi300/q.json.gz", MI300X), ("../shared/fixtures", MI300X)]
    row = GemmRow(m=8, n=8, k=8, dtype="bf16", layout="TN", time_s=1e-6, source="traces/h100/q.json.gz: aten::mm")
    assert row_device(row, sources) == H100
    assert row_device(row.model_copy(update={"source": "R: ../shared/fixtures/gemm/x.txt:12"}), sources) == MI300X
    assert row_device(row.model_copy(update={"source": "traces/h100/q.json.gz.bak:3"}), sources) is None
    assert row_device(row.model_copy(update={"source": ""}), sources) is None


def test_pg509_200_is_a_40gb_a100_for_performance_as_for_import() -> None:
    """The HTA traces' `NVIDIA A100-PG509-200` (PCI device 20B0, the A100-SXM4-40GB's; totalGlobalMem 42.3 GB) is not
    a100-80g: `performance` names it as another part, as `calibrate import` refuses to merge it with a100-80g rows."""
    a100 = load_device("a100-80g")
    assert device_match("NVIDIA A100-PG509-200", a100) == "other"
    assert device_match("NVIDIA A100-SXM4-80GB", a100) == "same"
    pg509 = Calibration(provenance=(Provenance(device_name="NVIDIA A100-PG509-200"),))
    with pytest.raises(CalibrationError, match="different devices"):
        merge_calibrations([_sweep("NVIDIA A100-SXM4-80GB", 230e9, SIZES, "a.log"), pg509])


def _nccl_like(last: int) -> Calibration:
    """An 8-GPU all_reduce sweep shaped like nccl-tests on A100 (latency-bound, then ~150 GB/s busbw from 2 MiB,
    ~235 GB/s from 16 MiB), up to `last` bytes."""
    rows = []
    for p in range(10, 34):
        s = 1 << p
        if s > last:
            break
        busbw = 60e9 if s < 2 << 20 else 150e9 if s < 16 << 20 else 235e9
        rows.append(CollectiveRow(kind="all_reduce", n_ranks=8, n_nodes=1, size_bytes=s, device=None,
                                  time_s=30e-6 + 1.75 * s / busbw, source=f"ar.log:{p}"))
    return Calibration(collective=tuple(rows))


def test_above_the_largest_measured_size_the_roofline_carries_the_extra_bytes() -> None:
    """A sweep cut at 8 MiB priced a 64 MiB all-reduce at its last segment's ~150 GB/s; now the bytes beyond 8 MiB go
    at the faster of that segment and the roofline (the device YAML's link), continuous at 8 MiB. Inside the measured
    sizes nothing moves, and the time never falls as the size grows."""
    cut, full = _model(_nccl_like(8 << 20), "a100-80g"), _model(_nccl_like(8 << 30), "a100-80g")
    bare = _model(Calibration(), "a100-80g")
    hi = 8 << 20
    for size in (1 << 20, 3 << 20, hi):  # inside: the curve's own price, as before
        assert cut.collective_seconds("all_reduce", size, NODE8) == pytest.approx(
            cut.fabric.curve_for("all_reduce", NODE8).time_s(size), rel=1e-9)  # type: ignore[union-attr]
    big = 64 << 20
    at_hi = cut.collective_seconds("all_reduce", hi, NODE8)
    roof = bare.collective_seconds("all_reduce", big, NODE8) - bare.collective_seconds("all_reduce", hi, NODE8)
    assert cut.collective_seconds("all_reduce", big, NODE8) == pytest.approx(at_hi + roof, rel=1e-9)
    segment = cut.fabric.curve_for("all_reduce", NODE8).time_s(big)  # type: ignore[union-attr]
    assert cut.collective_seconds("all_reduce", big, NODE8) < 0.75 * segment  # was the segment's extrapolation
    # the full sweep measured 64 MiB: within 25 % of it now (the YAML gives the A100 link's line rate, no efficiency)
    assert cut.collective_seconds("all_reduce", big, NODE8) == pytest.approx(
        full.collective_seconds("all_reduce", big, NODE8), rel=0.25)
    label = cut.collective_provenance("all_reduce", big, NODE8)
    assert label == "calibrated: cal.json all_reduce curve (above the measured sizes: the bytes beyond the largest " \
                    "at the roofline's bandwidth)"
    times = [cut.collective_seconds("all_reduce", float(s), NODE8) for s in range(1 << 20, 1 << 30, 3 << 20)]
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_a_measured_bandwidth_above_the_roofline_is_kept_above_the_range() -> None:
    """Where the last segment beats the roofline's ring figure (NVLS on H100 reduces in the switch), the bytes beyond
    the largest measured size keep the measured bandwidth."""
    fast = _model(_sweep(H100, 2000e9, SIZES, "nvls.log"), "h100-sxm")
    curve = fast.fabric.curve_for("all_reduce", NODE8)
    assert curve is not None
    big = 4.0 * (1 << 30)
    assert fast.collective_seconds("all_reduce", big, NODE8) == pytest.approx(curve.time_s(big), rel=1e-6)
    assert "last segment's bandwidth" in fast.collective_provenance("all_reduce", big, NODE8)


def test_shipped_h100_and_mi300x_calibrations_merged_price_each_device_alone(tmp_path: Path) -> None:
    from projection.calibrate.calibration import load_calibration

    repo = Path(__file__).resolve().parents[2] / "calibrations"
    h100, mi300 = load_calibration(repo / "h100-sxm.json"), load_calibration(repo / "mi300x.json")
    mixed = merge_calibrations([h100, mi300], allow_mixed_devices=True)
    for hardware, own in (("h100-sxm", h100), ("mi300x", mi300)):
        m, alone = _model(mixed, hardware), _model(own, hardware)
        assert m.collective_seconds("all_reduce", 64 << 20, NODE8) == \
            pytest.approx(alone.collective_seconds("all_reduce", 64 << 20, NODE8), rel=1e-9)
