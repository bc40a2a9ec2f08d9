"""Host time of Megatron-Core's GPT layer on a GPU host: the number the Megatron functional tests' gap turns on.

Run on a lent GPU (benchmarks/device_check.py runs it when megatron-core is importable; the device image lacks it,
so carry its wheel: benchmarks/README.md, "On a lent GPU"):
    python3 benchmarks/gpu_megatron_host.py --out OUT/megatron_host_gpu.json [--hardware h200]
Dry run on a CPU (tiny shapes only, fp32):
    python3 benchmarks/gpu_megatron_host.py --device cpu --rounds 2 --out /tmp/megatron_host_cpu.json

Why: the small Megatron functional-test models (12 layers x hidden 512) are host-bound on a DGX H100: about 4.2 ms
per layer and microbatch measured, 2.35 ms priced (docs/performance.md). The price is the device YAML's host time
per kernel (an eager HF trace) times the framework host factor measured on this development machine's CPU
(bench_megatron_host.py), i.e. host time carried across two machines. Here the same Megatron-Core layer runs where
its kernels really launch, so its host time needs no transfer.

What: Megatron-Core's GPTModel, local spec (the functional tests' `--transformer-impl local` cases; Transformer Engine
is not on the device image), one process, at two shapes:
* `functional`: the tests' own, fp16, hidden 512, 8 heads, FFN 2048, sequence 1024, micro batch 4;
* `tiny`: hidden 64, 4 heads, FFN 256, sequence 16, micro batch 1, where the GPU's share is negligible.
Each at 1 and 3 layers; per layer = (t3 - t1) / 2, so the embedding and output layer cancel. Per call: the host
time of the forward call and of the backward call (the Python calls return once every kernel is queued; nothing in
the local path synchronises) and the wall time of both with the device drained (the step as the GPU sees it). The
two depths take turns for `--rounds` rounds of `--per-round` calls; each keeps its lowest round median.
Output: per layer and microbatch, host forward / backward and wall seconds; host seconds per modelled kernel (the
kernels projection's op list issues for that layer, bench_megatron_host.modelled_kernels) and its ratio to the
`--hardware` YAML's `host_kernel_issue_s`, i.e. the framework host factor measured on the GPU host itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

SHAPES = {"functional": {"hidden": 512, "heads": 8, "ffn": 2048, "seq": 1024, "mbs": 4, "vocab": 50304},
          "tiny": {"hidden": 64, "heads": 4, "ffn": 256, "seq": 16, "mbs": 1, "vocab": 128}}


def setup(device: str) -> Any:
    """torch and Megatron-Core's parallel state for one process on `device` (the CPU through
    bench_megatron_host's bypasses)."""
    if device == "cpu":
        from bench_megatron_host import setup_megatron_cpu

        return setup_megatron_cpu()
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1234)
    return torch


def model_step(torch: Any, device: str, shape: dict[str, int], layers: int,
               dtype: Any) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """(forward, backward) of a GPTModel of `layers` local-spec layers at `shape`."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    half = dtype == torch.float16
    cfg = TransformerConfig(num_layers=layers, hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
                            ffn_hidden_size=shape["ffn"], hidden_dropout=0.0, attention_dropout=0.0,
                            params_dtype=dtype, fp16=half, gradient_accumulation_fusion=False,
                            use_cpu_initialization=device == "cpu")
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=shape["vocab"],
                     max_sequence_length=shape["seq"])
    model = model.to(device=device, dtype=dtype)
    ids = torch.randint(0, shape["vocab"], (shape["mbs"], shape["seq"]), device=device)
    pos = torch.arange(shape["seq"], device=device).unsqueeze(0).expand(shape["mbs"], -1)
    mask = torch.triu(torch.ones(shape["seq"], shape["seq"], device=device), diagonal=1).bool()[None, None]
    return (lambda: model(ids, pos, mask)), (lambda out: out.float().sum().backward())


def timed(torch: Any, device: str, fwd: Callable[[], Any], bwd: Callable[[Any], None],
          n: int) -> tuple[float, float, float]:
    """Median host seconds of the forward call and the backward call, and median wall seconds of both with the
    device drained, over n calls."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    f_s, b_s, w_s = [], [], []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        out = fwd()
        t1 = time.perf_counter()
        bwd(out)
        t2 = time.perf_counter()
        sync()
        t3 = time.perf_counter()
        f_s.append(t1 - t0)
        b_s.append(t2 - t1)
        w_s.append(t3 - t0)
    return statistics.median(f_s), statistics.median(b_s), statistics.median(w_s)


