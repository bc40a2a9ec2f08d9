"""benchmarks/functional_drift.py transcribes other stored versions of the Megatron functional tests' DGX H100
golden files: every case it names must be one of the scored cases, and every entry must name a commit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.oracle.bench_modules import load_benchmark
from tests.oracle.megatron_cases import MEGATRON, cases

REPO = Path(__file__).resolve().parents[2]


def test_versions_name_scored_cases_and_commits() -> None:
    if not (MEGATRON / "CASES.md").is_file():
        pytest.skip("shared/fixtures/megatron absent (user clone)")
    mod = load_benchmark("functional_drift")
    names = {c.name for c in cases()}
    assert set(mod.VERSIONS) <= names and len(mod.VERSIONS) == len(names)
    for versions in mod.VERSIONS.values():
        assert versions and all(re.fullmatch(r"[0-9a-f]{40}", commit) and median > 0
                                for _repo, commit, median in versions)
