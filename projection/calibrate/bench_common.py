"""Shared pieces of the microbenchmarks (`projection calibrate gemm | attention | collective`): device choice,
timing with warm-up and repetition, a progress bar on stderr, and the provenance of a measurement.

Timing: on a GPU each repetition is bracketed by device events (torch.cuda.Event, which ROCm builds map to HIP
events) and the median of the repetitions is kept; on the CPU time.perf_counter brackets each call. The median is
robust to the occasional preemption or clock change; `count` in the rows records the repetitions.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

import torch

from projection.calibrate.calibration import Provenance
from projection.calibrate.errors import CalibrationError
from projection.errors import Problem

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}


def pick_device(name: str) -> torch.device:
    """'auto' (a GPU when torch sees one, else the CPU), 'cuda' (ROCm builds also expose 'cuda') or 'cpu'."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise CalibrationError(Problem("--device cuda, but this PyTorch sees no GPU", key="--device",
                                       fix="use --device cpu or auto, or install a CUDA / ROCm build of PyTorch"))
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    cpu = platform.processor() or platform.machine() or "cpu"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"CPU {cpu} ({torch.get_num_threads()} threads)"


def provenance(device: torch.device, command: str, notes: tuple[str, ...] = ()) -> Provenance:
    """Device, library versions, torch version, date and command of a microbenchmark run."""
    libs: dict[str, str] = {"torch": str(torch.__version__)}
    if torch.version.cuda:
        libs["cuda_runtime"] = str(torch.version.cuda)
    if torch.version.hip:
        libs["hip"] = str(torch.version.hip)
    if device.type == "cuda":
        if torch.backends.cudnn.is_available():
            libs["cudnn"] = str(torch.backends.cudnn.version())
        with contextlib.suppress(AttributeError, RuntimeError, TypeError):
            libs["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    driver = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        driver = f"compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs/CUs"
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return Provenance(device_name=device_name(device), driver_version=driver, library_versions=libs,
                      torch_version=str(torch.__version__), date=date, command=command, notes=notes)


_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


@contextlib.contextmanager
def within_memory(what: str, device: torch.device, key: str = "--shape / --config") -> Iterator[None]:
    """Turn the device's out-of-memory error while benchmarking `what` into a CalibrationError (exit 2) that names
    the shape and how to benchmark less."""
    try:
        yield
    except RuntimeError as err:  # torch.OutOfMemoryError is a RuntimeError; the CPU allocator raises a plain one
        if not any(marker in str(err).lower() for marker in _OOM_MARKERS):
            raise
        if device.type == "cuda":
            torch.cuda.empty_cache()
        fix = "give smaller --sizes" if key == "--sizes" else ("benchmark fewer or smaller shapes: --shape, "
                                                                 "--max-shapes, or the job with a smaller micro batch "
                                                                 "(--set training.micro_batch_size=1)")
        raise CalibrationError(Problem(f"{what} does not fit in the memory of {device_name(device)}", key=key,
                                       fix=fix)) from None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, warmup: int, repeat: int,
              setup: Callable[[], object] | None = None) -> float:
    """Median seconds of `fn()` over `repeat` timed calls after `warmup` untimed ones; `setup()` runs untimed
    before each call (e.g. a forward pass whose backward is timed)."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    synchronize(device)
    samples = []
    for _ in range(max(repeat, 1)):
        if setup is not None:
            setup()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class Progress:
    """A one-line progress bar on a stream (stderr by default): [#####.....] 5/10 label."""

    def __init__(self, total: int, title: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.total, self.title, self.width, self.done = max(total, 1), title, width, 0
        self.stream = stream if stream is not None else sys.stderr

    def step(self, label: str) -> None:
        self.done += 1
        filled = self.width * self.done // self.total
        self.stream.write(f"\r{self.title} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                          f"{label[:40]:<40}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()
