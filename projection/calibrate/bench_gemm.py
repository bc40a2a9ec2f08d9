"""GEMM and grouped-GEMM microbenchmarks with PyTorch: time each (m, n, k, batch, dtype, layout) in the BLAS
convention of the calibration tables (projection/calibrate/calibration.py) on the chosen device.

A BLAS product D[m, n] = op(A)[m, k] op(B)[k, n] (column-major) is the row-major product C[n, m] = L[n, k] R[k, m],
the inverse of `blas_from_torch`: L is stored transposed iff transA (layout[1]) is 'T', R iff transB (layout[0]) is
'T'. A forward linear, BLAS "TN" (out, tokens, in), is thus x[tokens, in] @ W[out, in].T, and torch.matmul runs the
same BLAS call the framework's `F.linear` would. FP8 GEMMs use torch._scaled_mm (GPU only,
row-major x column-major operands, unit scales, bf16 output). Grouped GEMMs run torch._grouped_mm when the build and
device provide it, else a batched GEMM of the same per-group shape (an equal-split grouped GEMM).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from projection.calibrate.bench_common import TORCH_DTYPES, Progress, device_name, time_call, within_memory
from projection.calibrate.calibration import GemmRow, GroupedGemmRow, Layout
from projection.calibrate.errors import CalibrationError
from projection.errors import Problem


@dataclass(frozen=True)
class GemmShape:
    """One GEMM to time (BLAS convention); groups > 1 makes it a grouped GEMM of `groups` equal products."""

    m: int
    n: int
    k: int
    dtype: str = "bf16"
    layout: Layout = "TN"
    batch: int = 1
    groups: int = 1

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch * self.groups


def _operand(rows: int, cols: int, transposed: bool, dtype: torch.dtype, device: torch.device,
             batch: int) -> torch.Tensor:
    """A [batch,] rows x cols matrix, stored transposed (column-major) when asked."""
    lead = (batch,) if batch > 1 else ()
    if transposed:
        return torch.randn(*lead, cols, rows, device=device).to(dtype).transpose(-1, -2)
    return torch.randn(*lead, rows, cols, device=device).to(dtype)


def gemm_callable(shape: GemmShape, device: torch.device) -> Callable[[], object]:
    """A zero-argument function running the GEMM once (operands allocated here, outside the timing)."""
    rows, cols, inner = shape.n, shape.m, shape.k  # row-major C[n, m] = L[n, k] @ R[k, m]
    batch = shape.batch * shape.groups
    if shape.dtype == "fp8":
        return _fp8_callable(shape, device)
    if shape.dtype not in TORCH_DTYPES:
        raise CalibrationError(Problem(f"dtype {shape.dtype!r} cannot be benchmarked", key="--dtype",
                                       fix=f"use one of {', '.join(TORCH_DTYPES)} or fp8 (GPU)"))
    dt = TORCH_DTYPES[shape.dtype]
    left = _operand(rows, inner, shape.layout[1] == "T", dt, device, batch)
    right = _operand(inner, cols, shape.layout[0] == "T", dt, device, batch)
    if shape.groups > 1 and device.type == "cuda" and hasattr(torch, "_grouped_mm") and shape.batch == 1:
        offs = torch.arange(1, shape.groups + 1, device=device, dtype=torch.int32) * rows
        flat = left.reshape(-1, inner).contiguous()
        weights = right.transpose(-1, -2).contiguous().transpose(-1, -2)  # per group column-major, as the kernel wants
        try:
            torch._grouped_mm(flat, weights, offs=offs)
            return lambda: torch._grouped_mm(flat, weights, offs=offs)
        except (RuntimeError, TypeError):
            pass  # this build or device has no grouped kernel for the dtype: an equal-split batched GEMM instead
    return lambda: torch.matmul(left, right)


def _fp8_callable(shape: GemmShape, device: torch.device) -> Callable[[], object]:
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm") or shape.batch * shape.groups > 1:
        raise CalibrationError(Problem("fp8 GEMMs need a GPU build of PyTorch with torch._scaled_mm (unbatched)",
                                       key="--dtype", fix="benchmark fp8 on a GPU, or pass --dtype bf16"))
    rows, cols, inner = shape.n, shape.m, shape.k
    last_error: Exception | None = None
    for fp8 in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        try:
            left = torch.randn(rows, inner, device=device).to(fp8)
            right = torch.randn(cols, inner, device=device).to(fp8).t()  # column-major, as _scaled_mm needs
            one = torch.ones((), device=device)
            torch._scaled_mm(left, right, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            return lambda: torch._scaled_mm(left, right, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        except (RuntimeError, TypeError) as err:
            last_error = err
    raise CalibrationError(Problem(f"torch._scaled_mm failed on this device: {last_error}", key="--dtype",
                                   fix="benchmark bf16 instead, or update PyTorch"))


@contextlib.contextmanager
def _tf32(on: bool) -> Iterator[None]:
    """fp32 matmuls on TF32 tensor cores while a tf32 row is timed (torch keeps them in full fp32 by default:
    torch.backends.cuda.matmul.allow_tf32 is False), restored after; a CPU has no TF32 mode and runs fp32."""
    if not on:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def bench_gemms(shapes: Iterable[GemmShape], device: torch.device, *, warmup: int = 5, repeat: int = 20,
                progress: Progress | None = None) -> tuple[tuple[GemmRow, ...], tuple[GroupedGemmRow, ...]]:
    """Time every shape; plain GEMMs become GemmRow, grouped ones GroupedGemmRow (time_s = median of `repeat`)."""
    gemms: list[GemmRow] = []
    grouped: list[GroupedGemmRow] = []
    where = device_name(device)
    for shape in shapes:
        label = f"{shape.m}x{shape.n}x{shape.k} {shape.dtype} {shape.layout}"
        with within_memory(f"the GEMM {label}" + (f" x {shape.groups} groups" if shape.groups > 1 else ""), device), \
                _tf32(shape.dtype == "tf32"):
            t = time_call(gemm_callable(shape, device), device, warmup, repeat)
        source = f"R: projection calibrate gemm on {where}, median of {repeat} after {warmup} warm-up"
        if shape.groups > 1:
            grouped.append(GroupedGemmRow(groups=shape.groups, m=shape.m, n=shape.n, k=shape.k, dtype=shape.dtype,
                                          layout=shape.layout, time_s=t, flop_per_s=shape.flop / t, count=repeat,
                                          source=source))
        else:
            gemms.append(GemmRow(m=shape.m, n=shape.n, k=shape.k, dtype=shape.dtype, layout=shape.layout,
                                 batch=shape.batch, time_s=t, flop_per_s=shape.flop / t, count=repeat,
                                 out_dtype="bf16" if shape.dtype == "fp8" else shape.dtype, source=source))
        if progress is not None:
            progress.step(label)
    return tuple(gemms), tuple(grouped)
