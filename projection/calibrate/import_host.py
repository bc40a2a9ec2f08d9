"""Host seconds per kernel launch from a PyTorch profiler (Kineto) trace: the framework-overhead constant of
projection/perf (`HostRow`, `host_kernel_issue_s` of a device YAML), measured in the user's own training step.

Definition. On each host thread that launches kernels (`cudaLaunchKernel`, `cudaLaunchKernelExC`, `cuLaunchKernel`,
`hipLaunchKernel`, `hipExtModuleLaunchKernel`, ...), the time from one launch to the next is host time spent issuing
the next kernel (Python, dispatcher, framework code, the launch call), unless the host was not issuing in between:
- it blocked on the device (a `*Synchronize` call, or a synchronous copy: `cudaMemcpy`, `hipMemcpy`,
  `hipMemcpyWithStream`, which is how `.item()` / `.cpu()` wait on ROCm); or
- another thread launched in between (PyTorch runs the backward pass on its autograd thread while the main thread
  waits inside `backward()`: that wait is not issuing time).
host seconds per kernel = the sum of the kept intervals / their number. On a trace issued without interruption this
is (last launch - first launch) / (launches - 1), the figure hardware_specs/h100-sxm.yaml and mi300x.yaml state for
the TraceLens Qwen traces (tests/oracle/test_importers.py checks both). Events without a readable time are left out
(import_common.trace_events); a figure over the schema's hour per launch (HostRow) is no figure (None).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from projection.calibrate.calibration import HostRow
from projection.calibrate.import_common import build_row, thread_of, trace_events

LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                      "cudaLaunchCooperativeKernel", "hipLaunchKernel", "hipExtModuleLaunchKernel",
                      "hipModuleLaunchKernel", "hipExtLaunchKernel", "hipLaunchCooperativeKernel"})
BLOCKING = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                      "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy",
                      "hipMemcpyWithStream"})
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver"})


def host_issue(trace: dict[str, Any], file: str, device: str | None = None) -> HostRow | None:
    """The trace's host seconds per kernel launch (module docstring), or None with fewer than two launches on a
    thread without a block or another thread's launch between them."""
    launches: dict[Any, list[float]] = defaultdict(list)
    blocks: dict[Any, list[float]] = defaultdict(list)
    for e in trace_events(trace):  # objects with a finite ts (import_trace notes the others)
        if e.get("cat") not in _RUNTIME_CATS:
            continue
        name = e.get("name", "")
        if name in LAUNCHES:
            launches[thread_of(e)].append(float(e["ts"]))
        elif name in BLOCKING:
            blocks[thread_of(e)].append(float(e["ts"]))
    every = sorted((ts, thread) for thread, stamps in launches.items() for ts in stamps)
    times = [ts for ts, _ in every]
    total_us, kept = 0.0, 0
    for thread, stamps in launches.items():
        stamps.sort()
        own_blocks = sorted(blocks.get(thread, []))
        for a, b in zip(stamps, stamps[1:], strict=False):
            if _any_in(own_blocks, a, b) or _other_thread_between(times, every, a, b, thread):
                continue
            total_us += b - a
            kept += 1
    if kept == 0:
        return None
    threads = sum(1 for s in launches.values() if len(s) > 1)
    # None when the figure is impossible (over the schema's hour per launch: timestamps that are not microseconds)
    row, _ = build_row(HostRow, {"host_s": total_us / kept * 1e-6, "kernels": kept, "device": device,
                                 "source": f"{file}: {kept} launch-to-launch intervals over {total_us / 1e3:.2f} ms "
                                           f"of host time on {threads} thread(s), without a block or another "
                                           "thread's launch between them"})
    return row


def _any_in(sorted_ts: list[float], a: float, b: float) -> bool:
    """A timestamp in [a, b)."""
    i = bisect.bisect_left(sorted_ts, a)
    return i < len(sorted_ts) and sorted_ts[i] < b


def _other_thread_between(times: list[float], every: list[tuple[float, Any]], a: float, b: float,
                          thread: Any) -> bool:
    """A launch of another thread strictly between a and b (`every` sorted by time, `times` its timestamps)."""
    lo, hi = bisect.bisect_right(times, a), bisect.bisect_left(times, b)
    return any(every[i][1] != thread for i in range(lo, hi))
