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
Kernel time in a training step includes waiting for the slowest peer (hardware.md §2 trap).

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
from projection.calibrate.import_host import host_issue
from projection.cost.collectives import CollectiveKind
from projection.errors import Problem
from projection.fileio import gunzip_bounded

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::_scaled_mm")
_GPU_CATS = {"kernel", "gpu_memset", "gpu_memcpy"}
_OP_CATS = {"cpu_op", "user_annotation"}
_EPS_US = 1e-3  # float slack when comparing microsecond timestamps
_DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "uint8": 1, "int32": 4,
                "uint32": 4, "int64": 8, "uint64": 8}
_COLLECTIVES: dict[str, CollectiveKind] = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "all_to_allv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce", "send": "send_recv",
    "recv": "send_recv", "sendrecv": "send_recv"}


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


@dataclass(frozen=True)
class TraceCollectiveCall:
    """One collective kernel launch: its metadata and GPU time."""

    name: str
    kind: CollectiveKind
    n_ranks: int
    dtype: str
    in_nelems: int
    out_nelems: int
    size_bytes: int
    time_s: float


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

    def __init__(self, trace: dict[str, Any]):
        events = [e for e in trace["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"]
        self.gpu: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if e.get("cat") in _GPU_CATS and _args(e).get("correlation") is not None:
                self.gpu[_args(e)["correlation"]].append(e)
        ops = [e for e in events if e.get("cat") in _OP_CATS]
        self.launches = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                         and _args(e).get("correlation") in self.gpu]
        by_ext = {_args(o).get("External id"): o for o in ops if o.get("cat") == "cpu_op"}
        self.parent: dict[int, dict[str, Any] | None] = {}
        threads: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
        for e in ops + self.launches:
            threads[(e.get("pid"), e.get("tid"))].append(e)
        for items in threads.values():  # stack sweep: innermost enclosing op of every op and launch
            items.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)), e.get("cat") not in _OP_CATS))
            stack: list[dict[str, Any]] = []
            for e in items:
                while stack and _end(stack[-1]) + _EPS_US < _end(e):
                    stack.pop()
                self.parent[id(e)] = stack[-1] if stack else None
                if e.get("cat") in _OP_CATS:
                    stack.append(e)
        self.owner: dict[int, dict[str, Any] | None] = {}
        for launch in self.launches:
            op = by_ext.get(_args(launch).get("External id"))
            same_thread = op is not None and (op.get("pid"), op.get("tid")) == (launch.get("pid"), launch.get("tid"))
            self.owner[id(launch)] = op if same_thread else self.parent[id(launch)]

    def ancestors(self, op: dict[str, Any] | None) -> list[dict[str, Any]]:
        chain = []
        while op is not None:
            chain.append(op)
            op = self.parent.get(id(op))
        return chain