def measure(device: str, rounds: int, per_round: int, hardware: str) -> dict[str, Any]:
    torch = setup(device)
    from bench_megatron_host import modelled_kernels

    from projection.specs.hardware import load_device

    kf, kb = (a - b for a, b in zip(modelled_kernels(3), modelled_kernels(1), strict=True))
    kf, kb = kf / 2, kb / 2
    issue_s = load_device(hardware).host_kernel_issue_s
    shapes = ["tiny"] if device == "cpu" else ["tiny", "functional"]
    results: dict[str, Any] = {}
    for name in shapes:
        dtype = torch.float16 if name == "functional" else torch.float32
        runs = {n: model_step(torch, device, SHAPES[name], n, dtype) for n in (1, 3)}
        for fwd, bwd in runs.values():  # warm-up
            timed(torch, device, fwd, bwd, 5)
        best = {n: (float("inf"),) * 3 for n in runs}
        for _ in range(rounds):
            for n, (fwd, bwd) in runs.items():
                got = timed(torch, device, fwd, bwd, per_round)
                best[n] = tuple(min(a, b) for a, b in zip(best[n], got, strict=True))
        f, b, w = ((best[3][i] - best[1][i]) / 2 for i in range(3))
        results[name] = {
            "shape": SHAPES[name], "dtype": str(dtype).removeprefix("torch."),
            "layer_host_forward_s": f, "layer_host_backward_s": b, "layer_wall_s": w,
            "host_s_per_modelled_kernel": {"forward": f / kf, "backward": b / kb},
            "factor_vs_device_yaml": {"forward": round(f / kf / issue_s, 3), "backward": round(b / kb / issue_s, 3)},
            "per_depth_s": {str(n): list(best[n]) for n in runs}}
    import megatron.core

    return {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "hardware_yaml": hardware,
            "host_kernel_issue_s": issue_s, "modelled_kernels_per_layer": {"forward": kf, "backward": kb},
            "shapes": results,
            "provenance": {"command": "python3 benchmarks/gpu_megatron_host.py " + " ".join(sys.argv[1:]),
                           "date": datetime.date.today().isoformat(),
                           "host": platform.processor() or platform.machine(), "python": platform.python_version(),
                           "torch": torch.__version__, "megatron_core": megatron.core.__version__,
                           "rounds": rounds, "calls_per_round": per_round}}


def report(result: dict[str, Any]) -> str:
    lines = [f"Megatron-Core GPT layer (local spec) on {result['device']}: per layer and microbatch"]
    for name, r in result["shapes"].items():
        k = r["factor_vs_device_yaml"]
        lines.append(f"  {name:<10} host {r['layer_host_forward_s'] * 1e3:.3f} ms forward + "
                     f"{r['layer_host_backward_s'] * 1e3:.3f} ms backward, wall {r['layer_wall_s'] * 1e3:.3f} ms; "
                     f"per modelled kernel {k['forward']:.2f} / {k['backward']:.2f} x the "
                     f"{result['hardware_yaml']} YAML's {result['host_kernel_issue_s'] * 1e6:.1f} us")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description="Megatron-Core layer host time on a GPU host.")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--hardware", default="h200", help="device YAML whose host_kernel_issue_s the result is set "
                    "against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--out", type=Path, help="write the result as JSON")
    args = ap.parse_args()
    if args.rounds < 1 or args.per_round < 1:
        print("error: --rounds and --per-round must be at least 1", file=sys.stderr)
        return 2
    try:
        result = measure(args.device, args.rounds, args.per_round, args.hardware)
    except ImportError as err:
        print(f"needs megatron-core ({err}): pip install megatron-core, or carry its wheel to the device",
              file=sys.stderr)
        return 2
    print(report(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
