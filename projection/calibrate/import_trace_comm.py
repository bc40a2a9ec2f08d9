"""Collective calls of a PyTorch profiler trace: the metadata of an NCCL / RCCL kernel (its own args or the enclosing
`record_param_comms` op) or of an enclosing `nccl:<name>` annotation, read as one `TraceCollectiveCall` with the
nccl-tests size convention (the output for all_gather, the input otherwise; import_trace.py's docstring says which
tensors each source records). Used by import_trace.trace_collective_calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from projection.calibrate.calibration import normalize_dtype
from projection.calibrate.import_common import busy_us, count
from projection.cost.collectives import CollectiveKind

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


def call_from_meta(meta: dict[str, Any], kernels: list[dict[str, Any]]) -> TraceCollectiveCall | str | None:
    """The call from kernel / record_param_comms metadata; None for a kind the model does not price, a reason (str)
    for counts that are not integers or a group below 1 rank."""
    name = str(meta.get("Collective name", ""))
    kind = _COLLECTIVES.get(name.lower())
    if kind is None or "Group size" not in meta:
        return None
    n_ranks = count(meta["Group size"], 1)
    in_n, out_n = count(meta.get("In msg nelems") or 0), count(meta.get("Out msg nelems") or 0)
    if n_ranks is None:
        return f"has a Group size that is not an integer from 1 to 2**53 ({meta['Group size']!r})"
    if in_n is None or out_n is None:
        return f"has In/Out msg nelems that are not integers from 0 to 2**53 ({meta.get('In msg nelems')!r})"
    dtype = normalize_dtype(str(meta.get("dtype", "")))
    nelems = (out_n or in_n * n_ranks) if kind == "all_gather" else in_n  # nccl-tests: all_gather's output
    return TraceCollectiveCall(name, kind, n_ranks, dtype, in_n, out_n, nelems * _DTYPE_BYTES.get(dtype, 1),
                               busy_us(kernels) * 1e-6)


def call_from_annotation(chain: list[dict[str, Any]], kernels: list[dict[str, Any]],
                         world: int | None) -> TraceCollectiveCall | str | None:
    """The call from an enclosing `nccl:<name>` annotation (import_trace.py's docstring: its Input Dims are the input
    tensors, so all_gather's output is Input Dims x world size)."""
    note = next((o for o in chain if str(o.get("name", "")).startswith("nccl:")), None)
    if note is None or world is None:
        return None
    name = str(note["name"]).removeprefix("nccl:")
    kind = _COLLECTIVES.get(name.lower())
    dims, types = _args(note).get("Input Dims") or [], _args(note).get("Input type") or []
    if kind is None or not isinstance(dims, list) or not dims or not isinstance(dims[0], list):
        return None
    if any(count(d) is None for d in dims[0]):
        return f"(nccl: annotation Input Dims) are not integers from 0 to 2**53 ({dims[0]!r})"
    dtype = normalize_dtype(str(types[0])) if isinstance(types, list) and types else "?"
    in_n = math.prod(dims[0])
    out_n = in_n * world if kind == "all_gather" else in_n // world if kind == "reduce_scatter" else in_n
    nelems = out_n if kind == "all_gather" else in_n
    return TraceCollectiveCall(name, kind, world, dtype, in_n, out_n, nelems * _DTYPE_BYTES.get(dtype, 1),
                               busy_us(kernels) * 1e-6)


def is_comm_kernel(name: str) -> bool:
    low = name.lower()
    return low.startswith(("nccl", "rccl")) or "ncclkernel" in low or "nccldevkernel" in low


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}
