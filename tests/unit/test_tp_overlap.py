"""TP communication overlapped by decomposition (perf/tp_overlap.py): the GEMM beside an overlapped TP collective runs
as the pieces Transformer Engine's userbuffers (or torch's async TP) split it into, each priced at its own shape, and
the collective's exposed part is the pipelined formula over the same pieces. Checked with a stub cost model whose
per-GEMM constant makes a split visible: splitting into p pieces costs p - 1 more constants and nothing else."""

from __future__ import annotations

import pytest

from projection.perf.action_time import pipelined_exposed_s
from projection.perf.items import Entry, ItemBuilder
from projection.perf.tp_overlap import UB_PIPELINE_SPLITS, split_gemm_s, splits
from projection.specs.plan import ParallelPlan
from projection.workload.ops_base import coll, gemm

LAUNCH_S = 1e-5  # the stub's fixed seconds per GEMM
RATE = 5e14  # and its FLOP/s


def stub(op):  # type: ignore[no-untyped-def]
    return op.flop / RATE + LAUNCH_S if op.kind == "gemm" else 1e-6


def plan(tp: int, style: str = "megatron") -> ParallelPlan:
    return ParallelPlan(tp=tp, sp=True, tp_style=style, overlap={"tp_comm": True})


def test_split_counts_follow_the_runtimes() -> None:
    # TE userbuffers: ring exchange (all-gathers) in tp steps, the pipelined reduce-scatter in num_splits = 4
    assert (splits(plan(8), "all_gather"), splits(plan(8), "reduce_scatter")) == (8, UB_PIPELINE_SPLITS) == (8, 4)
    assert (splits(plan(2), "all_gather"), splits(plan(2), "reduce_scatter")) == (2, 4)
    # torch's async TP: both fused ops split by the group size
    assert (splits(plan(8, "dtensor"), "all_gather"), splits(plan(8, "dtensor"), "reduce_scatter")) == (8, 8)


def test_a_split_gemm_is_pieces_of_the_token_rows_each_reading_the_whole_weight() -> None:
    op = gemm("fc1", "F", 7168, 8192, 4096, "bf16", 2, layout="TN")  # m = out features, n = tokens, k = in
    seen = []

    def record(piece):  # type: ignore[no-untyped-def]
        seen.append(piece)
        return stub(piece)

    assert split_gemm_s(op, 4, record) == pytest.approx(op.flop / RATE + 4 * LAUNCH_S, rel=1e-12)
    (piece,) = seen
    assert (piece.m, piece.n, piece.k) == (7168, 2048, 4096) and piece.flop == op.flop / 4
    assert piece.bytes_read == 2 * (7168 * 4096 + 4096 * 2048) and piece.bytes_written == 2 * 7168 * 2048
    # a weight-gradient GEMM (tokens in k) and a grouped GEMM are not split
    wgrad = gemm("fc1.wgrad", "W", 4096, 7168, 8192, "bf16", 2, layout="NT")
    assert split_gemm_s(wgrad, 4, stub) == stub(wgrad)


def test_the_builder_splits_the_paired_gemms_and_pipelines_the_collectives() -> None:
    tp = 8
    ag = coll("fc1.ag", "F", "all_gather", 64e6, "tp")
    fc1 = gemm("fc1", "F", 7168, 8192, 4096, "bf16", 2, layout="TN")
    fc2 = gemm("fc2", "F", 4096, 8192, 3584, "bf16", 2, layout="TN")
    rs = coll("fc2.rs", "F", "reduce_scatter", 64e6, "tp")
    comm_s = 2e-4
    items = ItemBuilder(plan(tp), stub, lambda op: comm_s)._entries([Entry(ag), Entry(fc1), Entry(fc2), Entry(rs)],
                                                                      backward=False)
    runs = [(i.category, i.seconds, i.full_s) for i in items if i.mode == "run"]
    g1, g2 = split_gemm_s(fc1, tp, stub), split_gemm_s(fc2, 4, stub)
    assert g1 == pytest.approx(stub(fc1) + (tp - 1) * LAUNCH_S) and g2 == pytest.approx(stub(fc2) + 3 * LAUNCH_S)
    assert runs == [("tp", pytest.approx(pipelined_exposed_s(comm_s, g1, tp)), comm_s), ("gemm", g1, None),
                    ("gemm", g2, None), ("tp", pytest.approx(pipelined_exposed_s(comm_s, g2, 4)), comm_s)]
    # without the overlap nothing is split and the collectives are waited for whole
    plain = ItemBuilder(ParallelPlan(tp=tp, sp=True), stub, lambda op: comm_s)._entries(
        [Entry(ag), Entry(fc1), Entry(fc2), Entry(rs)], backward=False)
    assert [i.seconds for i in plain if i.mode == "run"] == [comm_s, stub(fc1), stub(fc2), comm_s]
