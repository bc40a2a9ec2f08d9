"""Cross-check of how host (CPU) time measured on this machine transfers to a GPU host: the same module calls timed
here and published for GPU hosts.

Run: pip install megatron-core   (for the Megatron-Core module; not a dependency of projection)
     python3 benchmarks/host_transfer_check.py [--rounds 9] [--calls 2000]

projection prices a GPU host's time per kernel from a profiled trace (31.6 us per kernel on the H100's host, the
device YAML's `host_kernel_issue_s`), and Megatron's extra host work from a ratio measured on this machine
(benchmarks/bench_megatron_host.py). That is right only if a GPU host is slower than this machine by about the same
scale for every kind of host work. Three scales are compared here, each = GPU-host time / this machine's time:

* trace: the device YAML's 31.6 us per kernel / the reference layer's host time per kernel on this machine under
  the trace's profiler settings (`reference_s_per_kernel` of calibrations/framework_host.json);
* torch.nn.Linear forward: 13.48 us per call on a DGX H100 (Intel Xeon Platinum 8480C), BF16, hidden 2048, 8192
  tokens, no profiler: NVIDIA/TransformerEngine issue #2053 (Marks101, 2025-08-11), "CPU runtime" = wall time of a
  loop of unsynchronised forward calls / calls;
* Megatron-Core ColumnParallelLinear forward: 74 us per call, BF16, TP 1, on an NVIDIA developer's GPU host (its
  CPU is not stated): NVIDIA/TransformerEngine PR #1191 (timmoon10, 2024-09-18), which also gives 140 us for
  TEColumnParallelLinear (115 us after that PR).
Here both modules run the same way (a loop of forward calls, input requiring grad, no profiler) at a tiny fp32 shape
on the CPU, so the time is host work. Nothing is written or fitted; docs/performance.md reports the output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "benchmarks") not in sys.path:
    sys.path.insert(0, str(REPO / "benchmarks"))
def _trace_host_s() -> float:
    """The device YAML's host time per kernel (h100-sxm: 31.6 us, from the TraceLens trace)."""
    from projection.specs.hardware import load_device

    return load_device("h100-sxm").host_kernel_issue_s or 0.0
PUBLISHED = {  # seconds per forward call on a GPU host
    "torch.nn.Linear": (13.48e-6, "TransformerEngine issue #2053, DGX H100 (Xeon 8480C)"),
    "ColumnParallelLinear": (74e-6, "TransformerEngine PR #1191, GPU host not stated"),
}
HIDDEN, TOKENS = 64, 16


def _per_call(fn: Any, calls: int, rounds: int) -> float:
    """Seconds per call: the lowest round of `calls` back-to-back calls (the least disturbed round)."""
    for _ in range(max(100, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def measure(calls: int, rounds: int) -> dict[str, float]:
    from bench_megatron_host import setup_megatron_cpu

    torch = setup_megatron_cpu()
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=4, use_cpu_initialization=True,
                            params_dtype=torch.float32, gradient_accumulation_fusion=False)
    col = ColumnParallelLinear(HIDDEN, HIDDEN, config=cfg, init_method=torch.nn.init.xavier_normal_, bias=True,
                               gather_output=False)
    lin = torch.nn.Linear(HIDDEN, HIDDEN)
    x2 = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    x3 = torch.randn(TOKENS, 1, HIDDEN, requires_grad=True)  # Megatron's [sequence, batch, hidden]
    out = {"torch.nn.Linear": _per_call(lambda: lin(x2), calls, rounds),
           "ColumnParallelLinear": _per_call(lambda: col(x3), calls, rounds)}
    with contextlib.suppress(Exception):
        torch.distributed.destroy_process_group()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description="Host-time transfer from this CPU to a GPU host, three ways.")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    if args.calls < 1 or args.rounds < 1:
        print("error: --calls and --rounds must be >= 1", file=sys.stderr)
        return 2
    try:
        here = measure(args.calls, args.rounds)
    except ImportError as err:
        print(f"needs megatron-core ({err}); pip install megatron-core", file=sys.stderr)
        return 2
    ref = json.loads((REPO / "calibrations" / "framework_host.json").read_text())["measured"]["reference_s_per_kernel"]
    print(f"{'host work':<44} {'GPU host':>10} {'here':>9} {'scale':>6}  source")
    trace_s = _trace_host_s()
    print(f"{'eager kernel (trace / reference layer)':<44} {trace_s * 1e6:>8.2f}us {ref * 1e6:>7.2f}us "
          f"{trace_s / ref:>6.2f}  device YAML trace; calibrations/framework_host.json")
    for name, (gpu_s, source) in PUBLISHED.items():
        print(f"{name + ' forward':<44} {gpu_s * 1e6:>8.2f}us {here[name] * 1e6:>7.2f}us {gpu_s / here[name]:>6.2f}  "
              f"{source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
