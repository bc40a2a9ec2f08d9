"""`Calibration`: measured GEMM, grouped-GEMM, attention, memory-bound and collective tables with their provenance.

One JSON file (`Calibration.save` / `load_calibration`) per device, written by the importers (nccl-tests / rccl-tests
logs, hipblaslt-bench output, PyTorch profiler traces) and by the microbenchmarks. SI units throughout: seconds
(`time_s`), bytes (`size_bytes`), FLOP/s (`flop_per_s`), bytes/s (`*_bytes_per_s`).

Conventions (shared by every producer and reader of these tables):
* GEMM rows use the BLAS / cuBLAS / hipBLASLt column-major convention, as hipblaslt-bench prints it and as a GEMM
  kernel name says it (`..._tn_...`): D[m, n] = op(A)[m, k] op(B)[k, n], `layout` = transA + transB. A PyTorch
  `y = x @ W.T` with x [tokens, in] and W [out, in] is m = out, n = tokens, k = in, layout "TN"
  (`blas_from_torch` converts). FLOP = 2 m n k batch.
* Collective `size_bytes` is the nccl-tests "size" column: the whole buffer for all_reduce / broadcast / reduce, the
  gathered (all_gather) or scattered (reduce_scatter) total, the send buffer of one rank for all_to_all, one message
  for send_recv. algbw = size / time; busbw = algbw x bus factor (hardware.md §0): all_reduce 2(n-1)/n;
  all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send_recv 1.
* dtypes are short names: fp64, fp32, tf32, bf16, fp16, fp8, fp4, int8, uint8, int32, uint32, int64, uint64
  (`normalize_dtype` maps the spellings of nccl-tests, hipBLASLt, Transformer Engine and PyTorch).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from projection.calibrate.errors import CalibrationError
from projection.cost.collectives import COLLECTIVE_KINDS, CollectiveKind, bus_factor
from projection.errors import Problem
from projection.fileio import DuplicateJsonKey, atomic_write_text, loads_json_unique, require_regular
from projection.specs.base import Spec

Layout = Literal["NN", "NT", "TN", "TT"]
# one kernel's or collective's measured seconds: an hour is a typo or a unit slip, and would overflow the pricing
RowSeconds = Annotated[float, Field(gt=0, le=3600)]
SCHEMA_VERSION: Literal[1] = 1

_DTYPES = {  # lower-cased spelling with '_r' and 'c10::' removed -> short name
    "float": "fp32", "float32": "fp32", "f32": "fp32", "fp32": "fp32", "single": "fp32",
    "double": "fp64", "float64": "fp64", "f64": "fp64", "fp64": "fp64",
    "half": "fp16", "float16": "fp16", "f16": "fp16", "fp16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16", "tf32": "tf32", "xf32": "tf32",
    "int8": "int8", "i8": "int8", "char": "int8", "uint8": "uint8", "u8": "uint8", "byte": "uint8",
    "int32": "int32", "i32": "int32", "int": "int32", "uint32": "uint32", "int64": "int64", "i64": "int64",
    "long": "int64", "long int": "int64", "uint64": "uint64", "bool": "uint8",
}


def normalize_dtype(name: str) -> str:
    """Short dtype name from any common spelling: 'float' -> fp32, 'c10::BFloat16' -> bf16, 'bf16_r' -> bf16,
    'f8_r' / 'float8e4m3' / 'c10::Float8_e4m3fnuz' / 'fp8_e5m2' -> fp8, 'Long' -> int64. Unknown names are returned
    lower-cased, unchanged otherwise."""
    text = name.strip().lower().removeprefix("c10::").removeprefix("torch.")
    text = re.sub(r"_r$", "", text)
    if re.match(r"^(f8|fp8|float8|e4m3|e5m2|bf8)", text):
        return "fp8"
    if re.match(r"^(f4|fp4|float4)", text):
        return "fp4"
    return _DTYPES.get(text, text)


def blas_from_torch(m: int, n: int, k: int, a_transposed: bool, b_transposed: bool) -> tuple[int, int, int, Layout]:
    """BLAS (column-major) m, n, k and layout of the row-major PyTorch product C[m, n] = A[m, k] @ B[k, n].

    a_transposed / b_transposed: the operand is stored transposed (its first, not its last, dimension has stride 1),
    e.g. the weight of `F.linear` as B. Row-major C is column-major C^T = B^T A^T, so BLAS m = n, BLAS n = m and
    BLAS (transA, transB) = (B's letter, A's letter)."""
    layout = ("T" if b_transposed else "N") + ("T" if a_transposed else "N")
    return n, m, k, layout  # type: ignore[return-value]


class Provenance(Spec):
    """Where a set of rows comes from. Every field is optional: an imported log holds what it holds."""

    device_name: str | None = None
    driver_version: str | None = None
    library_versions: dict[str, str] = Field(default_factory=dict)
    """e.g. {'nccl': '2.17.1', 'hipblaslt': '600 (git 52776da)', 'cuda_runtime': '12040'}."""
    torch_version: str | None = None
    date: str | None = None  # ISO 8601 date or date-time of the measurement (or of the import, if unknown)
    command: str | None = None
    source_files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


class GemmRow(Spec):
    """One measured GEMM (BLAS convention, see the module docstring). flop_per_s defaults to 2 m n k batch / time_s."""

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    dtype: str = Field(min_length=1)  # input dtype (A and B)
    layout: Layout
    batch: int = Field(default=1, ge=1)
    time_s: RowSeconds
    flop_per_s: float = Field(default=0.0, ge=0)  # filled from the shape and time when not given
    out_dtype: str | None = None
    count: int = Field(default=1, ge=1)  # measurements averaged into time_s
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _fill_rate(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("flop_per_s") is None and _positive(data.get("time_s")):
            dims = [data.get(key) for key in ("m", "n", "k")] + [data.get("batch", 1)]
            if all(_positive(d) for d in dims):
                data = {**data, "flop_per_s": 2.0 * _product(dims) / float(data["time_s"])}
        return data


class GroupedGemmRow(Spec):
    """A grouped GEMM (MoE experts): `groups` GEMMs of m x n x k each (m = average rows per group), one launch."""

    groups: int = Field(ge=1)
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    dtype: str = Field(min_length=1)
    layout: Layout = "TN"
    time_s: RowSeconds
    flop_per_s: float = Field(default=0.0, ge=0)  # filled from the shape and time when not given
    count: int = Field(default=1, ge=1)
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _fill_rate(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("flop_per_s") is None and _positive(data.get("time_s")):
            dims = [data.get(key) for key in ("groups", "m", "n", "k")]
            if all(_positive(d) for d in dims):
                data = {**data, "flop_per_s": 2.0 * _product(dims) / float(data["time_s"])}
        return data


class AttentionRow(Spec):
    """One measured flash / scaled-dot-product attention call (forward or backward)."""

    direction: Literal["fwd", "bwd"]
    batch: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    seq_q: int = Field(ge=1)
    seq_kv: int = Field(ge=1)
    causal: bool
    dtype: str = Field(min_length=1)
    time_s: RowSeconds
    count: int = Field(default=1, ge=1)
    source: str = ""


class MemoryBoundRow(Spec):
    """A bandwidth-bound op (elementwise, norm, copy ...): bytes read + written, and its time."""

    op: str = Field(min_length=1)
    size_bytes: int = Field(ge=0)
    time_s: RowSeconds
    dtype: str | None = None
    count: int = Field(default=1, ge=1)
    source: str = ""


class HostRow(Spec):
    """Host (CPU) seconds per kernel launch of eager PyTorch: the framework-overhead constant of projection/perf
    (a kernel cannot start before the host has issued it). `kernels`: launches the figure averages over."""

    host_s: RowSeconds  # like every measured time: an hour per launch is a unit slip (and overflows the pricing)
    kernels: int = Field(ge=1)
    device: str | None = None
    source: str = ""


class CollectiveRow(Spec):
    """One measured collective (size convention in the module docstring). n_nodes None = not known (a trace).
    algbw / busbw default to the values computed from size, time and the bus factor."""

    kind: CollectiveKind
    n_ranks: int = Field(ge=1)
    n_nodes: int | None = Field(default=None, ge=1)
    size_bytes: int = Field(ge=0)
    time_s: RowSeconds
    algbw_bytes_per_s: float = Field(default=0.0, ge=0)  # filled from size, time and kind when not given
    busbw_bytes_per_s: float = Field(default=0.0, ge=0)
    in_place: bool = False
    dtype: str | None = None
    device: str | None = None  # the device measured on, when the source names it (fits never blend devices)
    count: int = Field(default=1, ge=1)
    source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _fill_bandwidths(cls, data: Any) -> Any:
        if isinstance(data, dict) and _positive(data.get("time_s")) and _non_negative(data.get("size_bytes")):
            algbw = data["size_bytes"] / float(data["time_s"])
            if data.get("algbw_bytes_per_s") is None:
                data = {**data, "algbw_bytes_per_s": algbw}
            if data.get("busbw_bytes_per_s") is None and data.get("kind") in COLLECTIVE_KINDS:
                n_ranks = data.get("n_ranks", 1)
                n_ranks = n_ranks if isinstance(n_ranks, int) and n_ranks >= 1 else 1
                data = {**data, "busbw_bytes_per_s": algbw * bus_factor(data["kind"], n_ranks)}
        return data

    @model_validator(mode="after")
    def _nodes_hold_the_ranks(self) -> CollectiveRow:
        """A group of n_ranks over n_nodes nodes: at least one rank a node, the same number on each (an uneven
        split is not a placement the fits price)."""
        if self.n_nodes is not None and (self.n_nodes > self.n_ranks or self.n_ranks % self.n_nodes):
            raise ValueError(f"{self.n_ranks} ranks cannot sit evenly on {self.n_nodes} nodes: n_nodes must divide "
                             "n_ranks")
        return self


class Calibration(Spec):
    """Measured tables of one device (or one cluster), with the provenance of each source merged into it."""

    schema_version: Literal[1] = SCHEMA_VERSION
    provenance: tuple[Provenance, ...] = ()
    gemm: tuple[GemmRow, ...] = ()
    grouped_gemm: tuple[GroupedGemmRow, ...] = ()
    attention: tuple[AttentionRow, ...] = ()
    memory_bound: tuple[MemoryBoundRow, ...] = ()
    collective: tuple[CollectiveRow, ...] = ()
    host: tuple[HostRow, ...] = ()

    def row_counts(self) -> dict[str, int]:
        """Rows per table, e.g. {'gemm': 20, 'collective': 64, ...}."""
        return {name: len(getattr(self, name)) for name in TABLES}

    def host_kernel_issue_s(self) -> float | None:
        """Host seconds per kernel launch over the host rows (weighted by their launches), None without rows."""
        n = sum(r.kernels for r in self.host)
        return sum(r.host_s * r.kernels for r in self.host) / n if n else None

    def to_json(self) -> str:
        """Indented JSON text (what `save` writes)."""
        return self.model_dump_json(indent=2) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the calibration as JSON, whole or not at all; CalibrationError if the file cannot be written."""
        try:
            atomic_write_text(path, self.to_json())
        except OSError as err:
            raise CalibrationError(Problem(f"cannot write the calibration: {err.strerror or err}", file=str(path),
                                           fix="give a writable path for --out")) from None


