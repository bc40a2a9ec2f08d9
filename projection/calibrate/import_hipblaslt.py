"""hipblaslt-bench output: the raw stdout (`[0]transA,transB,...,hipblaslt-Gflops,us` then a CSV line, hipBLASLt 600
layout) and the tuning result files of Primus (`tune_gemm_results-*.txt`: `Git Version:` then header + row pairs with
a_type..d_type, hipblaslt-GB/s, solution_index, gcnArchName, CUs). Rows are BLAS-convention GEMMs (m, n, k,
transA + transB as the layout), input dtype = a_type (d_type in the old layout), time = the `us` column, and FLOP/s =
2 m n k batch / time, which is what hipblaslt-bench prints in `hipblaslt-Gflops` (compared in the tests).

Grouped GEMM (`grouped_gemm` column non-zero): hipBLASLt's client (clients/include/testing_matmul.hpp) runs
`gemm_count = max(1, grouped_gemm)` GEMMs in one launch, each batched `batch_count` times. A GroupedGemmRow's
`groups` counts the m x n x k products of the launch (FLOP = 2 groups m n k, projection/cost/calibrated.py), so
groups = gemm_count x batch_count.

Rows whose values are impossible (a time of 0, negative, NaN, infinite or over an hour; a dimension or batch below 1;
a number past 2**53) are not measurements: skipped, and said in a provenance note with their lines (as are rows that
cannot be read), like the nccl-tests importer.

Transformer Engine's hipBLASLt algorithm cache (`dev_cap,m,n,k,trans_a,...,algo_id`) lists shapes without timings:
`read_te_algo_shapes` returns them (e.g. as the shapes to benchmark), and importing one is a CalibrationError.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from projection.calibrate.calibration import Calibration, GemmRow, GroupedGemmRow, Provenance, normalize_dtype
from projection.calibrate.errors import CalibrationError
from projection.calibrate.import_common import Skipped, build_row
from projection.errors import Problem

_PREFIX = re.compile(r"^\[\d+\]:?")  # hipBLASLt 600 prints `[0]transA`, later releases `[0]:transA`


@dataclass(frozen=True)
class GemmShape:
    """A GEMM shape without a timing (BLAS convention)."""

    m: int
    n: int
    k: int
    layout: str
    dtype: str
    out_dtype: str


def looks_like_hipblaslt(text: str) -> bool:
    """True if the text has a hipblaslt-bench result header."""
    return "hipblaslt-Gflops" in text and "transA" in text


def looks_like_te_algo_cache(text: str) -> bool:
    """True for Transformer Engine's hipBLASLt algorithm cache CSV (shapes, no timings)."""
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith("dev_cap,m,n,k,trans_a,trans_b")


