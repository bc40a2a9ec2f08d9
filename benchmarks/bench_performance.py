"""Speed of `projection performance` at full scale: Llama-3.1-405B on 16,384 H100 GPUs (2,048 nodes x 8; TP 8 with
sequence parallelism, PP 16, DP 128; sequence 8192, micro batch 1, global batch 2,048 sequences = 16 microbatches per
DP rank; 126 layers as 7 + 14 x 8 + 7 over the 16 stages; distributed optimizer; gradient-reduce, parameter-gather and
TP-communication overlap), projected end to end through the CLI.

Run: python3 benchmarks/bench_performance.py [--repeat 5]
Target (issue 6): under 1 s of CLI wall time (process start, config load, pricing, simulation of 16 pipeline ranks,
memory verdict, table) -- and the CLI must not import torch.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from projection import api  # noqa: E402

CONFIG = """\
# Llama-3.1-405B pretraining on 16,384 H100: TP 8, PP 16, DP 128 (benchmarks/bench_performance.py)
model: llama3.1_405B
training: {seq_length: 8192, micro_batch_size: 1, global_batch_size: 2048}
plan:
  tp: 8
  sp: true
  pp: 16
  first_stage_layers: 7
  last_stage_layers: 7
  sharding: {zero_stage: 1}
  overlap: {grad_reduce: true, param_gather: true, tp_comm: true}
cluster: {hardware: h100-sxm, nodes: 2048, gpus_per_node: 8}
"""
LIMIT_S = 1.0

# `projection performance ...` when cli.py registers the sub-command; else the same module driven directly (what
# cli.main does for it), so the benchmark runs before the wiring lands.
_DIRECT = ("import argparse, os, sys; from projection import cli_performance as c; "
           "p = argparse.ArgumentParser(prog='projection'); c.add_parser(p.add_subparsers(dest='command')); "
           "sys.exit(c.run(p.parse_args(['performance', *sys.argv[1:]]), env=dict(os.environ)))")


def _command(config: Path) -> list[str]:
    from projection import cli

    if "performance" in getattr(cli, "_EXTRA", {}):
        return [sys.executable, "-m", "projection", "performance", "--config", str(config)]
    return [sys.executable, "-c", _DIRECT, "--config", str(config)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from projection.perf import default_cost_model, project

    with tempfile.TemporaryDirectory(prefix="projection-bench-") as tmp:
        config = Path(tmp) / "llama3.1_405B-16k-h100.yaml"
        config.write_text(CONFIG, encoding="utf-8")

        t0 = time.perf_counter()
        sc = api.load(config)
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        proj = project(sc, default_cost_model(sc))
        t_cold = time.perf_counter() - t0
        warm = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            project(sc, default_cost_model(sc))
            warm.append(time.perf_counter() - t0)

        cmd = _command(config)
        walls, out = [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True)
            walls.append(time.perf_counter() - t0)
        torch_probe = subprocess.run(
            [sys.executable, "-c", "import sys; import projection.cli_performance, projection.perf, "
             "projection.report.trace; print('torch' in sys.modules)"], capture_output=True, text=True,
            cwd=REPO).stdout.strip()

    assert out is not None
    wall = statistics.median(walls)
    print(out.stdout.rstrip())
    print()
    print(f"scenario: {sc.model.name}, {sc.world_size:,} x {sc.cluster.device.name} ({sc.cluster.nodes:,} nodes), "
          f"tp {sc.plan.tp} pp {sc.plan.pp} dp {sc.plan.dp_()}, {proj.n_microbatches} microbatches per DP rank, "
          f"{sum(len(a) for a in proj.sim.schedule.actions):,} simulated actions")
    print(f"in-process: load {t_load * 1e3:.0f} ms, project cold {t_cold * 1e3:.0f} ms, warm median "
          f"{statistics.median(warm) * 1e3:.0f} ms (cost model + pricing + simulation + memory)")
    print(f"CLI wall time ({' '.join(cmd[:3]) if cmd[1] == '-m' else 'cli_performance driven directly'}): median "
          f"{wall:.3f} s over {len(walls)} runs (min {min(walls):.3f}, max {max(walls):.3f}); target < {LIMIT_S} s "
          f"-> {'met' if wall < LIMIT_S else 'NOT met'}; torch imported by projection.perf: {torch_probe}")
    return 0 if wall < LIMIT_S else 1


if __name__ == "__main__":
    sys.exit(main())
