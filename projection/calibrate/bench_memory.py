"""Memory-bound microbenchmarks.

- `bench_memory`: an elementwise add c = a + b over buffers of a given total size (bytes read + written, the size
  convention of the calibration's memory_bound rows). It stands for every memory-bound op the job does not name.
- `bench_kernels`: the named kernels of a job (projection/workload/ops_base.py: norms, activations, cross-entropy,
  softmax) at the job's shapes, forward and backward, run as the PyTorch ops a framework calls (F.layer_norm,
  F.rms_norm, F.gelu / F.silu / ..., act(a) * b for gated units, F.cross_entropy on fp32-upcast logits, softmax).
  Each row is keyed by the kernel (`gelu`, `gelu.bwd`) and stored with the job's byte count for that op, so the cost
  model looks it up on the same axis it prices by. They matter where such kernels are not bandwidth-bound: on a CPU
  an erf or exp per element costs several times the bytes it moves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from projection.calibrate.bench_common import TORCH_DTYPES, Progress, device_name, time_call, within_memory
from projection.calibrate.calibration import MemoryBoundRow
from projection.calibrate.errors import CalibrationError
from projection.errors import Problem
from projection.workload.ops_base import KERNEL_FNS

DEFAULT_CPU_SIZES = tuple(2**k for k in range(12, 27, 2))  # 4 KiB .. 64 MiB
DEFAULT_GPU_SIZES = tuple(2**k for k in range(16, 33, 2))  # 64 KiB .. 4 GiB

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "gelu": F.gelu, "relu": F.relu, "squared_relu": lambda x: torch.square(F.relu(x)),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # OpenAI's approximation (Megatron quick_gelu)
}


@dataclass(frozen=True)
class KernelShape:
    """One named memory-bound kernel: `op` (`gelu`, or `gelu.bwd` for its backward) over rows x width of the output
    (a gated activation reads 2 x width), and the bytes the job's op moves (the calibration row's size)."""

    op: str
    rows: int
    width: int
    dtype: str
    size_bytes: int

    @property
    def fn(self) -> str:
        return self.op.removesuffix(".bwd")


def bench_memory(sizes: Iterable[int], device: torch.device, *, dtype: str = "bf16", warmup: int = 3,
                 repeat: int = 10, progress: Progress | None = None) -> tuple[MemoryBoundRow, ...]:
    """One row per size: c = a + b with a, b, c of size / 3 bytes each."""
    dt = TORCH_DTYPES.get(dtype, torch.bfloat16)
    elem = torch.empty((), dtype=dt).element_size()
    where = device_name(device)
    rows = []
    for size in sizes:
        n = max(int(size) // (3 * elem), 1)
        with within_memory(f"the add over {size} B", device, key="--sizes"):
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


def _forward(shape: KernelShape, device: torch.device) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
    """The kernel's forward as a closure over fresh inputs, and the inputs that take a gradient."""
    if shape.dtype not in TORCH_DTYPES:
        raise CalibrationError(Problem(f"dtype {shape.dtype!r} cannot be benchmarked", key="--dtype",
                                       fix=f"use one of {', '.join(TORCH_DTYPES)}"))
    dt, fn, r, w = TORCH_DTYPES[shape.dtype], shape.fn, shape.rows, shape.width

    def tensor(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device).to(dt).requires_grad_(True)

    if fn in ("layernorm", "rmsnorm"):
        x, weight = tensor(r, w), tensor(w)
        if fn == "layernorm":
            bias = tensor(w)
            return (lambda: F.layer_norm(x, (w,), weight, bias)), [x, weight, bias]
        return (lambda: F.rms_norm(x, (w,), weight)), [x, weight]
    if fn == "cross_entropy":  # Megatron upcasts the logits to fp32 before the loss
        logits = tensor(r, w)
        target = torch.randint(0, w, (r,), device=device)
        return (lambda: F.cross_entropy(logits.float(), target)), [logits]
    if fn == "softmax":
        scores = tensor(r, w)
        return (lambda: torch.softmax(scores, dim=-1)), [scores]
    act = _ACTIVATIONS.get(fn.removesuffix("_glu"))
    if act is None:
        raise CalibrationError(Problem(f"no benchmark for the memory-bound kernel {fn!r}", key="op",
                                       fix=f"kernels with a benchmark: {', '.join(KERNEL_FNS)}"))
    if fn.endswith("_glu"):  # Megatron's gated unit: act(x1) * x2 over the two halves of fc1's output
        x = tensor(r, 2 * w)
        return (lambda: act(x[:, :w]) * x[:, w:]), [x]
    x = tensor(r, w)
    return (lambda: act(x)), [x]


def kernel_callable(shape: KernelShape, device: torch.device) -> tuple[Callable[[], object], Callable[[], object]]:
    """(setup, call): call runs the kernel once; for a backward, setup runs the forward untimed and call its
    backward with a random output gradient."""
    forward, inputs = _forward(shape, device)
    if not shape.op.endswith(".bwd"):
        def run_forward() -> object:
            with torch.no_grad():
                return forward()
        return (lambda: None), run_forward
    out = forward()
    grad = torch.randn_like(out)
    state: dict[str, torch.Tensor] = {}

    def setup() -> None:
        for t in inputs:
            t.grad = None
        state["out"] = forward()

    def backward() -> None:
        state["out"].backward(grad)

    return setup, backward


def bench_kernels(shapes: Iterable[KernelShape], device: torch.device, *, warmup: int = 3, repeat: int = 10,
                  progress: Progress | None = None) -> tuple[MemoryBoundRow, ...]:
    """One row per kernel shape (time_s = median of `repeat` after `warmup`), size_bytes = the job's bytes."""
    where = device_name(device)
    rows = []
    for shape in shapes:
        with within_memory(f"the {shape.op} kernel over [{shape.rows}, {shape.width}]", device):
            setup, call = kernel_callable(shape, device)
            t = time_call(call, device, warmup, repeat, setup=setup)
        rows.append(MemoryBoundRow(op=shape.op, size_bytes=shape.size_bytes, time_s=t, dtype=shape.dtype,
                                   count=repeat, source=f"R: projection calibrate memory on {where}: {shape.fn} over "
                                   f"[{shape.rows}, {shape.width}] {shape.dtype}"
                                   f"{' backward' if shape.op.endswith('.bwd') else ''}, median of {repeat} after "
                                   f"{warmup} warm-up; size = the job's bytes read + written"))
        if progress is not None:
            progress.step(f"{shape.op} {shape.rows}x{shape.width}")
    return tuple(rows)
