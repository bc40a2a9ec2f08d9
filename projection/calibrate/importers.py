"""`import_files`: read measurement files of any supported format into one `Calibration`.

The format is told from the content, never the suffix: gzip is unpacked first (by its magic bytes); a JSON object
with `traceEvents` is a PyTorch profiler trace, one with `schema_version` or calibration tables is a calibration
(merged as is); text with a hipblaslt-bench header (`transA,...,hipblaslt-Gflops`) is hipblaslt-bench output; text
with nccl-tests data rows is an nccl-tests / rccl-tests log. Anything else holds no benchmark table: a
CalibrationError naming the file (exit code 2 in the CLI).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from projection.calibrate.calibration import Calibration, calibration_from_json, merge_calibrations
from projection.calibrate.errors import CalibrationError
from projection.calibrate.import_hipblaslt import import_hipblaslt, looks_like_hipblaslt, looks_like_te_algo_cache
from projection.calibrate.import_nccl import looks_like_nccl, parse_nccl_text
from projection.calibrate.import_trace import import_trace
from projection.errors import Problem
from projection.fileio import gunzip_bounded, require_regular

Format = Literal["trace", "calibration", "hipblaslt", "te_algo_cache", "nccl", "unknown"]
_SUPPORTED = ("an nccl-tests / rccl-tests log, hipblaslt-bench output, a PyTorch profiler trace (.json / .json.gz) "
              "or a calibration JSON")


def detect_format(data: bytes) -> Format:
    """Which importer reads these bytes (see the module docstring)."""
    try:
        text = _unpacked(data).decode("utf-8", errors="replace")
    except (OSError, EOFError):
        return "unknown"
    if text.lstrip()[:1] == "{":
        if re.search(r'"traceEvents"\s*:\s*\[', text):
            return "trace"
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, RecursionError):  # import_file says what is wrong with it
            obj = None
        if isinstance(obj, dict) and ("schema_version" in obj or "collective" in obj or "gemm" in obj):
            return "calibration"
    if looks_like_te_algo_cache(text):
        return "te_algo_cache"
    if looks_like_hipblaslt(text):
        return "hipblaslt"
    if looks_like_nccl(text):
        return "nccl"
    return "unknown"


def import_file(path: str | Path) -> Calibration:
    """One file into a Calibration (format from its content). CalibrationError if it holds no benchmark table."""
    file = str(path)
    require_regular(path, CalibrationError)
    try:
        data = _unpacked(Path(path).read_bytes())
    except FileNotFoundError:
        raise CalibrationError(Problem("file not found", file=file, fix="check the path")) from None
    except (OSError, EOFError) as err:
        raise CalibrationError(Problem(f"cannot read: {getattr(err, 'strerror', None) or err}", file=file,
                                       fix="give a readable file (gzip files must be complete)")) from None
    fmt = detect_format(data)
    if fmt == "trace":
        return import_trace(file, data)
    text = data.decode("utf-8", errors="replace")
    if fmt == "calibration":
        return calibration_from_json(text, file)
    if fmt in ("hipblaslt", "te_algo_cache"):
        return import_hipblaslt(file, text)
    if fmt == "nccl":
        return parse_nccl_text(text, file)
    if text.lstrip()[:1] == "{":  # meant as JSON (a calibration, a trace) but broken: where, not "no table"
        _check_json(text, file)
    raise CalibrationError(Problem("no benchmark table found in this file", file=file, fix=f"give {_SUPPORTED}"))


def _check_json(text: str, file: str) -> None:
    """CalibrationError locating the syntax error of JSON text that does not parse; nothing when it parses."""
    try:
        json.loads(text)
    except json.JSONDecodeError as err:
        raise CalibrationError(Problem(f"invalid JSON: {err.msg} (column {err.colno})", file=file, line=err.lineno,
                                       fix="fix the JSON syntax at that line")) from None
    except RecursionError:
        raise CalibrationError(Problem("the JSON is nested too deeply to read (hundreds of levels)", file=file,
                                       fix=f"give {_SUPPORTED}")) from None


def _unpacked(data: bytes) -> bytes:
    """gzip content unpacked (recognised by its magic bytes), anything else unchanged."""
    return gunzip_bounded(data) if data[:2] == b"\x1f\x8b" else data



def import_files(paths: Iterable[str | Path], *, allow_mixed_devices: bool = False) -> Calibration:
    """Every file into one Calibration (rows and provenance merged in order). All files are read and every
    failing one is reported together; measurements of different devices are refused unless allow_mixed_devices."""
    cals: list[Calibration] = []
    problems: list[Problem] = []
    paths = list(paths)
    if not paths:
        raise CalibrationError(Problem("no input files", fix=f"give one or more files: {_SUPPORTED}"))
    for path in paths:
        try:
            cals.append(import_file(path))
        except CalibrationError as err:
            problems.extend(err.problems)
    if problems:
        raise CalibrationError(problems)
    return merge_calibrations(cals, allow_mixed_devices=allow_mixed_devices, files=[str(p) for p in paths])
