"""Measured on DGX-H100: Megatron-Bridge's published performance table (benchmarks/accuracy_bridge.py; each row a
ConfigContainer YAML in benchmarks/bridge_runs/perf_*.yaml, written from the recipe that produced it and read by
projection's Megatron-Bridge loader), projected with the shipped calibration and held to issue 6's per-case limit.
Validation only: nothing is fitted to these rows. The rows are in the repository, so this runs without ../shared."""

from __future__ import annotations

import pytest

from tests.oracle.bench_modules import case_error

LIMIT = 0.20  # issue 6: no case beyond 20 %


def _error(prefix: str) -> float:
    return case_error("accuracy_bridge", prefix)


@pytest.mark.parametrize("prefix", ["B1", "B2", "B3"])
def test_dense_llama_rows(prefix: str) -> None:
    """Llama3-8B Megatron-FSDP on 8 (-8.7 %), Llama3-70B tp4 pp8 vp5 on 64 (-2.3 %), Llama3.1-405B tp8 pp8 cp2 vp8
    on 1024 (+0.4 %), FP8 current scaling, as measured 2026-12-02 (+0.8 / +12.6 % before the TP-overlapped GEMMs were
    priced as the pieces TE's userbuffers split them into, perf/tp_overlap.py)."""
    assert abs(_error(prefix)) <= LIMIT


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-30: Qwen3-30B-A3B FP8 on 16 H100 (pp 2, vp 24, ep 8, 128 experts of 768, top 8, MBS 2, "
    "table 25.11), projected 16,042 tokens/s/GPU (8.17 s per step) against 5,275 published (24.8 s): +204.1 %. "
    "The projected step is 2.6 s attention, 1.6 s grouped GEMMs, 1.5 s dense GEMMs, 1.6 s memory-bound work, "
    "0.4 s exposed all-to-all; the published 121 TFLOP/s/GPU is 6 % of the fp8 peak. The dense rows of the same "
    "table are within 12 %, and the MoE rows of every source are projected fast (Qwen3-235B +30.7 % here, "
    "Mixtral-8x7B on MI325X +52.7 %): per-layer MoE work the projection does not price (host time and syncs of "
    "the dispatcher, permutation kernels, small grouped GEMMs) is the candidate; nothing here measures it"))
def test_qwen3_30b_a3b() -> None:
    assert abs(_error("B4")) <= LIMIT


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-30: Qwen3-235B-A22B FP8 on 256 H100 (tp 2, pp 8, vp 4, ep 32, alltoall dispatcher, table "
    "26.02), projected 2,134 tokens/s/GPU (61.4 s per step) against 1,633 published: +30.7 %; see the 30B row"))
def test_qwen3_235b_a22b() -> None:
    assert abs(_error("B5")) <= LIMIT
