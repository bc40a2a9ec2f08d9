"""`projection calibrate gemm | attention | collective | memory | host`: microbenchmarks that write a Calibration JSON.

    projection calibrate gemm [--config F] [--shape MxNxK[:LAYOUT[:DTYPE]] ...] [--device auto|cuda|cpu] [--out FILE]
    projection calibrate attention [--config F] [--shape BxHxKVxDxS[xSKV] ...] [--device ...] [--out FILE]
    projection calibrate collective [--config F] [--kinds all_reduce,...] [--sizes 1MiB,...] [--world-size N] ...
    projection calibrate memory [--config F] [--sizes 4096,1MiB,...] [--dtype bf16] [--device ...] [--out FILE]
    projection calibrate host [--device auto|cuda|cpu] [--out FILE]

By default the shapes are those `projection shapes --config F` lists (largest FLOPs first, --max-shapes of them), else a
small default sweep. Registered into the `calibrate` group through `register` (projection/cli_calibrate.py hooks).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, cast

import torch

from projection import api
from projection.calibrate.bench_attention import AttentionShape, bench_attention
from projection.calibrate.bench_collective import SUPPORTED, bench_collectives
from projection.calibrate.bench_common import TORCH_DTYPES, Progress, pick_device, provenance
from projection.calibrate.bench_gemm import GemmShape, bench_gemms
from projection.calibrate.bench_host import bench_host
from projection.calibrate.bench_memory import (
    DEFAULT_CPU_SIZES,
    DEFAULT_GPU_SIZES,
    KernelShape,
    bench_kernels,
    bench_memory,
)
from projection.calibrate.calibration import Calibration, Layout
from projection.calibrate.cli_checks import (
    backend_problems,
    dtype_problems,
    number_problems,
    out_problems,
    parse_sizes,
    raise_all,
)
from projection.calibrate.errors import CalibrationError
from projection.errors import COMMAND_LINE, ConfigError, Problem
from projection.workload.shapes import ShapeRow, step_shapes

_LAYOUTS = ("NN", "NT", "TN", "TT")


def register(calibrate_subparsers: Any) -> None:
    """Add the gemm, attention, collective, memory and host sub-commands to the `calibrate` group."""
    for name, helptext, run in (
            ("gemm", "time GEMMs and grouped GEMMs (BLAS m, n, k, layout) with PyTorch", _run_gemm),
            ("attention", "time scaled-dot-product attention forward and backward with PyTorch", _run_attention),
            ("collective", "time collectives over local processes with torch.distributed", _run_collective),
            ("memory", "time an elementwise add over a range of sizes, and the job's norms, activations, loss and "
             "softmax at its shapes (with --config)", _run_memory),
            ("host", "time the host's issue of one eager PyTorch kernel (the framework-overhead constant)", _run_host)):
        p = calibrate_subparsers.add_parser(name, help=helptext, description=helptext)
        if name != "host":  # the host figure does not depend on a job's shapes
            p.add_argument("--config", help="benchmark the shapes of this job (any supported config file)")
            p.add_argument("--hardware", help="device of the job's cluster (for --config)")
            p.add_argument("--nodes", type=int, help="nodes of the job's cluster (for --config)")
            p.add_argument("--gpus-per-node", type=int)
            p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
            p.add_argument("--primus-root")
        p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
        p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
        p.add_argument("--repeat", type=int, default=10, help="timed calls (the median is kept)")
        p.add_argument("--out", metavar="FILE.json", help="write the calibration here (default: stdout)")
        p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
        if name in ("collective", "memory"):
            p.add_argument("--sizes", help="comma-separated sizes (collectives: nccl-tests convention; memory: bytes "
                           "read + written): 4096,1MiB,...")
        if name == "memory":
            p.add_argument("--dtype", help="element type of the buffers (default: the job's dtype with --config, "
                           "bf16 without)")
        elif name == "collective":
            p.add_argument("--kinds", help=f"comma-separated, from {', '.join(SUPPORTED)}")
            p.add_argument("--world-size", type=int, help="processes (default 2 on the CPU, every visible GPU)")
            p.add_argument("--backend", choices=("gloo", "nccl"), help="default gloo on the CPU, nccl on GPUs")
        elif name in ("gemm", "attention"):
            p.add_argument("--shape", action="append", default=[], help="MxNxK[:LAYOUT[:DTYPE]] (gemm) or "
                           "BxHxKVxDxS[xSKV] (attention), repeatable; overrides --config")
            p.add_argument("--dtype", help="benchmark every shape in this dtype (e.g. fp32 on a CPU)")
            p.add_argument("--max-shapes", type=int, default=64, help="at most this many shapes, largest first")
        p.set_defaults(calibrate_run=run, calibrate_name=name)


def _command(args: argparse.Namespace) -> str:
    skip = {"command", "calibrate_command", "calibrate_run", "calibrate_name", "quiet"}
    parts = [f"projection calibrate {args.calibrate_name}"]
    for key, value in vars(args).items():
        if key in skip or value is None or value is False or value == []:  # 0 (--warmup 0) is a value
            continue
        flag = "--" + key.replace("_", "-")
        values = value if isinstance(value, list) else [value]
        parts += [f"{flag} {v}" if v is not True else flag for v in values]
    return " ".join(parts)


def _config_rows(args: argparse.Namespace) -> tuple[ShapeRow, ...]:
    if not args.config:
        return ()
    sc = api.load(args.config, hardware=args.hardware, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                  overrides=args.set, primus_root=args.primus_root)
    return step_shapes(sc)


def _write(cal: Calibration, args: argparse.Namespace) -> int:
    if args.out:
        cal.save(args.out)
        counts = ", ".join(f"{n} {name}" for name, n in cal.row_counts().items() if n)
        print(f"wrote {args.out}: {counts} on {cal.provenance[0].device_name}")
    else:
        sys.stdout.write(cal.to_json())
    return 0


def _progress(args: argparse.Namespace, total: int) -> Progress | None:
    return None if args.quiet else Progress(total, f"calibrate {args.calibrate_name}")


_GEMM_FORM = "MxNxK[:LAYOUT[:DTYPE]], e.g. 4096x8192x4096:TN:bf16"
_ATTENTION_FORM = "BxHxKVxDxS[xSKV], e.g. 1x32x8x128x8192"
_GEMM_DTYPES = (*TORCH_DTYPES, "fp8")


def _bad_shape(text: str, form: str, why: str = "") -> Problem:
    return Problem(f"cannot read shape {text!r}" + (f": {why}" if why else ""), key="--shape", file=COMMAND_LINE,
                   fix=f"write it as {form}, each dimension a positive integer")


def _dims(text: str, counts: tuple[int, ...], form: str) -> tuple[list[int] | None, list[Problem]]:
    dims = text.lower().split("x")
    if len(dims) not in counts or not all(d.isascii() and d.isdigit() for d in dims):
        return None, [_bad_shape(text, form)]
    zero = [i for i, d in enumerate(dims) if int(d) < 1]
    if zero:
        return None, [_bad_shape(text, form, f"dimension {zero[0] + 1} is 0")]
    return [int(d) for d in dims], []


def parse_gemm_shape(text: str) -> tuple[GemmShape | None, list[Problem]]:
    """One --shape MxNxK[:LAYOUT[:DTYPE]] of `calibrate gemm` -> (shape, problems)."""
    parts = text.split(":")
    dims, problems = _dims(parts[0], (3,), _GEMM_FORM)
    layout = parts[1].upper() if len(parts) > 1 else "TN"
    dtype = parts[2] if len(parts) > 2 else "bf16"
    if len(parts) > 3:
        problems.append(_bad_shape(text, _GEMM_FORM, "too many ':' fields"))
    elif layout not in _LAYOUTS:
        problems.append(_bad_shape(text, _GEMM_FORM, f"LAYOUT {parts[1]!r} is not one of {', '.join(_LAYOUTS)}"))
    problems += dtype_problems(dtype, _GEMM_DTYPES, key="--shape")
    if problems or dims is None:
        return None, problems
    return GemmShape(dims[0], dims[1], dims[2], dtype, cast(Layout, layout)), []


def parse_attention_shape(text: str) -> tuple[AttentionShape | None, list[Problem]]:
    """One --shape BxHxKVxDxS[xSKV] of `calibrate attention` -> (shape, problems); KV heads must divide heads."""
    dims, problems = _dims(text, (5, 6), _ATTENTION_FORM)
    if dims is None:
        return None, problems
    b, h, kv, d, s = dims[:5]
    if h % kv:
        return None, [Problem(f"shape {text!r}: {kv} KV heads do not divide {h} heads", key="--shape",
                              file=COMMAND_LINE,
                              fix=f"give KV heads that divide the heads (each KV head serves H/KV query heads), "
                                  f"e.g. {b}x{h}x{h}x{d}x{s} or {b}x{h}x1x{d}x{s}")]
    return AttentionShape(b, h, kv, d, s, dims[5] if len(dims) == 6 else s), []


def check_args(args: argparse.Namespace) -> torch.device:
    """Every flag of a benchmark sub-command checked before anything runs: one ConfigError listing all the bad ones
    (exit code 2, nothing written). Returns the device to benchmark on."""
    name = args.calibrate_name
    problems = number_problems(args)
    if name in ("gemm", "attention"):
        parse = parse_gemm_shape if name == "gemm" else parse_attention_shape
        for text in args.shape:
            problems += parse(text)[1]
        problems += dtype_problems(args.dtype, _GEMM_DTYPES if name == "gemm" else tuple(TORCH_DTYPES))
    if name == "memory":
        problems += dtype_problems(args.dtype, tuple(TORCH_DTYPES))
    if name in ("collective", "memory"):
        problems += parse_sizes(args.sizes)[1]
    if name == "collective" and args.kinds is not None:
        unknown = [k for k in args.kinds.split(",") if k not in SUPPORTED]
        if unknown:
            problems.append(Problem(f"cannot benchmark {', '.join(repr(k) for k in unknown)}", key="--kinds",
                                    file=COMMAND_LINE, fix=f"choose from {', '.join(SUPPORTED)}, comma-separated"))
    problems += out_problems(args.out)
    device: torch.device | None = None
    try:
        device = pick_device(args.device)
    except CalibrationError as err:
        problems += err.problems
    if name == "collective" and device is not None:
        problems += backend_problems(args.backend, device.type)
        gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        if device.type == "cuda" and args.world_size is None and gpus < 2:
            problems.append(Problem(f"{gpus} GPU visible: a collective needs 2 ranks, one per GPU",
                                    key="--world-size", file=COMMAND_LINE,
                                    fix="use --device cpu --backend gloo, or a machine with 2 "
                                    "or more GPUs"))
    raise_all(problems)
    assert device is not None
    return device


def _explicit(args: argparse.Namespace, parse: Any) -> list[Any]:
    parsed = [parse(text) for text in args.shape]
    raise_all([p for _, problems in parsed for p in problems])
    return [shape for shape, _ in parsed]


def _no_shapes(args: argparse.Namespace, what: str) -> ConfigError:
    return ConfigError(Problem(f"the job has no {what} shapes to benchmark", key="--config", file=args.config,
                               fix="give the shapes with --shape, or a config whose job has them"))


def gemm_shapes(args: argparse.Namespace) -> list[GemmShape]:
    """Explicit --shape values, else the job's GEMM and grouped-GEMM shapes, else a default cube sweep."""
    shapes: list[GemmShape] = _explicit(args, parse_gemm_shape)
    if not shapes:
        rows = [r for r in _config_rows(args) if r.kind in ("gemm", "grouped_gemm")]
        rows.sort(key=lambda r: -r.flop_per_step)
        shapes = [GemmShape(r.m, r.n, r.k, r.dtype, cast(Layout, r.layout), r.batch if r.kind == "gemm" else 1,
                            r.batch if r.kind == "grouped_gemm" else 1) for r in rows]
    if not shapes and not args.config:
        shapes = [GemmShape(n, n, n) for n in (256, 512, 1024, 2048)]
    if not shapes:
        raise _no_shapes(args, "GEMM")
    if args.dtype:
        shapes = [GemmShape(s.m, s.n, s.k, args.dtype, s.layout, s.batch, s.groups) for s in shapes]
    shapes = list(dict.fromkeys(shapes))
    if args.shape:  # "at most this many shapes, largest first" (a job's are ordered by their FLOPs a step already)
        shapes.sort(key=lambda s: -(s.m * s.n * s.k * s.batch * s.groups))
    return shapes[: max(args.max_shapes, 1)]


