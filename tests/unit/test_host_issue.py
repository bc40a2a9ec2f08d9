"""Host issue time: the trace rule (projection/calibrate/import_host.py) on a hand-built trace, the live benchmark
(`projection calibrate host`), and which figure the performance model takes (calibration over device YAML)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from projection import cli_calibrate
from projection.calibrate import cli_bench
from projection.calibrate.calibration import Calibration, HostRow
from projection.calibrate.import_host import host_issue
from projection.cost.calibrated import CalibratedCostModel
from projection.perf import default_cost_model, project
from projection.perf.costmodel import host_issue as perf_host_issue
from tests.unit.test_perf_core import H100, scenario


def ev(name: str, ts: float, tid: int = 1, cat: str = "cuda_runtime") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": 2.0, "pid": 7, "tid": tid}


def test_trace_rule_keeps_only_uninterrupted_issue_intervals() -> None:
    """Thread 1 launches at 0, 10, 20 us, blocks (a stream sync) at 25, launches at 40 and 50, then at 70 after
    thread 2 (the autograd thread) launched at 60 and 62. Kept: 0-10, 10-20, 40-50 on thread 1 and 60-62 on thread
    2 (20-40 holds a block, 50-70 another thread's launches): 32 us over 4 intervals."""
    trace = {"traceEvents": [ev("cudaLaunchKernel", 0), ev("cudaLaunchKernel", 10), ev("cudaLaunchKernelExC", 20),
                             ev("cudaStreamSynchronize", 25), ev("cudaLaunchKernel", 40), ev("cuLaunchKernel", 50),
                             ev("cudaLaunchKernel", 60, tid=2), ev("cudaLaunchKernel", 62, tid=2),
                             ev("cudaLaunchKernel", 70), ev("aten::add", 5, cat="cpu_op")]}
    row = host_issue(trace, "t.json")
    assert row is not None and row.kernels == 4 and row.host_s == pytest.approx(8e-6)
    assert host_issue({"traceEvents": [ev("hipLaunchKernel", 0)]}, "t.json") is None


def calibrate(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    cli_calibrate.add_parser(parser.add_subparsers(dest="command"), hooks=(cli_bench.register,))
    return cli_calibrate.run(parser.parse_args(["calibrate", *argv]))


def test_calibrate_host_writes_a_host_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert calibrate("host", "--device", "cpu", "--warmup", "1", "--repeat", "3", "--quiet") == 0
    cal = json.loads(capsys.readouterr().out)
    (row,) = cal["host"]
    assert row["kernels"] == 512 * 3 and 0 < row["host_s"] < 1e-3 and row["device"].startswith("CPU")
    assert Calibration.model_validate(cal).host_kernel_issue_s() == row["host_s"]


def test_the_calibration_host_figure_wins_over_the_device_yaml() -> None:
    sc = scenario(hidden=256, layers=2, device=H100, gbs=8)
    plain = default_cost_model(sc)
    assert perf_host_issue(sc, plain) == (H100.host_kernel_issue_s, "device h100-sxm")
    measured = Calibration(host=(HostRow(host_s=2e-4, kernels=10), HostRow(host_s=5e-4, kernels=30)))
    cm = CalibratedCostModel(measured, plain.fallback if hasattr(plain, "fallback") else None, name="mine.json")
    assert perf_host_issue(sc, cm) == (pytest.approx(4.25e-4), "calibration mine.json")
    slow, fast = project(sc, cm), project(sc, plain)
    assert slow.priced.host_kernel_issue_s == pytest.approx(4.25e-4) and slow.step_time_s > fast.step_time_s
    assert slow.to_dict()["host_issue_source"] == "calibration mine.json"
    assert "host issue per kernel: 425.0 us (calibration mine.json)" in slow.to_table()
