"""Checks of the `projection calibrate ...` flags, run before any file is read or any benchmark starts.

Each check returns the Problems it finds (naming the flag as the key, and the fix) rather than raising, so that a
command reports every bad flag at once: the caller gathers them and raises one ConfigError (exit code 2 in the CLI,
nothing written). Kept free of torch at import time: `calibrate import` and `calibrate fit` use it too.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

from projection.cli_args import output_problems
from projection.errors import COMMAND_LINE, ConfigError, Problem
from projection.units import parse_bytes

# flag attribute -> (smallest accepted value, why), for the numeric flags of the calibrate sub-commands
_MINIMUM = {
    "warmup": (0, "the untimed calls before timing cannot be negative"),
    "repeat": (1, "at least 1 timed call is needed (the median of the timed calls is kept)"),
    "max_shapes": (1, "at least 1 shape is needed"),
    "nodes": (1, "at least 1 node is needed"),
    "gpus_per_node": (1, "at least 1 GPU per node is needed"),
    "world_size": (2, "a collective needs at least 2 processes (ranks)"),
}


# Upper limits, physically meaningful. One benchmark buffer (--sizes) larger than 1 TiB exceeds the memory of any
# accelerator (the largest hold 288 GB: MI355X, B300) and of most hosts; torch cannot even index one past 2**63 bytes.
MAX_SIZE_BYTES = 2**40
# A --shape dimension: cublasGemmEx and rocblas_gemm_ex take `int` m, n, k (at most 2**31 - 1), and one operand of
# more than 2**38 elements (1 TiB in fp32) fits no accelerator's memory.
MAX_DIMENSION = 2**31 - 1
MAX_OPERAND_ELEMENTS = 2**38


def number_problems(args: argparse.Namespace) -> list[Problem]:
    """Every numeric flag given to this sub-command below its minimum (_MINIMUM), and every --shape whose dimensions
    or operands are past the limits above."""
    problems = shape_limit_problems(getattr(args, "shape", None) or [], getattr(args, "calibrate_name", None))
    for attr, (minimum, why) in _MINIMUM.items():
        value = getattr(args, attr, None)
        if value is not None and value < minimum:
            flag = "--" + attr.replace("_", "-")
            problems.append(Problem(f"got {value}: {why}", key=flag, file=COMMAND_LINE,
                                    fix=f"give {flag} {minimum} or more" + (" (or leave it out)"
                                                                           if attr != "repeat" else "")))
    return problems


def shape_limit_problems(shapes: Sequence[str], command: str | None) -> list[Problem]:
    """--shape values (gemm MxNxK[:...], attention BxHxKVxDxS[xSKV]) with a dimension past MAX_DIMENSION or an
    operand past MAX_OPERAND_ELEMENTS. Shapes that do not parse are left to the shape parser (cli_bench)."""
    problems = []
    fix = (f"give dimensions up to {MAX_DIMENSION} whose operands hold at most 2**38 elements (1 TiB in fp32, more "
           "than any accelerator's memory)")
    for text in shapes:
        parts = text.split(":")[0].lower().split("x")
        if not all(p.isascii() and p.isdigit() for p in parts) or len(parts) < 3:
            continue
        dims = [int(p) for p in parts]
        big = [d for d in dims if d > MAX_DIMENSION]
        if big:
            problems.append(Problem(f"shape {text!r}: dimension {big[0]} is past {MAX_DIMENSION}, the largest `int` "
                                    "dimension of the BLAS interfaces (cublasGemmEx, rocblas_gemm_ex)", key="--shape",
                                    file=COMMAND_LINE, fix=fix))
            continue
        if command == "attention" and len(dims) >= 5:  # Q [B, H, S, D] and K/V [B, KV, SKV, D]
            b, h, kv, d, s = dims[:5]
            operands = [b * h * s * d, b * kv * (dims[5] if len(dims) > 5 else s) * d]
        else:  # A [M, K], B [K, N], D [M, N]
            m, n, k = dims[:3]
            operands = [m * k, k * n, m * n]
        if max(operands) > MAX_OPERAND_ELEMENTS:
            problems.append(Problem(f"shape {text!r}: an operand of {max(operands):.3g} elements, more than 2**38 "
                                    "(1 TiB in fp32) fits no accelerator's memory", key="--shape", file=COMMAND_LINE,
                                    fix=fix))
    return problems


def parse_sizes(text: str | None, key: str = "--sizes") -> tuple[list[int], list[Problem]]:
    """Comma-separated byte sizes ('4096,1MiB') -> (sizes, problems); every size must be a byte count from 1 to
    MAX_SIZE_BYTES (1 TiB)."""
    if text is None:
        return [], []
    sizes: list[int] = []
    problems: list[Problem] = []
    fix = "write positive sizes up to 1TiB like 4096,1MiB,64MB"
    for item in text.split(","):
        try:
            value = parse_bytes(item.strip())
        except ValueError as err:
            problems.append(Problem(str(err), key=key, file=COMMAND_LINE, fix=fix))
            continue
        if not math.isfinite(value) or value > MAX_SIZE_BYTES:
            problems.append(Problem(f"size {item.strip()!r} is past 1 TiB ({MAX_SIZE_BYTES} bytes): no accelerator "
                                    "holds such a buffer (the largest hold 288 GB)", key=key, file=COMMAND_LINE,
                                    fix=fix))
            continue
        size = int(value)
        if size < 1:
            problems.append(Problem(f"size {item.strip()!r} is {size} bytes: must be at least 1 byte", key=key,
                                    file=COMMAND_LINE, fix=fix))
        else:
            sizes.append(size)
    return sizes, problems


def dtype_problems(dtype: str | None, allowed: Sequence[str], key: str = "--dtype") -> list[Problem]:
    if dtype is None or dtype in allowed:
        return []
    return [Problem(f"dtype {dtype!r} cannot be benchmarked", key=key, file=COMMAND_LINE,
                    fix=f"use one of {', '.join(allowed)}")]


def out_problems(out: str | None, key: str = "--out") -> list[Problem]:
    """A path given to --out that cannot be written (projection/cli_args.output_problems)."""
    return output_problems([(key, out)])


def backend_problems(backend: str | None, device_type: str) -> list[Problem]:
    """A torch.distributed backend this PyTorch build or this device cannot run (checked before spawning ranks)."""
    import torch.distributed as dist

    if not dist.is_available():
        return [Problem("this PyTorch build has no torch.distributed", key="--backend", file=COMMAND_LINE,
                        fix="install a PyTorch build with distributed support")]
    chosen = backend or ("nccl" if device_type == "cuda" else "gloo")
    key = "--backend" if backend else "--device"
    if chosen == "nccl" and not dist.is_nccl_available():
        return [Problem("this PyTorch build has no NCCL / RCCL built in (torch.distributed.is_nccl_available() is "
                        "False)", key=key, file=COMMAND_LINE, fix="use --backend gloo on the CPU, or install a CUDA / "
                        "ROCm build of PyTorch to benchmark nccl on GPUs")]
    if chosen == "nccl" and device_type != "cuda":
        return [Problem("nccl runs collectives on GPU tensors only, not on the CPU", key=key, file=COMMAND_LINE,
                        fix="use --backend gloo with --device cpu (or --device cuda for nccl)")]
    if chosen == "gloo" and not dist.is_gloo_available():
        return [Problem("this PyTorch build has no gloo backend (torch.distributed.is_gloo_available() is False)",
                        key=key, file=COMMAND_LINE, fix="use --backend nccl with --device cuda, or install a "
                        "PyTorch build with gloo")]
    return []


def raise_all(problems: list[Problem]) -> None:
    """One ConfigError listing every problem (none: return)."""
    if problems:
        raise ConfigError(problems)
