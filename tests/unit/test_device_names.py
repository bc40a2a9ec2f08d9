"""Which bundled device a name a tool printed stands for (projection/specs/device_names.py), and what follows from
it: the note when a calibration was measured on another part (an audit found A100 40 GB data priced a100-80g, and
H100 PCIe data h100-sxm, without one, and ISA-only matches unmarked), one machine's hipBLASLt (ISA) and rccl-tests
(product) logs merged, a mixed calibration pricing the projected device's collectives whatever the file order, and
`calibrate fit` finding the device of a log by its printed name."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.calibrate.calibration import Calibration, CollectiveRow, Provenance, merge_calibrations
from projection.calibrate.errors import CalibrationError
from projection.perf import default_cost_model, project
from projection.specs.device_names import device_match, identify
from projection.specs.hardware import list_devices, load_device

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"


@pytest.mark.parametrize(("printed", "device", "match"), [
    ("NVIDIA A100-SXM4-80GB", "a100-80g", "same"), ("A100-SXM4-40GB", "a100-80g", "other"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm", "same"), ("NVIDIA H100 PCIe", "h100-sxm", "other"),
    ("NVIDIA H100 NVL", "h100-sxm", "other"), ("AMD Instinct MI300X", "mi325x", "other"),
    ("AMD Instinct MI325X", "mi325x", "same"), ("AMD Radeon Graphics gfx942:sramecc+:xnack-", "mi325x", "arch"),
    ("NVIDIA H20", "h200", "other"), ("NVIDIA H200", "h200", "same"), ("NVIDIA B200", "b200", "same"),
])
def test_printed_names(printed: str, device: str, match: str) -> None:
    assert device_match(printed, load_device(device)) == match


def test_identify_is_unique_or_none() -> None:
    bundled = [load_device(n) for n in list_devices()]
    ident = {name: (d.name if (d := identify(name, bundled)) else None)
             for name in ("AMD Instinct MI300X", "NVIDIA H100 80GB HBM3", "gfx950:sramecc+:xnack- (256 CUs)",
                          "gfx942:sramecc+:xnack- (304 CUs)")}
    assert ident == {"AMD Instinct MI300X": "mi300x", "NVIDIA H100 80GB HBM3": "h100-sxm",
                     "gfx950:sramecc+:xnack- (256 CUs)": "mi355x", "gfx942:sramecc+:xnack- (304 CUs)": None}


def _sweep(device: str, busbw: float) -> Calibration:
    sizes = [1 << p for p in range(20, 31)]
    rows = [CollectiveRow(kind="all_reduce", n_ranks=8, n_nodes=1, size_bytes=s, time_s=8e-6 + 1.75 * s / busbw,
                          device=device, source=f"{device}:{i}") for i, s in enumerate(sizes)]
    return Calibration(provenance=(Provenance(device_name=device),), collective=tuple(rows))


def _tp_comm(cal: Calibration, tmp_path: Path, hardware: str) -> tuple[float, list[str]]:
    path = tmp_path / "cal.json"
    cal.save(path)
    sc = api.load(EXAMPLE, hardware=hardware, overrides={"plan.tp": 8, "plan.pp": 1})
    p = project(sc, default_cost_model(sc, calibration=path))
    return p.comm_total_s["tp"], [n for n in p.notes if n.startswith("calibration ")]


def test_another_part_is_named_and_a_mixed_calibration_prices_the_projected_ones_rows(tmp_path: Path) -> None:
    _, notes = _tp_comm(_sweep("NVIDIA H100 PCIe", 150e9), tmp_path, "h100-sxm")
    assert any("was measured on NVIDIA H100 PCIe, not on h100-sxm" in n for n in notes)
    _, notes = _tp_comm(_sweep("NVIDIA H100 80GB HBM3", 370e9), tmp_path, "h100-sxm")
    assert not [n for n in notes if "measured on" in n or "holds" in n]
    own, other = _sweep("AMD Instinct MI300X", 50e9), _sweep("A100-SXM4-40GB", 200e9)
    alone, _ = _tp_comm(own, tmp_path, "mi300x")
    for cals in ((own, other), (other, own)):
        mixed = merge_calibrations(cals, allow_mixed_devices=True)
        comm, notes = _tp_comm(mixed, tmp_path, "mi300x")
        assert comm == pytest.approx(alone, rel=1e-12)
        assert any("also holds measurements of A100-SXM4-40GB" in n for n in notes)


def test_one_machines_isa_and_product_logs_merge() -> None:
    gemm_isa = Calibration(provenance=(Provenance(device_name="gfx950:sramecc+:xnack- (256 CUs)"),))
    merged = merge_calibrations([gemm_isa, _sweep("AMD Instinct MI355X", 300e9)])
    assert len(merged.collective) == 11
    with pytest.raises(CalibrationError, match="different devices"):
        merge_calibrations([Calibration(provenance=(Provenance(device_name="gfx942:sramecc+:xnack-"),)),
                            _sweep("AMD Instinct MI355X", 300e9)])


def test_calibrate_fit_finds_the_device_by_its_printed_name(tmp_path: Path) -> None:
    from projection.cli_calibrate import _bundled_fabric

    cal = _sweep("AMD Instinct MI300X", 300e9)
    fabric = _bundled_fabric(cal, str(tmp_path / "smoke.json"))
    assert fabric is not None and fabric.intra == _bundled_fabric(cal, str(tmp_path / "mi300x.json")).intra
