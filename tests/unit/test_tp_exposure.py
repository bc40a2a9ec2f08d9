"""Exposed tensor-parallel communication of a whole step (the breakdown's `comm.tp`) against a count of Megatron-
Core's collectives, tp 2 without sequence parallelism, one pipeline stage, one data-parallel rank. A stub cost model
prices every collective at c and every GEMM at g, nothing else. From megatron/core/tensor_parallel:
- forward, blocking: each layer's two RowParallelLinear outputs (attention projection, FC2) all-reduced
  (reduce_from_tensor_model_parallel_region), the VocabParallelEmbedding's output all-reduced, and the vocab-parallel
  cross entropy's three all-reduces (logits max, predicted logit, sum of exponentials): 2 L + 4 a microbatch;
- backward: each ColumnParallelLinear (QKV, FC1 and the output layer) all-reduces its input gradient asynchronously
  and computes its weight gradient before waiting (LinearWithGradAccumulationAndAsyncCommunication), so each
  exposes max(0, c - g): 2 L + 1 of them.
comm_total_s["tp"] counts every all-reduce whole: (4 L + 5) c a microbatch."""

from __future__ import annotations

import pytest

from projection.perf import project
from projection.workload.ops import Op
from tests.unit.test_perf_core import scenario


class GemmsAndCollectives:
    def __init__(self, gemm_s: float, coll_s: float) -> None:
        self.gemm_s, self.coll_s = gemm_s, coll_s

    def op_seconds(self, op: Op) -> float:
        return self.gemm_s * op.count if op.kind == "gemm" else 0.0

    def collective_seconds(self, kind: object, size_bytes: float, group: object) -> float:
        return self.coll_s

    def provenance(self, op: Op) -> str:
        return "stub"

    def collective_provenance(self, kind: object, size_bytes: float, group: object) -> str:
        return "stub"


@pytest.mark.parametrize("layers", [2, 4])
@pytest.mark.parametrize("gemm_over_coll", [0.0, 0.4, 2.0])
def test_exposed_tp_communication_is_megatrons_count(layers: int, gemm_over_coll: float) -> None:
    c = 1e-3
    g = gemm_over_coll * c
    p = project(scenario(tp=2, layers=layers, gpn=2, gbs=4, mbs=1), GemmsAndCollectives(g, c))
    m = p.n_microbatches
    assert m == 4 and p.world_size == 2
    exposed = m * ((2 * layers + 4) * c + (2 * layers + 1) * max(0.0, c - g))
    assert p.breakdown_s["comm.tp"] == pytest.approx(exposed, rel=1e-9)
    assert p.comm_total_s["tp"] == pytest.approx(m * (4 * layers + 5) * c, rel=1e-9)
