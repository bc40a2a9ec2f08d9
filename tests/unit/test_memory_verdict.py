"""The verdict's three bands at their edges (memory/report.py `verdict`): out of memory only when the allocated peak
exceeds HBM; at risk when the reserved peak leaves less than 5 % of HBM, or exceeds it while the allocated peak
still fits (the caching allocator frees its cached blocks and retries before it fails: the reserved figure, an
estimate of fragmentation, is a risk, not a certainty); fits otherwise. The headroom is HBM less the reserved peak,
negative when it exceeds HBM (a memory audit found no test at the boundary where the reserved peak passes HBM)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from projection import api
from projection.memory.report import verdict

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"


@pytest.mark.parametrize(("peak_of_cap", "reserved_of_cap", "expected"), [
    (0.50, 0.90, "fits"), (0.50, 0.95, "fits"), (0.50, 0.951, "at risk"), (0.90, 1.03, "at risk"),
    (1.0, 1.10, "at risk"), (1.001, 1.10, "out of memory"), (1.001, 1.001, "out of memory")])
def test_verdict_bands(peak_of_cap: float, reserved_of_cap: float, expected: str) -> None:
    sc = api.load(EXAMPLE)
    report = api.estimate_memory(sc)
    cap = sc.cluster.device.hbm_bytes
    ranks = [replace(r, peak_bytes=int(peak_of_cap * cap), reserved_bytes=int(reserved_of_cap * cap))
             for r in report.ranks]
    got = verdict(sc, ranks)
    assert got.verdict == expected
    assert got.headroom_bytes == cap - int(reserved_of_cap * cap)
    assert (got.headroom_bytes < 0) == (reserved_of_cap > 1.0)
