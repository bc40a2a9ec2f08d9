"""The `--scaling` table's efficiency column against the 1F1B closed form. With a stub cost model that prices only
the decoder layers' GEMMs and attention (FLOP / peak) and nothing else (no collective, p2p, optimizer or host
time), every pipeline stage costs the same t a microbatch and the step is (m + p - 1) t (Narayanan et al. 2021,
§2.2); at fixed global batch, n times the nodes run m / n microbatches per rank on n times the GPUs, so the
efficiency, tokens/s/GPU over the first row's, is (m + p - 1) / (m + n (p - 1)). Independent of the simulator:
a count of the schedule's slots."""

from __future__ import annotations

import pytest

from projection.perf.scaling import scaling_table
from projection.report.perf_tables import scaling_rows
from projection.workload.ops import Op
from tests.unit.test_perf_core import QUIET, scenario


class LayerFlopsOnly:
    """Prices a decoder layer's GEMM or attention op at its FLOP over the bf16 peak; everything else costs 0."""

    def op_seconds(self, op: Op) -> float:
        if op.kind in ("gemm", "attention") and not op.name.startswith(("output", "embedding")):
            return op.total_flop / QUIET.peak_flop_per_s["bf16"]
        return 0.0

    def collective_seconds(self, kind: object, size_bytes: float, group: object) -> float:
        return 0.0

    def provenance(self, op: Op) -> str:
        return "stub"

    def collective_provenance(self, kind: object, size_bytes: float, group: object) -> str:
        return "stub"


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_scaling_efficiency_is_the_1f1b_closed_form(pp: int) -> None:
    sc = scenario(pp=pp, layers=8, gbs=64, mbs=1)  # 8 GPUs: dp 8 / pp, m = 64 / dp microbatches a rank
    counts = [1, 2, 4]
    projs = scaling_table(sc, counts, LayerFlopsOnly())
    m = 64 // (8 // pp)
    for n, p, row in zip(counts, projs, scaling_rows(projs), strict=True):
        assert p.n_microbatches * n == m and p.world_size == 8 * n
        assert row["scaling_efficiency"] == pytest.approx((m + pp - 1) / (m + n * (pp - 1)), rel=1e-9)
    t = projs[0].step_time_s / (m + pp - 1)  # one slot: a stage's forward and backward
    assert t > 0 and projs[-1].step_time_s == pytest.approx((m // 4 + pp - 1) * t, rel=1e-9)
