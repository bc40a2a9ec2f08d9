"""Measured on AMD GPUs: the projected tokens/s/GPU of the public MI300X and MI325X training logs of
benchmarks/accuracy_amd.py (launch scripts rebuilt from the runs' own scripts and argument dumps, sources in that
module), with the shipped calibrations, held to issue 6's per-case limit of 20 %. Validation only: nothing is fitted
to them. The cases are transcribed in the benchmark module, so this runs without ../shared."""

from __future__ import annotations

import pytest

from tests.oracle.bench_modules import case_error

LIMIT = 0.20  # issue 6: no case beyond 20 %


def _error(prefix: str) -> float:
    return case_error("accuracy_amd", prefix)


@pytest.mark.parametrize("name", ["U4", "U1", "U2"])
def test_mi325x_runs(name: str) -> None:
    """U4 ROCm Megatron-LM 70B FP8 FSDP2 on 64 (-10.3 %), U1 Primus 7B FP8 on 64 (+2.4 %), U2 Primus 70B FP8 FSDP2
    on 16 (-0.5 %), as measured 2026-12-01 (FSDP2's copies priced; before: -9.4 and +0.4 %)."""
    assert abs(_error(name)) <= LIMIT


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-12-01: Mixtral-8x7B BF16 on 64 MI325X with EP 8 (Primus, grouped GEMM, all-to-all dispatcher, "
    "forced load balancing), projected 8,071 tokens/s/GPU (2.03 s per step) against 5,286 measured (3.10 s): "
    "+52.7 % (+52.6 % before small all-reduces below a sweep's sizes were priced by the tuner's algorithms; "
    "+57.8 % before the MI325X intra-node ring efficiency and the probabilities' all-to-all; +55.4 % "
    "before Megatron's unfused permute was priced). The dense runs of the same cluster and stack are within "
    "2.4 %, but they are FP8. An audit of the MoE op list against "
    "Megatron-Core 0.16.1 (docs/performance.md) found its FLOPs, shapes, all-to-all and expert-DP volumes right "
    "and the unmodelled items worth +0.05-0.08 s; the rest (~1 s) most likely sits in the bf16 GEMM rates on "
    "MI325X (priced at the 843 TFLOP/s MAF), which no case checks and no MI325X bf16 GEMM benchmark is published "
    "to calibrate"))
def test_mi325x_mixtral_ep8() -> None:
    assert abs(_error("U3")) <= LIMIT


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-30: Llama-2-7B FP8 on 8 MI300X, projected 16,831 tokens/s/GPU (7.79 s per step) against "
    "12,787 measured (10.25 s): +31.6 %. The projection of the same job in bf16 is 9.37 s, still faster than the "
    "measured fp8 run: the run's FP8 GEMMs (ROCm Transformer Engine 2.1.0.dev0, no GEMM tuning, no flash-attn "
    "package) presumably did not reach the hipBLASLt fp8 rates the mi300x calibration holds; nothing here measures "
    "why"))
def test_mi300x_7b_fp8() -> None:
    assert abs(_error("M1")) <= LIMIT
