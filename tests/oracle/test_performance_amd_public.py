"""Measured on AMD GPUs: the projected tokens/s/GPU of the public MI300X and MI325X training logs of
benchmarks/accuracy_amd.py (launch scripts rebuilt from the runs' own scripts and argument dumps, sources in that
module), with the shipped calibrations, held to issue 6's per-case limit of 20 %. Validation only: nothing is fitted
to them. The cases are transcribed in the benchmark module, so this runs without ../shared."""

from __future__ import annotations

import pytest

from tests.oracle.bench_modules import load_benchmark

LIMIT = 0.20  # issue 6: no case beyond 20 %


def _error(name: str) -> float:
    mod = load_benchmark("accuracy_amd")
    (case,) = [c for c in mod.cases() if c.name.startswith(name)]
    (row,) = mod.evaluate([case])
    print(f"\n{case.name} on {case.gpus} x {case.hardware}: measured {case.measured:.1f} tokens/s/GPU, projected "
          f"{row.projected:.1f} ({row.error:+.1%}), step {row.step_time_s:.3f} s ({case.note})")
    return float(row.error)


def test_mi325x_70b_fp8_fsdp2() -> None:
    assert abs(_error("U4")) <= LIMIT


@pytest.mark.xfail(strict=True, reason=(
    "measured 2026-11-30: Llama-2-7B FP8 on 8 MI300X, projected 16,831 tokens/s/GPU (7.79 s per step) against "
    "12,787 measured (10.25 s): +31.6 %. The projection of the same job in bf16 is 9.37 s, still faster than the "
    "measured fp8 run: the run's FP8 GEMMs (ROCm Transformer Engine 2.1.0.dev0, no GEMM tuning, no flash-attn "
    "package) presumably did not reach the hipBLASLt fp8 rates the mi300x calibration holds; nothing here measures "
    "why"))
def test_mi300x_7b_fp8() -> None:
    assert abs(_error("M1")) <= LIMIT