TABLES = ("gemm", "grouped_gemm", "attention", "memory_bound", "collective", "host")


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration JSON file. CalibrationError names the file, the line or key, and the fix."""
    file = str(path)
    require_regular(path, CalibrationError)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CalibrationError(Problem("calibration file not found", file=file, fix="check the path, or create one "
                                       "with `projection calibrate import`")) from None
    except (OSError, UnicodeDecodeError) as err:
        raise CalibrationError(Problem(f"cannot read the calibration: {err}", file=file,
                                       fix="give a UTF-8 JSON file written by `projection calibrate`")) from None
    return calibration_from_json(text, file)


def calibration_from_json(text: str, file: str = "<calibration>") -> Calibration:
    """Parse and validate calibration JSON text (`file` names it in errors)."""
    try:
        data = loads_json_unique(text)
    except json.JSONDecodeError as err:
        raise CalibrationError(Problem(f"invalid JSON: {err.msg} (column {err.colno})", file=file, line=err.lineno,
                                       fix="give the JSON written by `projection calibrate import`")) from None
    except DuplicateJsonKey as err:
        raise CalibrationError(Problem(str(err), key=err.key, file=file, line=err.line,
                                       fix="keep one of them (a JSON reader would silently take the last)")) from None
    except RecursionError:
        raise CalibrationError(Problem("the JSON is nested too deeply to read (hundreds of levels)", file=file,
                                       fix="give the JSON written by `projection calibrate import`")) from None
    if not isinstance(data, dict) or not (set(data) & {"schema_version", *TABLES}):
        raise CalibrationError(Problem("not a calibration: expected a JSON object with 'schema_version' and tables "
                                       f"({', '.join(TABLES)})", file=file,
                                       fix="give the JSON written by `projection calibrate import` or `--out`"))
    try:
        return Calibration.model_validate(data)
    except ValidationError as err:
        raise CalibrationError([_problem(e, file) for e in err.errors()]) from None


def _problem(err: Any, file: str) -> Problem:
    key = ".".join(str(x) for x in err["loc"]) or None
    if err["type"] == "extra_forbidden":
        return Problem("unknown key", key=key, file=file, fix="remove it or fix its spelling")
    if err["type"] == "missing":
        return Problem("required key is missing", key=key, file=file, fix="add it (see docs/calibration.md)")
    if "n_nodes must divide" in err["msg"]:
        return Problem(err["msg"].removeprefix("Value error, "), key=key, file=file,
                       fix="give the number of nodes the row's ranks ran on")
    return Problem(f"{err['msg']} (got {err.get('input')!r})", key=key, file=file,
                   fix="correct the value (units are SI: seconds, bytes, bytes/s, FLOP/s)")


def merge_calibrations(calibrations: Iterable[Calibration], *, allow_mixed_devices: bool = False,
                       files: Sequence[str] | None = None) -> Calibration:
    """One calibration holding every row and provenance of `calibrations` (in order; exact duplicates once).

    Rows of different devices must not be mixed (a fit would blend their curves): CalibrationError unless
    allow_mixed_devices, naming `files` (the file each calibration was read from, when given) and the device each
    holds, else the sources recorded in their provenance."""
    cals = list(calibrations)
    devices = _distinct_devices(p.device_name for c in cals for p in c.provenance if p.device_name)
    if len(devices) > 1 and not allow_mixed_devices:
        if files is not None and len(files) == len(cals):
            held = [(f, _distinct_devices(p.device_name for p in c.provenance if p.device_name))
                    for f, c in zip(files, cals, strict=True)]
            held = [(f, d) for f, d in held if d]
            what = "; ".join(f"{f} holds {', '.join(d)}" for f, d in held)
            named = list(dict.fromkeys(f for f, _ in held))
        else:
            what = ", ".join(devices)
            named = sorted({f for c in cals for p in c.provenance for f in p.source_files})
        raise CalibrationError(Problem(f"measurements of different devices: {what}",
                                       file=", ".join(named) or None,
                                       fix="import each device's files into its own calibration "
                                           "(or pass --allow-mixed-devices)"))
    merged: dict[str, dict[str, Any]] = {name: {} for name in ("provenance", *TABLES)}
    for cal in cals:
        for name, rows in merged.items():
            for row in getattr(cal, name):
                rows.setdefault(row.model_dump_json(), row)
    return Calibration.model_validate({name: tuple(rows.values()) for name, rows in merged.items()})


def _distinct_devices(names: Iterable[str]) -> list[str]:
    """Device names that are not spellings of one another ('A100-SXM4-40GB' = 'NVIDIA A100-SXM4-40GB'); the ISA
    hipBLASLt prints (gfx950) is the product rccl-tests names on the same machine (AMD Instinct MI355X) where that
    product's device YAML has that ISA (specs/device_names.py)."""
    kept: list[tuple[str, str]] = []
    for name in names:
        key = re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("amd", "").replace("instinct", ""))
        if not any(key in k or k in key for k, _ in kept):
            kept.append((key, name))
    distinct = [name for _, name in kept]
    if len(distinct) < 2:
        return distinct
    from projection.specs.device_names import device_match
    from projection.specs.hardware import list_devices, load_device

    bundled = [load_device(n) for n in list_devices()]
    products = [n for n in distinct if any(device_match(n, d) == "same" for d in bundled)]
    return [n for n in distinct if n in products or not any(
        device_match(n, d) == "arch" and any(device_match(p, d) == "same" for p in products) for d in bundled)]


def _product(values: Iterable[Any]) -> float:
    out = 1.0
    for value in values:
        out *= float(value)
    return out


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _non_negative(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
