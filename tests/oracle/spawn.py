"""Run a function in `world` spawned processes (torch.multiprocessing) with a wall-clock limit: the tests that train
or pipeline across gloo processes on the CPU share it. A run past the limit kills the processes and fails the test."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from projection.calibrate.bench_collective import free_port

__all__ = ["free_port", "require_gloo", "run_spawned"]


def run_spawned(fn: Callable[..., Any], args: tuple[Any, ...], world: int, limit_s: float, what: str) -> None:
    """fn(rank, *args) in `world` processes; pytest.fail naming `what` when they do not finish in limit_s."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + limit_s
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{what} with {world} processes did not finish in {limit_s} s")


def require_gloo() -> None:
    """Skip the calling test module, saying which is missing, unless torch.distributed has its gloo backend."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)
