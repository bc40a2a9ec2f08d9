"""PyTorch profiler (Kineto) traces, JSON or gzipped JSON: GEMM kernels with their shapes, collectives with their
message and group sizes.

Linking (the trace's own ids): a GPU event (`kernel`, `gpu_memset`, `gpu_memcpy`) carries the `correlation` of the
runtime call that launched it (`cudaLaunchKernel`, `hipExtModuleLaunchKernel` ...); the launch carries the
`External id` of the innermost CPU op around it. Traces whose launches do not (old Kineto: External id =
correlation) fall back to the innermost `cpu_op` / `user_annotation` enclosing the launch on its thread.

GEMMs: a `aten::mm / addmm / bmm / baddbmm / matmul / linear / _scaled_mm` op that launched GPU work itself; shapes from
its `Input Dims` (PyTorch convention C[M, N] = A[M, K] @ B[K, N], batch B), transposition from `Input Strides`;
time = the busy time of its GPU events (union of their intervals, memsets included). FLOP as TraceLens counts
them: 2 B M N K, plus M N B for the bias add of addmm / baddbmm / linear with bias. Calibration rows convert to the
BLAS convention (`blas_from_torch`) and average per shape.

Collectives: an NCCL / RCCL kernel; name, `In/Out msg nelems`, `dtype` and `Group size` from the kernel's own args,
else from the enclosing `record_param_comms` op, else from an enclosing `nccl:<name>` annotation's Input Dims (group
size then = the trace's world size). size_bytes follows nccl-tests: the output for all_gather, the input otherwise.
The annotation is c10d's `Work` record function, which records the *input* tensors only (torch/csrc/distributed/c10d/
Work.cpp: "Passing input tensor to recordFunction allows for shape information"): one rank's shard for all_gather,
so its size is Input Dims x group size; the whole buffer for reduce_scatter, which is already the nccl-tests size.
Kernel time in a training step includes waiting for the slowest peer (hardware.md §2 trap).

Malformed content (import_common.py): events without a readable time, ids that are not numbers or strings, shapes or
counts that are not positive integers, rows that do not validate are skipped and counted in a provenance note;
unreadable metadata (distributedInfo, baseTimeNanoseconds) is left out with a note.

Host: seconds per kernel launch of the traced program (projection/calibrate/import_host.py).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from projection.calibrate.calibration import (
    Calibration,
    CollectiveRow,
    GemmRow,
    Provenance,
    blas_from_torch,
    normalize_dtype,
)
from projection.calibrate.errors import CalibrationError
from projection.calibrate.import_common import (
    Skipped,
    build_row,
    busy_us,
    count,
    event_end,
    hashable_id,
    thread_of,
    trace_events,
)
from projection.calibrate.import_host import host_issue
from projection.calibrate.import_trace_comm import (
    TraceCollectiveCall,
    call_from_annotation,
    call_from_meta,
    is_comm_kernel,
)
from projection.errors import Problem
from projection.fileio import gunzip_bounded

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm")
_GPU_CATS = {"kernel", "gpu_memset", "gpu_memcpy"}
_OP_CATS = {"cpu_op", "user_annotation"}
_EPS_US = 1e-3  # float slack when comparing microsecond timestamps


@dataclass(frozen=True)
class TraceGemmShape:
    """A GEMM op name and shape (PyTorch convention). flop counts the bias add as TraceLens does."""

    op: str
    m: int
    n: int
    k: int
    batch: int
    bias: bool
    dtype: str
    a_transposed: bool
    b_transposed: bool
    flop: float


@dataclass(frozen=True)
class TraceGemmCall(TraceGemmShape):
    """One GEMM op instance and its kernel time."""

    time_s: float


@dataclass(frozen=True)
class TraceGemmSummary(TraceGemmShape):
    """GEMM calls of one op name and shape: count, mean and total busy time, mean of the per-call FLOP/s."""

    count: int
    time_mean_s: float
    time_sum_s: float
    flop_per_s_mean: float


def load_trace(path: str | Path, data: bytes | None = None) -> dict[str, Any]:
    """The trace JSON object (gzip recognised by its magic bytes, not the suffix)."""
    file = str(path)
    try:
        raw = Path(path).read_bytes() if data is None else data
        text = gunzip_bounded(raw) if raw[:2] == b"\x1f\x8b" else raw
        trace = json.loads(text)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CalibrationError(Problem(f"cannot read the trace: {err}", file=file,
                                       fix="give a PyTorch profiler trace (.json or .json.gz)")) from None
    if not looks_like_trace(trace):
        raise CalibrationError(Problem("not a PyTorch profiler trace (no 'traceEvents' list)", file=file,
                                       fix="export it with torch.profiler ... prof.export_chrome_trace(path)"))
    return trace


def looks_like_trace(data: object) -> bool:
    """True for a Chrome/Kineto trace object."""
    return isinstance(data, dict) and isinstance(data.get("traceEvents"), list)


class _Links:
    """Launch -> GPU events, launch -> innermost CPU op, op -> enclosing op, for one trace."""

    def __init__(self, trace: dict[str, Any], skipped: Skipped | None = None):
        events = trace_events(trace, skipped)
        self.gpu: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if e.get("cat") in _GPU_CATS and _correlation(e) is not None:
                self.gpu[_correlation(e)].append(e)
            elif e.get("cat") in _GPU_CATS and "correlation" in _args(e) and skipped is not None:
                skipped.add("GPU event(s) whose correlation is not a number or a string", f"ts {e['ts']}",
                            f"{e.get('name')!r}: {_args(e)['correlation']!r}"[:80])
        ops = [e for e in events if e.get("cat") in _OP_CATS]
        self.launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                         and _correlation(e) in self.gpu]
        by_ext = {hashable_id(_args(o).get("External id")): o for o in ops if o.get("cat") == "cpu_op"}
        by_ext.pop(None, None)
        self.parent: dict[int, dict[str, Any] | None] = {}
        threads: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for e in ops + self.launches:
            threads[thread_of(e)].append(e)
        for items in threads.values():  # stack sweep: innermost enclosing op of every op and launch
            items.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)), e.get("cat") not in _OP_CATS))
            stack: list[dict[str, Any]] = []
            for e in items:
                while stack and event_end(stack[-1]) + _EPS_US < event_end(e):
                    stack.pop()
                self.parent[id(e)] = stack[-1] if stack else None
                if e.get("cat") in _OP_CATS:
                    stack.append(e)
        self.owner: dict[int, dict[str, Any] | None] = {}
        for launch in self.launches:
            op = by_ext.get(hashable_id(_args(launch).get("External id")))
            same_thread = op is not None and (op.get("pid"), op.get("tid")) == (launch.get("pid"), launch.get("tid"))
            self.owner[id(launch)] = op if same_thread else self.parent[id(launch)]

    def ancestors(self, op: dict[str, Any] | None) -> list[dict[str, Any]]:
        chain = []
        while op is not None:
            chain.append(op)
            op = self.parent.get(id(op))
        return chain


def trace_gemm_calls(trace: dict[str, Any], links: _Links | None = None,
                     skipped: Skipped | None = None) -> list[TraceGemmCall]:
    """Every GEMM op instance that launched GPU work, in launch order (ops whose recorded shape is not positive
    integers are left out, and recorded in `skipped`)."""
    links = links or _Links(trace, skipped)
    work: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for launch in links.launches:
        op = links.owner[id(launch)]
        if op is not None and op.get("name") in GEMM_OPS:
            work.setdefault(id(op), (op, []))[1].extend(links.gpu[_correlation(launch)])
    calls = []
    for op, gpu_events in work.values():
        shape = _gemm_shape(op)
        if isinstance(shape, str):
            if skipped is not None:
                skipped.add(f"GEMM op(s) whose Input Dims {shape}", f"ts {op.get('ts')}",
                            f"{op['name']} {_args(op).get('Input Dims')!r}"[:120])
        elif shape is not None:
            m, n, k, batch, bias, a_t, b_t = shape
            types = _args(op).get("Input type")
            index = 1 if op["name"] in ("aten::addmm", "aten::baddbmm") else 0
            dtype = normalize_dtype(str(types[index])) if isinstance(types, list) and len(types) > index else "?"
            flop = 2.0 * batch * m * n * k + (batch * m * n if bias else 0)
            calls.append(TraceGemmCall(op["name"], m, n, k, batch, bias, dtype, a_t, b_t, flop,
                                       busy_us(gpu_events) * 1e-6))
    return calls


def summarize_gemms(calls: list[TraceGemmCall]) -> list[TraceGemmSummary]:
    """Calls grouped by op name, shape, bias, dtype and transposition (first-seen order)."""
    shape_fields = [f.name for f in fields(TraceGemmShape) if f.name != "flop"]
    groups: dict[tuple[Any, ...], list[TraceGemmCall]] = {}
    for c in calls:
        groups.setdefault(tuple(getattr(c, name) for name in shape_fields), []).append(c)
    out = []
    for members in groups.values():
        shape = {f.name: getattr(members[0], f.name) for f in fields(TraceGemmShape)}
        times = [x.time_s for x in members]
        rates = [x.flop / x.time_s for x in members if x.time_s > 0]
        out.append(TraceGemmSummary(**shape, count=len(members), time_mean_s=statistics.fmean(times),
                                    time_sum_s=math.fsum(times),
                                    flop_per_s_mean=statistics.fmean(rates) if rates else 0.0))
    return out


def trace_collective_calls(trace: dict[str, Any], links: _Links | None = None,
                           skipped: Skipped | None = None) -> list[TraceCollectiveCall]:
    """Every NCCL / RCCL kernel launch whose collective metadata can be found, in launch order (metadata whose counts
    are not integers, or a group size below 1, is left out and recorded in `skipped`)."""
    links = links or _Links(trace, skipped)
    world = count(_dist(trace).get("world_size"), 1)
    calls = []
    for launch in links.launches:
        events = links.gpu[_correlation(launch)]
        kernels = [e for e in events if e.get("cat") == "kernel" and is_comm_kernel(str(e.get("name", "")))]
        if not kernels:
            continue
        meta = next((_args(k) for k in kernels if "Collective name" in _args(k)), None)
        chain = links.ancestors(links.owner[id(launch)])
        if meta is None:
            meta = next((_args(o) for o in chain if o.get("name") == "record_param_comms"
                         and "Collective name" in _args(o)), None)
        call = call_from_meta(meta, kernels) if meta else call_from_annotation(chain, kernels, world)
        if isinstance(call, str):
            if skipped is not None:
                skipped.add(f"collective kernel(s) whose metadata {call}", f"ts {kernels[0].get('ts')}",
                            str(kernels[0].get("name"))[:60])
        elif call is not None:
            calls.append(call)
    return calls


def import_trace(path: str | Path, data: bytes | None = None) -> Calibration:
    """GEMM rows (BLAS convention, mean time per shape), collective rows (mean per kind, size, group) and the host
    seconds per kernel launch of a trace."""
    file = str(path)
    trace = load_trace(path, data)
    skipped = Skipped(file, unit="")
    links = _Links(trace, skipped)
    gemm = []
    for s in summarize_gemms(trace_gemm_calls(trace, links, skipped)):
        if s.time_mean_s <= 0:
            continue
        m, n, k, layout = blas_from_torch(s.m, s.n, s.k, s.a_transposed, s.b_transposed)
        source = f"{file}: {s.op}{' with bias' if s.bias else ''}"
        row, why = build_row(GemmRow, dict(m=m, n=n, k=k, dtype=s.dtype, layout=layout, batch=s.batch,
                                           time_s=s.time_mean_s, count=s.count, source=source))
        if row is None:
            skipped.add("GEMM shape(s) with impossible values", f"{s.op} {s.m}x{s.n}x{s.k}", why or "")
        else:
            gemm.append(row)
    device = _device_name(trace)
    groups: dict[tuple[Any, ...], list[float]] = {}
    for c in trace_collective_calls(trace, links, skipped):
        if c.time_s > 0:
            groups.setdefault((c.kind, c.n_ranks, c.size_bytes, c.dtype, c.name), []).append(c.time_s)
    collective = []
    for (kind, n, size, dtype, name), times in groups.items():
        crow, why = build_row(CollectiveRow, dict(kind=kind, n_ranks=n, size_bytes=size, time_s=statistics.fmean(times),
                                                  dtype=dtype, device=device, count=len(times),
                                                  source=f"{file}: {name} (in-training kernel time)"))
        if crow is None:
            skipped.add("collective(s) with impossible values", f"{name} of {size} bytes", why or "")
        else:
            collective.append(crow)
    host = host_issue(trace, file, device)
    if not gemm and not collective and host is None:
        said = f" that can be read ({skipped.notes()[0].notes[0]})" if skipped else ""
        raise CalibrationError(Problem("the trace holds no GEMM with recorded shapes, no collective kernel and no "
                                       f"kernel launches{said}", file=file,
                                       fix="profile with record_shapes=True and CUDA/ROCm activities"
                                           + (" (and check how the trace was written)" if skipped else "")))
    return Calibration(provenance=(_provenance(trace, file), *skipped.notes()), gemm=tuple(gemm),
                       collective=tuple(collective), host=(host,) if host is not None else ())


def _gemm_shape(op: dict[str, Any]) -> tuple[int, int, int, int, bool, bool, bool] | str | None:
    """(M, N, K, batch, bias, A transposed, B transposed) from Input Dims / Strides; None if no shape was recorded
    (profiled without record_shapes); a reason (str) if the recorded dimensions are not positive integers."""
    args = _args(op)
    dims, strides = args.get("Input Dims") or [], args.get("Input Strides") or []
    if not isinstance(dims, list) or not isinstance(strides, list):
        return "are not lists"
    name = op["name"]
    first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
    if len(dims) < first + 2:
        return None
    a, b = dims[first], dims[first + 1]
    sa = strides[first] if len(strides) > first else []
    sb = strides[first + 1] if len(strides) > first + 1 else []
    if not (isinstance(a, list) and isinstance(b, list) and len(a) >= 2 and len(b) >= 2):
        return None
    if any(count(d) is None for d in a + b):
        return "are not integers from 0 to 2**53"
    if 0 in a + b:
        return "have a zero dimension (no work)"
    bias = first == 1 or (name == "aten::linear" and len(dims) > 2 and bool(dims[2]))
    if name == "aten::linear":  # x [..., K] @ W[N, K]^T: the weight is B, stored transposed when contiguous
        return math.prod(a[:-1]), b[0], a[-1], 1, bias, _transposed(sa), not _transposed(sb)
    batch = math.prod(a[:-2]) if len(a) > 2 else (math.prod(b[:-2]) if len(b) > 2 else 1)
    return a[-2], b[-1], a[-1], batch, bias, _transposed(sa), _transposed(sb)


def _transposed(strides: Any) -> bool:
    """A matrix is stored transposed when its second-to-last dimension, not its last, has stride 1."""
    return isinstance(strides, list) and len(strides) >= 2 and strides[-1] != 1 and strides[-2] == 1


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _correlation(event: dict[str, Any]) -> int | str | None:
    return hashable_id(_args(event).get("correlation"))


def _dist(trace: dict[str, Any]) -> dict[str, Any]:
    """distributedInfo, or {} when absent or not an object (_provenance notes the latter)."""
    dist = trace.get("distributedInfo")
    return dist if isinstance(dist, dict) else {}


def _device_name(trace: dict[str, Any]) -> str | None:
    props = trace.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        name = props[0].get("name")
        return name.strip() or None if isinstance(name, str) else None
    return None


def _provenance(trace: dict[str, Any], file: str) -> Provenance:
    keys = ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version",
            "hip_driver_version", "roctracer_version")
    versions = {k.removesuffix("_version"): str(trace[k]) for k in keys if k in trace}
    dist = _dist(trace)
    if dist.get("nccl_version"):
        versions["nccl"] = str(dist["nccl_version"])
    notes = [f"rank {dist.get('rank')} of world size {dist.get('world_size')}"] if dist else []
    if "distributedInfo" in trace and not isinstance(trace["distributedInfo"], dict | None):
        notes.append(f"distributedInfo is not a JSON object ({str(trace['distributedInfo'])[:40]!r}): left out (no "
                     "world size for collectives read from nccl: annotations)")
    date = None
    stamp = trace.get("baseTimeNanoseconds")
    if isinstance(stamp, int) and not isinstance(stamp, bool):
        try:
            date = dt.datetime.fromtimestamp(stamp / 1e9, tz=dt.UTC).date().isoformat()
        except (OverflowError, OSError, ValueError):  # past the year 9999 or the platform's time_t
            notes.append(f"baseTimeNanoseconds {stamp} is not a date: left out")
    return Provenance(device_name=_device_name(trace), library_versions=versions, date=date,
                      driver_version=versions.get("cuda_driver") or versions.get("hip_driver"), source_files=(file,),
                      notes=tuple(notes))
