"""`projection calibrate host`: host seconds per kernel launch of eager PyTorch on this machine (`HostRow`), the
framework-overhead constant of projection/perf (a kernel cannot start before the host has issued it).

Method: `ops` out-of-place adds of 1-element tensors, issued back to back without waiting for the device; the host
wall time of the loop divided by `ops` (the device is synchronised before the loop, and after it untimed), the
median of `repeat` loops after `warmup`. On a GPU the adds queue far faster than they run, so the figure is the
host's own issue path (Python call, dispatcher, caching allocator, launch); on the CPU each add also runs (a few
nanoseconds of arithmetic). A framework's modules add Python of their own per kernel: a profiler trace of the
real training step, imported with `projection calibrate import`, measures that (projection/calibrate/import_host.py).
"""

from __future__ import annotations

import statistics
import time

import torch

from projection.calibrate.bench_common import Progress, device_name
from projection.calibrate.calibration import HostRow

DEFAULT_OPS = 512  # well below the launch queue depth of CUDA / HIP (about a thousand pending kernels)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_host(device: torch.device, *, warmup: int = 3, repeat: int = 10, ops: int = DEFAULT_OPS,
               progress: Progress | None = None) -> HostRow:
    """Host seconds per launched add (module docstring)."""
    a = torch.zeros(1, device=device)
    b = torch.ones(1, device=device)
    times = []
    for i in range(warmup + repeat):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(ops):
            torch.add(a, b)
        elapsed = time.perf_counter() - t0
        _sync(device)
        if i >= warmup:
            times.append(elapsed / ops)
    if progress is not None:
        progress.step("host issue")
    return HostRow(host_s=statistics.median(times), kernels=ops * repeat, device=device_name(device),
                   source=f"projection calibrate host: {ops} torch.add of 1-element tensors issued without waiting, "
                          f"median of {repeat} loops")