def import_hipblaslt(path: str | Path, text: str | None = None) -> Calibration:
    """GEMM rows (and grouped-GEMM rows for grouped_gemm=1) from hipblaslt-bench output or a Primus tuning file."""
    file = str(path)
    if text is None:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    if looks_like_te_algo_cache(text):
        raise CalibrationError(Problem("a Transformer Engine hipBLASLt algorithm cache: GEMM shapes and algorithm ids, "
                                       "no timings", file=file,
                                       fix="import the hipblaslt-bench tuning output it was chosen from (e.g. "
                                           "tune_gemm_results-*.txt), or benchmark its shapes with "
                                           "`projection calibrate gemm`"))
    gemm: list[GemmRow] = []
    grouped: list[GroupedGemmRow] = []
    header: list[str] | None = None
    devices: list[str] = []
    skipped = Skipped(file)  # result rows that cannot be read or hold impossible values: said, not dropped silently
    unreadable = "malformed data row(s) (not the header's columns, or numbers that cannot be read)"
    for number, raw in enumerate(text.splitlines(), 1):
        line = _PREFIX.sub("", raw.strip())
        if line.startswith("transA,"):
            header = next(csv.reader([line]))
            continue
        if header is None or "," not in line:
            if m := re.match(r"Device ID \d+ : (.+)$", line):
                devices.append(m.group(1).strip())
            continue
        values = next(csv.reader([line]))
        if len(values) != len(header):
            if values[0].strip().upper() in ("N", "T"):  # a result row (it starts with transA), not banner text
                skipped.add(unreadable, number)
            continue
        row = {k.strip(): v.strip() for k, v in zip(header, values, strict=True)}
        try:
            m_, n_, k_ = int(row["m"]), int(row["n"]), int(row["k"])
            batch, time_us = int(row.get("batch_count", "1")), float(row["us"])
            gemm_count = max(1, int(row.get("grouped_gemm") or "0"))  # testing_matmul: max(1, arg.grouped_gemm)
        except (KeyError, ValueError):
            skipped.add(unreadable, number)
            continue
        dtype = normalize_dtype(row.get("a_type") or row.get("d_type", ""))
        out_dtype = normalize_dtype(row.get("d_type", "")) or None
        layout = (row.get("transA", "N") + row.get("transB", "N")).upper()
        source = f"{file}:{number}" + (f" solution {row['solution_index']}" if row.get("solution_index") else "")
        if row.get("gcnArchName"):
            devices.append(f"{row['gcnArchName']} ({row['CUs']} CUs)" if row.get("CUs") else row["gcnArchName"])
        if row.get("grouped_gemm", "0") not in ("0", ""):
            grouped_row, why = build_row(GroupedGemmRow, dict(
                groups=gemm_count * batch if batch >= 1 else batch, m=m_, n=n_, k=k_, dtype=dtype, layout=layout,
                time_s=time_us * 1e-6, source=f"{source} (grouped_gemm {gemm_count} x batch_count {batch})"))
            grouped += [grouped_row] if grouped_row is not None else []
        else:
            gemm_row, why = build_row(GemmRow, dict(m=m_, n=n_, k=k_, dtype=dtype, layout=layout, batch=batch,
                                                    time_s=time_us * 1e-6, out_dtype=out_dtype, source=source))
            gemm += [gemm_row] if gemm_row is not None else []
        if why is not None:
            skipped.add("data row(s) with impossible values (a time not positive, finite and under an hour, or a "
                        "dimension or batch below 1 or past 2**53)", number, why)
    if not gemm and not grouped:
        said = f" that can be read ({skipped.notes()[0].notes[0]})" if skipped else ""
        raise CalibrationError(Problem(f"no hipblaslt-bench result rows found{said}", file=file,
                                       fix="run hipblaslt-bench again for those shapes (each row needs a positive, "
                                           "finite `us` and dimensions of at least 1)" if skipped else
                                           "give hipblaslt-bench stdout (header with transA,...,hipblaslt-Gflops,us "
                                           "and a CSV row after it)"))
    versions = {}
    if m := re.search(r"hipBLASLt version:\s*(\S+)", text):
        versions["hipblaslt"] = m.group(1)
    if m := re.search(r"(?:hipBLASLt git version|Git Version):\s*(\S+)", text):
        versions["hipblaslt_git"] = m.group(1)
    device = max(set(devices), key=devices.count) if devices else None
    provenance = (Provenance(device_name=device, library_versions=versions, source_files=(file,)), *skipped.notes())
    return Calibration(provenance=provenance, gemm=tuple(gemm), grouped_gemm=tuple(grouped))


def read_te_algo_shapes(path: str | Path) -> list[GemmShape]:
    """The distinct GEMM shapes of a Transformer Engine hipBLASLt algorithm cache CSV, in file order."""
    file = str(path)
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as err:
        raise CalibrationError(Problem(f"cannot read: {err}", file=file, fix="check the path")) from None
    shapes: list[GemmShape] = []
    for row in rows:
        try:
            shape = GemmShape(int(row["m"]), int(row["n"]), int(row["k"]), (row["trans_a"] + row["trans_b"]).upper(),
                              normalize_dtype(row["type_a"]), normalize_dtype(row["type_d"]))
        except (KeyError, TypeError, ValueError):
            raise CalibrationError(Problem("not a Transformer Engine algorithm cache row", file=file,
                                           fix="expected columns dev_cap,m,n,k,trans_a,trans_b,type_a,...")) from None
        if shape not in shapes:
            shapes.append(shape)
    return shapes
