"""Tensor-parallel communication overlapped by decomposition (`overlap.tp_comm`): how many pieces a TP collective
and its GEMM are split into, and what the split GEMM costs.

Transformer Engine's userbuffers (Megatron `--tp-comm-overlap`; TE `module/base.py` initialize_ub, its default
methods when no config names others): the all-gather in front of qkv_fprop and fc1_fprop, and of the output gradient
in front of proj_dgrad and fc2_dgrad, runs as a `ring_exchange` in tp steps, each feeding a GEMM on the 1/tp of the
token rows it brought; the reduce-scatter after proj_fprop and fc2_fprop runs as a `pipeline` of `num_splits` chunks
(default 4: `add_ub(..., num_splits=4)`), each GEMM chunk's rows reduce-scattered while the next computes; the
input-gradient reduce-scatter of qkv and fc1 is a `bulk` overlap with the weight-gradient GEMM (not split; the
asynchronous path of perf/items.py). torch's async TP (TorchTitan `enable_async_tensor_parallel`: the
micro-pipeline pass's fused_all_gather_matmul and fused_matmul_reduce_scatter) splits both by the group size.

A split GEMM is that many GEMMs of 1/splits of the token rows (n), each reading the whole weight; each is priced by
the cost model at its own shape (the measured tables, or the roofline's efficiency at that size), so the loss of
efficiency a decomposition costs (Wang et al. 2023, "Overlap communication with dependent computation via
decomposition", ASPLOS) comes from the same microbenchmarks as every other GEMM. The exposed communication is then
action_time.pipelined_exposed_s of the collective and the split GEMM over the same number of pieces. Not priced: the
SMs a pipelined reduce-scatter's communication kernels take from the GEMMs beside it (TE's num_sm, 16 by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from projection.specs.plan import ParallelPlan
from projection.specs.training import DTYPE_BYTES
from projection.workload.ops import Op

UB_PIPELINE_SPLITS = 4  # TE initialize_ub: the `pipeline` method's default num_splits (proj_fprop, fc2_fprop)


def splits(plan: ParallelPlan, coll: str | None) -> int:
    """Pieces an overlapped TP collective of kind `coll` and its GEMM are split into (module docstring)."""
    if plan.tp_style == "dtensor" or coll == "all_gather":
        return plan.tp
    return UB_PIPELINE_SPLITS


def split_gemm_s(op: Op, pieces: int, compute_s: Callable[[Op], float]) -> float:
    """Seconds of GEMM `op` run as `pieces` GEMMs of its token rows (forward and input-gradient GEMMs hold the tokens
    in n: workload/ops_base.linear); any other op, or one with fewer rows than pieces, as it is."""
    if op.kind != "gemm" or op.phase not in ("F", "I") or pieces <= 1 or op.n < pieces:
        return compute_s(op)
    b_in = DTYPE_BYTES.get(op.dtype, 2)
    n = op.n / pieces
    # what ops_base.gemm reads besides A and B (an accumulated output), split with the rows
    rest = op.bytes_read - op.batch * (op.m * op.k + op.k * op.n) * b_in
    piece = replace(op, n=round(n), flop=op.flop / pieces, bytes_read=op.batch * (op.m * op.k + op.k * n) * b_in
                    + rest / pieces, bytes_written=op.bytes_written / pieces)
    return pieces * compute_s(piece)