def attention_shapes(args: argparse.Namespace) -> list[AttentionShape]:
    shapes: list[AttentionShape] = _explicit(args, parse_attention_shape)
    if not shapes:
        rows = [r for r in _config_rows(args) if r.kind == "attention" and r.phase == "F" and r.k == r.head_dim_v]
        rows.sort(key=lambda r: -r.flop_per_step)
        shapes = [AttentionShape(r.batch, r.heads, r.kv_heads, r.k, r.m, r.n, r.causal, r.dtype) for r in rows]
    if not shapes and not args.config:
        shapes = [AttentionShape(1, 8, 8, 64, s, s) for s in (256, 512, 1024)]
    if not shapes:
        raise _no_shapes(args, "attention (shapes whose value head dim differs from the query's, MLA, are skipped)")
    if args.dtype:
        shapes = [AttentionShape(s.batch, s.heads, s.kv_heads, s.head_dim, s.seq_q, s.seq_kv, s.causal, args.dtype)
                  for s in shapes]
    shapes = list(dict.fromkeys(shapes))
    if args.shape:
        shapes.sort(key=lambda s: -(s.batch * s.heads * s.seq_q * s.seq_kv * s.head_dim))
    return shapes[: max(args.max_shapes, 1)]


def _run_gemm(args: argparse.Namespace) -> int:
    device = check_args(args)
    shapes = gemm_shapes(args)
    if device.type != "cuda" and any(s.dtype == "fp8" for s in shapes):  # before any shape runs (bench_gemm agrees)
        raise ConfigError(Problem(f"fp8 GEMMs need a GPU (torch._scaled_mm); this run is on {device.type}",
                                  key="--dtype" if args.dtype else "--shape", file=COMMAND_LINE,
                                  fix="benchmark fp8 on a GPU, or give the shapes another dtype (e.g. :TN:bf16)"))
    gemms, grouped = bench_gemms(shapes, device, warmup=args.warmup, repeat=args.repeat,
                                 progress=_progress(args, len(shapes)))
    return _write(Calibration(provenance=(provenance(device, _command(args)),), gemm=gemms, grouped_gemm=grouped),
                  args)


