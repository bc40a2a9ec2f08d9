"""Memory-bound microbenchmark: an elementwise add c = a + b over buffers of a given total size (bytes read +
written, the size convention of the calibration's memory_bound rows), timed like the other microbenchmarks. It
stands for the norms, activations, residual adds and casts the cost model prices by bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from projection.calibrate.bench_common import TORCH_DTYPES, Progress, device_name, time_call
from projection.calibrate.calibration import MemoryBoundRow

DEFAULT_CPU_SIZES = tuple(2**k for k in range(12, 27, 2))  # 4 KiB .. 64 MiB
DEFAULT_GPU_SIZES = tuple(2**k for k in range(16, 33, 2))  # 64 KiB .. 4 GiB


def bench_memory(sizes: Iterable[int], device: torch.device, *, dtype: str = "bf16", warmup: int = 3,
                 repeat: int = 10, progress: Progress | None = None) -> tuple[MemoryBoundRow, ...]:
    """One row per size: c = a + b with a, b, c of size / 3 bytes each."""
    dt = TORCH_DTYPES.get(dtype, torch.bfloat16)
    elem = torch.empty((), dtype=dt).element_size()
    where = device_name(device)
    rows = []
    for size in sizes:
        n = max(int(size) // (3 * elem), 1)
        a, b = torch.randn(n, device=device).to(dt), torch.randn(n, device=device).to(dt)
        c = torch.empty_like(a)

        def add(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> torch.Tensor:
            return torch.add(a, b, out=c)

        t = time_call(add, device, warmup, repeat)
        rows.append(MemoryBoundRow(op="add", size_bytes=3 * n * elem, time_s=t, dtype=dtype, count=repeat,
                                   source=f"R: projection calibrate memory on {where}, median of {repeat} after "
                                   f"{warmup} warm-up"))
        if progress is not None:
            progress.step(f"{3 * n * elem} B")
    return tuple(rows)
