"""benchmarks/bench_load.py runs over every bundled preset (it stopped at GPT-3, whose 2048-token context the
scenario's 4096-token sequence exceeded, once such sequences were refused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_load_prints_a_row_per_preset() -> None:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_load.py"), "--repeat", "1"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    presets = sorted(p.stem for p in (REPO / "models").glob("*.yaml"))
    rows = [line.split()[0] for line in out.stdout.splitlines()[1:]]
    assert rows == presets
