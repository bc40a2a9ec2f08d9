"""The prepared GPU session script (benchmarks/device_check.py) runs end to end as a CPU dry run, so a session that
is lent a device does not spend its minutes on a broken script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timing  # the Megatron host times are differences of timed depths: noise beside other tests' load
def test_device_check_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import device_check
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    monkeypatch.setattr(sys, "argv", ["device_check.py", "--out", str(tmp_path), "--device", "cpu", "--small"])
    monkeypatch.setattr(device_check, "STEPS", 2)
    assert device_check.main() == 0
    record = json.loads((tmp_path / "device_check.json").read_text())
    assert record["projected_s"] > 0 and len(record["measured_steps_s"]) == 2 and record["device"] == "cpu"
    cal = json.loads((tmp_path / "calibration.json").read_text())
    assert all(cal[table] for table in ("host", "gemm", "attention", "memory_bound"))
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        return
    host = json.loads((tmp_path / "megatron_host_gpu.json").read_text())  # the Megatron host-time check ran too
    tiny = host["shapes"]["tiny"]
    assert tiny["layer_host_forward_s"] > 0 and tiny["layer_host_backward_s"] > 0 and host["device"] == "cpu"
