"""Session guard: in CI (CI=true, as .ci/run is run there) the shared fixtures must be beside the clone. Every oracle
that reads `../shared/fixtures` skips without it, which is right on a user's clone and wrong in CI, where a missing
folder would turn the oracles into silent skips and the run green."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI", "").lower() == "true" and not SHARED_FIXTURES.is_dir():
        raise pytest.UsageError(f"CI=true but {SHARED_FIXTURES} is missing: the oracles that read it would all skip; "
                                "run CI with shared/ beside the clone (as ../shared/tools/ci-fresh does)")
