"""A calibration measured on another device than the scenario's is used as it is, and the projection says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.perf import default_cost_model, project

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3_8b_inline.yaml"


def _calibration_notes(hardware: str, calibration: Path | None = None) -> list[str]:
    sc = api.load(EXAMPLE, hardware=hardware)
    proj = project(sc, default_cost_model(sc, calibration=calibration))
    return [n for n in proj.notes if n.startswith("calibration ") and " was measured on " in n]


@pytest.mark.parametrize("hardware", ["mi300x", "mi325x", "mi355x", "h100-sxm", "h200"])
def test_shipped_calibration_matches_its_device(hardware: str) -> None:
    assert _calibration_notes(hardware) == []


def test_foreign_calibration_is_named() -> None:
    notes = _calibration_notes("mi300x", REPO / "calibrations" / "h100-sxm.json")
    assert len(notes) == 1
    assert "measured on NVIDIA H100 80GB HBM3, not on mi300x" in notes[0]


FIXTURES = REPO.parent / "shared" / "fixtures" / "gemm"


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures is absent (a user's clone)")
@pytest.mark.parametrize(("log", "same", "other"), [
    ("mi300x_hipblaslt_bench_fp16_896.txt", "mi300x", "mi355x"),  # 'AMD Radeon Graphics gfx942' (304 CUs)
    ("tune_gemm_results-v26.5.txt", "mi355x", "mi300x"),          # gfx950 (256 CUs)
])
def test_rocm_logs_name_the_isa_not_the_product(tmp_path: Path, log: str, same: str, other: str) -> None:
    """hipBLASLt logs print the ISA (gfx942, gfx950), not the product: the device YAML's gpu_arch matches it, so the
    part it was measured on gets no note and another part still does."""
    from projection.calibrate.importers import import_file

    out = tmp_path / "c.json"
    import_file(FIXTURES / log).save(out)
    assert _calibration_notes(same, out) == []
    assert len(_calibration_notes(other, out)) == 1