def trace_gemm_calls(trace: dict[str, Any], links: _Links | None = None) -> list[TraceGemmCall]:
    """Every GEMM op instance that launched GPU work, in launch order."""
    links = links or _Links(trace)
    work: dict[int, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for launch in links.launches:
        op = links.owner[id(launch)]
        if op is not None and op.get("name") in GEMM_OPS:
            work.setdefault(id(op), (op, []))[1].extend(links.gpu[_args(launch)["correlation"]])
    calls = []
    for op, gpu_events in work.values():
        shape = _gemm_shape(op)
        if shape is not None:
            m, n, k, batch, bias, a_t, b_t = shape
            dtype = normalize_dtype(str((_args(op).get("Input type") or ["?"])[1 if op["name"] in (
                "aten::addmm", "aten::baddbmm") else 0]))
            flop = 2.0 * batch * m * n * k + (batch * m * n if bias else 0)
            calls.append(TraceGemmCall(op["name"], m, n, k, batch, bias, dtype, a_t, b_t, flop,
                                       _busy_us(gpu_events) * 1e-6))
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


def trace_collective_calls(trace: dict[str, Any], links: _Links | None = None) -> list[TraceCollectiveCall]:
    """Every NCCL / RCCL kernel launch whose collective metadata can be found, in launch order."""
    links = links or _Links(trace)
    world = (trace.get("distributedInfo") or {}).get("world_size")
    calls = []
    for launch in links.launches:
        events = links.gpu[_args(launch)["correlation"]]
        kernels = [e for e in events if e.get("cat") == "kernel" and _is_comm_kernel(str(e.get("name", "")))]
        if not kernels:
            continue
        meta = next((_args(k) for k in kernels if "Collective name" in _args(k)), None)
        chain = links.ancestors(links.owner[id(launch)])
        if meta is None:
            meta = next((_args(o) for o in chain if o.get("name") == "record_param_comms"
                         and "Collective name" in _args(o)), None)
        call = _call_from_meta(meta, kernels) if meta else _call_from_annotation(chain, kernels, world)
        if call is not None:
            calls.append(call)
    return calls


def import_trace(path: str | Path, data: bytes | None = None) -> Calibration:
    """GEMM rows (BLAS convention, mean time per shape), collective rows (mean per kind, size, group) and the host
    seconds per kernel launch of a trace."""
    file = str(path)
    trace = load_trace(path, data)
    links = _Links(trace)
    gemm = []
    for s in summarize_gemms(trace_gemm_calls(trace, links)):
        if s.time_mean_s <= 0:
            continue
        m, n, k, layout = blas_from_torch(s.m, s.n, s.k, s.a_transposed, s.b_transposed)
        gemm.append(GemmRow(m=m, n=n, k=k, dtype=s.dtype, layout=layout, batch=s.batch, time_s=s.time_mean_s,
                            count=s.count, source=f"{file}: {s.op}{' with bias' if s.bias else ''}"))
    device = _device_name(trace)
    groups: dict[tuple[Any, ...], list[float]] = {}
    for c in trace_collective_calls(trace, links):
        if c.time_s > 0:
            groups.setdefault((c.kind, c.n_ranks, c.size_bytes, c.dtype, c.name), []).append(c.time_s)
    collective = [CollectiveRow(kind=kind, n_ranks=n, size_bytes=size, time_s=statistics.fmean(times), dtype=dtype,
                                device=device, count=len(times), source=f"{file}: {name} (in-training kernel time)")
                  for (kind, n, size, dtype, name), times in groups.items()]
    host = host_issue(trace, file, device)
    if not gemm and not collective and host is None:
        raise CalibrationError(Problem("the trace holds no GEMM with recorded shapes, no collective kernel and no "
                                       "kernel launches", file=file,
                                       fix="profile with record_shapes=True and CUDA/ROCm activities"))
    return Calibration(provenance=(_provenance(trace, file),), gemm=tuple(gemm), collective=tuple(collective),
                       host=(host,) if host is not None else ())


def _gemm_shape(op: dict[str, Any]) -> tuple[int, int, int, int, bool, bool, bool] | None:
    """(M, N, K, batch, bias, A transposed, B transposed) from Input Dims / Strides, or None if unreadable."""
    args = _args(op)
    dims, strides = args.get("Input Dims") or [], args.get("Input Strides") or []
    name = op["name"]
    first = 1 if name in ("aten::addmm", "aten::baddbmm") else 0
    if len(dims) < first + 2:
        return None
    a, b = dims[first], dims[first + 1]
    sa = strides[first] if len(strides) > first else []
    sb = strides[first + 1] if len(strides) > first + 1 else []
    if not (isinstance(a, list) and isinstance(b, list) and len(a) >= 2 and len(b) >= 2):
        return None
    bias = first == 1 or (name == "aten::linear" and len(dims) > 2 and bool(dims[2]))
    if name == "aten::linear":  # x [..., K] @ W[N, K]^T: the weight is B, stored transposed when contiguous
        return math.prod(a[:-1]), b[0], a[-1], 1, bias, _transposed(sa), not _transposed(sb)
    batch = math.prod(a[:-2]) if len(a) > 2 else (math.prod(b[:-2]) if len(b) > 2 else 1)
    return a[-2], b[-1], a[-1], batch, bias, _transposed(sa), _transposed(sb)


def _transposed(strides: Any) -> bool:
    """A matrix is stored transposed when its second-to-last dimension, not its last, has stride 1."""
    return isinstance(strides, list) and len(strides) >= 2 and strides[-1] != 1 and strides[-2] == 1


def _call_from_meta(meta: dict[str, Any], kernels: list[dict[str, Any]]) -> TraceCollectiveCall | None:
    name = str(meta.get("Collective name", ""))
    kind = _COLLECTIVES.get(name.lower())
    n_ranks = meta.get("Group size")
    if kind is None or not isinstance(n_ranks, int | float):
        return None
    dtype = normalize_dtype(str(meta.get("dtype", "")))
    in_n, out_n = int(meta.get("In msg nelems") or 0), int(meta.get("Out msg nelems") or 0)
    nelems = out_n if kind == "all_gather" else in_n
    return TraceCollectiveCall(name, kind, int(n_ranks), dtype, in_n, out_n, nelems * _DTYPE_BYTES.get(dtype, 1),
                               _busy_us(kernels) * 1e-6)


def _call_from_annotation(chain: list[dict[str, Any]], kernels: list[dict[str, Any]],
                          world: Any) -> TraceCollectiveCall | None:
    note = next((o for o in chain if str(o.get("name", "")).startswith("nccl:")), None)
    if note is None or not isinstance(world, int):
        return None
    name = str(note["name"]).removeprefix("nccl:")
    kind = _COLLECTIVES.get(name.lower())
    dims, types = _args(note).get("Input Dims") or [], _args(note).get("Input type") or []
    if kind is None or not dims or not isinstance(dims[0], list):
        return None
    dtype = normalize_dtype(str(types[0])) if types else "?"
    nelems = math.prod(dims[0])
    return TraceCollectiveCall(name, kind, world, dtype, nelems, nelems, nelems * _DTYPE_BYTES.get(dtype, 1),
                               _busy_us(kernels) * 1e-6)


def _is_comm_kernel(name: str) -> bool:
    low = name.lower()
    return low.startswith(("nccl", "rccl")) or "ncclkernel" in low or "nccldevkernel" in low


def _busy_us(events: list[dict[str, Any]]) -> float:
    """Length of the union of the events' [ts, ts + dur] intervals, microseconds (an interval overlapping no other
    counts its own `dur`, free of the rounding of large timestamps)."""
    total, group_start, group_end, group_dur, members = 0.0, 0.0, -math.inf, 0.0, 0
    for start, end, dur in sorted((float(e["ts"]), _end(e), float(e.get("dur", 0))) for e in events):
        if start > group_end:
            total += group_dur if members == 1 else group_end - group_start if members else 0.0
            group_start, group_end, group_dur, members = start, end, dur, 1
        else:
            group_end, members = max(group_end, end), members + 1
    return total + (group_dur if members == 1 else group_end - group_start if members else 0.0)


def _end(event: dict[str, Any]) -> float:
    return float(event["ts"]) + float(event.get("dur", 0))


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _device_name(trace: dict[str, Any]) -> str | None:
    props = trace.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        return str(props[0].get("name")) or None
    return None


def _provenance(trace: dict[str, Any], file: str) -> Provenance:
    keys = ("cuda_runtime_version", "cuda_driver_version", "cupti_version", "hip_runtime_version",
            "hip_driver_version", "roctracer_version")
    versions = {k.removesuffix("_version"): str(trace[k]) for k in keys if k in trace}
    dist = trace.get("distributedInfo") or {}
    if dist.get("nccl_version"):
        versions["nccl"] = str(dist["nccl_version"])
    date = None
    if isinstance(trace.get("baseTimeNanoseconds"), int):
        date = dt.datetime.fromtimestamp(trace["baseTimeNanoseconds"] / 1e9, tz=dt.UTC).date().isoformat()
    notes = [f"rank {dist.get('rank')} of world size {dist.get('world_size')}"] if dist else []
    return Provenance(device_name=_device_name(trace), library_versions=versions, date=date,
                      driver_version=versions.get("cuda_driver") or versions.get("hip_driver"), source_files=(file,),
                      notes=tuple(notes))