def _run_attention(args: argparse.Namespace) -> int:
    device = check_args(args)
    shapes = attention_shapes(args)
    rows = bench_attention(shapes, device, warmup=args.warmup, repeat=args.repeat,
                           progress=_progress(args, len(shapes)))
    return _write(Calibration(provenance=(provenance(device, _command(args)),), attention=rows), args)


def _run_collective(args: argparse.Namespace) -> int:
    device = check_args(args)
    rows = [r for r in _config_rows(args) if r.kind == "collective"]
    kinds = args.kinds.split(",") if args.kinds else sorted({r.collective for r in rows if r.collective in SUPPORTED})
    kinds = kinds or ["all_reduce", "all_gather", "reduce_scatter"]
    sizes = _sizes(args) or sorted({r.size_bytes for r in rows if r.size_bytes > 0})
    if not sizes:
        sizes = [2**k for k in range(12, 21, 2)] if device.type == "cpu" else [2**k for k in range(20, 29, 2)]
    world = args.world_size or (torch.cuda.device_count() if device.type == "cuda" else 2)
    _collective_memory_check(kinds, sizes, world, device, "--sizes" if args.sizes else "--config")
    cal_rows = bench_collectives(kinds, sizes, device, world_size=world, backend=args.backend, warmup=args.warmup,
                                 repeat=args.repeat, progress=_progress(args, len(kinds) * len(sizes)))
    return _write(Calibration(provenance=(provenance(device, _command(args)),), collective=cal_rows), args)


