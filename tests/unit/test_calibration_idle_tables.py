"""A --calibration whose tables hold rows that price none of the job's ops says which. An audit fed an imported
profiler trace (142 fp32 GEMM rows, 25 collective rows without a node count) to a bf16 job: the cost sources read
`roofline 100%` while the only note said the file had no attention and memory-bound rows, as if its GEMMs and
collectives were used."""

from __future__ import annotations

from pathlib import Path

from projection import api
from projection.calibrate.calibration import Calibration, GemmRow, Provenance, load_calibration
from projection.perf import default_cost_model, project

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama3_8b_inline.yaml"


def _gemms(dtype: str) -> tuple[GemmRow, ...]:
    return tuple(GemmRow(m=m, n=n, k=k, dtype=dtype, layout="TN", time_s=2.0 * m * n * k / 3e14)
                 for m in (1024, 8192) for n in (1024, 8192) for k in (1024, 8192))


def test_the_tables_that_price_nothing_are_named(tmp_path: Path) -> None:
    sc = api.load(EXAMPLE)  # bf16 GEMMs, head dim 128
    # the shipped tables but the attention rows (head dim 64: they price none of this job's ops either)
    shipped = load_calibration(ROOT / "calibrations" / "mi300x.json").model_copy(update={"attention": ()})
    for dtype, idle in (("fp32", True), ("bf16", False)):
        path = tmp_path / f"{dtype}.json"
        shipped.model_copy(update={"gemm": _gemms(dtype), "provenance": (Provenance(
            device_name="AMD Instinct MI300X"),)}).save(path)
        p = project(sc, default_cost_model(sc, calibration=path))
        named = [n for n in p.notes if "price none of this job's ops" in n]
        gemm_sources = [k for k in p.provenance if f"{path.name} gemm" in k]
        assert bool(named) == idle and bool(gemm_sources) != idle  # the note exactly when no source is the table
        if idle:
            assert f"its gemm ({len(_gemms(dtype))} rows) price none" in named[0]
            assert "collective" not in named[0] and "attention" not in named[0]  # those did price ops
    assert not [n for n in project(sc).notes if "price none" in n]  # the shipped calibration itself: no note


def test_a_table_the_ops_fall_out_of_counts_as_used(tmp_path: Path) -> None:
    """An op outside a table's measured range still came from that table's lookup (the roofline beyond it): its
    source names the table, and the table is not called idle."""
    sc = api.load(EXAMPLE)
    path = tmp_path / "tiny.json"
    rows = tuple(GemmRow(m=m, n=n, k=k, dtype="bf16", layout="TN", time_s=2.0 * m * n * k / 3e14)
                 for m in (64, 128) for n in (64, 128) for k in (64, 128))
    Calibration(provenance=(Provenance(device_name="AMD Instinct MI300X"),), gemm=rows).save(path)
    p = project(sc, default_cost_model(sc, calibration=path))
    assert any(k.startswith("calibrated (out of range -> roofline): tiny.json gemm bf16") for k in p.provenance)
    assert not [n for n in p.notes if "price none" in n]
