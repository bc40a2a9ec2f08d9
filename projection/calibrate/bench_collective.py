"""Collective microbenchmark with torch.distributed: `world_size` local processes (torch.multiprocessing, spawn)
join a process group over TCP on 127.0.0.1 (gloo on the CPU, nccl on GPUs: RCCL in ROCm builds) and time each
(kind, size) like nccl-tests: warm-up, then `repeat` timed calls, each ended by a barrier-free synchronisation of
the device; a row's time is the median over repetitions of the slowest rank's time.

Sizes follow the nccl-tests convention of the calibration tables: all_reduce and broadcast move a buffer of `size`
bytes, all_gather gathers size / n from each rank into size bytes, reduce_scatter reduces a size-byte input into
size / n per rank, all_to_all sends size / n to every rank, send_recv sends size bytes from rank 0 to rank 1.
"""

from __future__ import annotations

import re
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from projection.calibrate.bench_common import Progress, device_name
from projection.calibrate.calibration import CollectiveRow
from projection.calibrate.cli_checks import backend_problems
from projection.calibrate.errors import CalibrationError
from projection.cost.collectives import COLLECTIVE_KINDS, CollectiveKind
from projection.errors import Problem

SUPPORTED: tuple[CollectiveKind, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                         "send_recv")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runner(kind: str, size: int, n: int, rank: int, device: torch.device) -> Any:
    """A zero-argument function running one collective of `size` bytes (fp32 elements) on this rank."""
    elems = max(size // 4 // n * n, n)  # a multiple of n fp32 elements
    full = torch.ones(elems, device=device)
    part = torch.ones(elems // n, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.10
        return lambda: gather(full, part)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.10
        return lambda: scatter(part, full)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    if kind == "send_recv":
        if rank == 0:
            return lambda: dist.send(full, dst=1)
        if rank == 1:
            return lambda: dist.recv(full, src=0)
        return lambda: None
    raise ValueError(kind)


def _worker(rank: int, world: int, port: int, backend: str, device_type: str, cases: list[tuple[str, int]],
            warmup: int, repeat: int, queue: Any) -> None:
    device = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        times: list[list[float]] = []
        for kind, size in cases:
            fn = _runner(kind, size, world, rank, device)
            for _ in range(warmup):
                fn()
            samples = []
            for _ in range(repeat):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                samples.append(time.perf_counter() - t0)
            slowest = torch.tensor(samples, dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times.append(slowest.cpu().tolist())
        if rank == 0:
            queue.put(times)
    finally:
        dist.destroy_process_group()


def bench_collectives(kinds: Sequence[str], sizes: Sequence[int], device: torch.device, *, world_size: int = 2,
                      backend: str | None = None, warmup: int = 3, repeat: int = 10,
                      progress: Progress | None = None) -> tuple[CollectiveRow, ...]:
    """Spawn `world_size` processes and time every (kind, size); one CollectiveRow each (1 node)."""
    unknown = [k for k in kinds if k not in SUPPORTED]
    if unknown:
        raise CalibrationError(Problem(f"cannot benchmark {', '.join(unknown)}", key="--kinds",
                                       fix=f"choose from {', '.join(SUPPORTED)}"))
    if world_size < 2:
        raise CalibrationError(Problem("a collective needs at least 2 ranks", key="--world-size", fix="use 2 or more"))
    if device.type == "cuda" and world_size > torch.cuda.device_count():
        raise CalibrationError(Problem(f"--world-size {world_size} but {torch.cuda.device_count()} GPUs are visible",
                                       key="--world-size", fix="use at most one rank per GPU"))
    unavailable = backend_problems(backend, device.type)
    if unavailable:
        raise CalibrationError(unavailable)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    cases = [(k, int(s)) for k in kinds for s in sizes]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    try:
        mp.start_processes(_worker, args=(world_size, free_port(), backend, device.type, cases, warmup, repeat,
                                          queue), nprocs=world_size, join=True, start_method="spawn")
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:  # a rank failed: its last line only
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        last = next((line for line in reversed(lines) if re.match(r"[\w.]+(Error|Exception): ", line)),
                    lines[-1] if lines else "")
        raise CalibrationError(Problem(f"rank {err.error_index} of the {backend} benchmark failed: {last.strip()}",
                                       key="--backend", fix="use --backend gloo with --device cpu (nccl on GPUs), "
                                       "fewer --world-size ranks or smaller --sizes")) from None
    times = queue.get()
    where = f"{world_size} x {device_name(device)}, {backend}"
    rows = []
    for (kind, size), samples in zip(cases, times, strict=True):
        t = statistics.median(samples)
        elems = max(size // 4 // world_size * world_size, world_size)
        rows.append(CollectiveRow(kind=_kind(kind), n_ranks=world_size, n_nodes=1, size_bytes=elems * 4, time_s=t,
                                  dtype="fp32", count=repeat, device=device_name(device),
                                  source=f"R: projection calibrate collective on {where}, median over {repeat} of the "
                                  "slowest rank"))
        if progress is not None:
            progress.step(f"{kind} {size} B")
    return tuple(rows)


def _kind(name: str) -> CollectiveKind:
    assert name in COLLECTIVE_KINDS, name
    return next(k for k in COLLECTIVE_KINDS if k == name)