def _collective_memory_check(kinds: list[str], sizes: list[int], world: int, device: torch.device,
                             key: str) -> None:
    """CalibrationError before any process starts when the largest size does not fit: each rank holds the buffer and
    its 1/world part, and all_to_all an output as large as the buffer (bench_collective._runner); all ranks share
    the host's RAM on a CPU, each has its own GPU on CUDA (its total memory: no CUDA context is opened here). A rank
    killed for memory would say nothing useful. Too many ranks for the GPUs is bench_collectives' own check."""
    if device.type == "cuda" and world > torch.cuda.device_count():
        return
    largest = max(sizes)
    factor = 1 + 1 / world + (1 if "all_to_all" in kinds else 0)
    per_rank = largest * factor
    if device.type == "cuda":
        free = float(min(torch.cuda.get_device_properties(i).total_memory for i in range(world)))
        need, where, share = per_rank, f"the memory of one GPU ({free / 2**30:.1f} GiB)", 1
    else:
        free = _available_ram_bytes()
        need, where, share = world * per_rank, f"the host's available RAM ({free / 2**30:.1f} GiB)", world
    if free and need > 0.9 * free:
        raise CalibrationError(Problem(
            f"the largest collective, {largest / 2**30:.2f} GiB, needs about {need / 2**30:.1f} GiB over {world} "
            f"ranks, more than {where}", key=key, file=COMMAND_LINE,
            fix=f"give --sizes up to {0.9 * free / share / factor:.3g} bytes (e.g. --sizes 1MiB,16MiB,256MiB); the "
                "curve fit extrapolates larger messages"))


def _available_ram_bytes() -> float:
    """MemAvailable of /proc/meminfo (Linux), else the physical memory, else 0 (unknown: not checked)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def _sizes(args: argparse.Namespace) -> list[int]:
    sizes, problems = parse_sizes(args.sizes)
    raise_all(problems)
    return sizes


def kernel_shapes(args: argparse.Namespace) -> list[KernelShape]:
    """The job's named memory-bound kernels (`projection shapes` rows of kind memory_bound), largest first."""
    rows = sorted((r for r in _config_rows(args) if r.kind == "memory_bound" and r.op), key=lambda r: -r.size_bytes)
    return list(dict.fromkeys(KernelShape(r.op, r.m, r.n, args.dtype or r.dtype, r.size_bytes) for r in rows))


def _job_dtype(args: argparse.Namespace) -> str | None:
    """The dtype most of a --config job's memory-bound bytes move in (the add curve prices its unnamed memory-bound
    ops whatever their dtype, so it is measured in theirs: an fp32 job's in fp32; an audit found a bf16 add 3.3x
    slower per byte than fp32 on a CPU)."""
    by: dict[str, float] = {}
    for r in _config_rows(args):
        if r.kind == "memory_bound" and r.dtype:
            by[r.dtype] = by.get(r.dtype, 0.0) + r.size_bytes
    return max(by, key=lambda d: by[d]) if by else None


def _run_memory(args: argparse.Namespace) -> int:
    device = check_args(args)
    sizes = _sizes(args) or list(DEFAULT_CPU_SIZES if device.type == "cpu" else DEFAULT_GPU_SIZES)
    kernels = kernel_shapes(args)
    progress = _progress(args, len(sizes) + len(kernels))
    rows = bench_memory(sizes, device, dtype=args.dtype or _job_dtype(args) or "bf16", warmup=args.warmup,
                        repeat=args.repeat, progress=progress)
    rows += bench_kernels(kernels, device, warmup=args.warmup, repeat=args.repeat, progress=progress)
    return _write(Calibration(provenance=(provenance(device, _command(args)),), memory_bound=rows), args)


def _run_host(args: argparse.Namespace) -> int:
    device = check_args(args)
    row = bench_host(device, warmup=args.warmup, repeat=args.repeat, progress=_progress(args, 1))
    return _write(Calibration(provenance=(provenance(device, _command(args)),), host=(row,)), args)
