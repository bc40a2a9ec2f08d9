"""Speed of the pipeline engines: exact walk (actions/s), event loop (events/s), and the large-case target.

Run: python3 benchmarks/bench_sim.py [--repeat N]
Targets (DESIGN.md §4, issue 4): exact walk >= 500,000 actions/s; event loop >= 200,000 events/s; 64 pipeline
ranks x vpp 2 (128 virtual stages) x 1024 microbatches simulated in under 0.5 s. Prints the best of N runs, with and
without compiling the schedule to integer lists (a sweep over costs compiles once). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from projection.schedule.registry import build_schedule  # noqa: E402
from projection.sim import closed_form  # noqa: E402
from projection.sim.costs import StageCosts, grad_sync_tasks  # noqa: E402
from projection.sim.dag import compile_schedule, walk  # noqa: E402
from projection.sim.des import simulate_events  # noqa: E402


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    pp, vpp, m = 64, 2, 1024
    t_build, sched = best(lambda: build_schedule("interleaved_1f1b", pp, m, vpp), 1)
    n = sum(len(a) for a in sched.actions)
    costs = StageCosts.uniform(sched.n_stages, 0.010, 0.020, 0.010, 0.0002)
    t_compile, cs = best(lambda: compile_schedule(sched), args.repeat)
    t_walk, res = best(lambda: walk(cs, costs), args.repeat)
    t_total, _ = best(lambda: walk(sched, costs), args.repeat)
    print(f"schedule interleaved_1f1b pp={pp} vpp={vpp} m={m}: {n:,} actions, built in {t_build:.2f} s")
    print(f"exact walk     compile {t_compile:.3f} s + walk {t_walk:.3f} s = {t_total:.3f} s end to end "
          f"(target < 0.5 s): {n / t_total:,.0f} actions/s end to end, {n / t_walk:,.0f} actions/s walking "
          f"(target >= 500,000); step {res.step_time_s:.4f} s")
    for links in ("none", "nic"):
        t_des, ev = best(lambda links=links: simulate_events(cs, costs, links=links), args.repeat)
        print(f"event loop     links={links}: {ev.run.events:,} events in {t_des:.3f} s = "
              f"{ev.run.events / t_des:,.0f} events/s (target >= 200,000); step {ev.step_time_s:.4f} s")
    tasks = costs.with_comm_tasks(grad_sync_tasks(sched, [0.05] * sched.n_stages))
    t_des, ev = best(lambda: simulate_events(cs, tasks, links="nic"), args.repeat)
    print(f"event loop     links=nic + {len(tasks.comm_tasks)} DP reduce-scatters: {ev.run.events:,} events in "
          f"{t_des:.3f} s = {ev.run.events / t_des:,.0f} events/s")
    z = build_schedule("zbv", pp, m, 2)
    zc = compile_schedule(z)
    zcosts = StageCosts.uniform(z.n_stages, 0.010, 0.020, 0.010, 0.0002)
    t_z, zr = best(lambda: walk(zc, zcosts), args.repeat)
    nz = sum(len(a) for a in z.actions)
    print(f"exact walk     zbv pp={pp} m={m} (F, I, W): {nz:,} actions in {t_z:.3f} s = {nz / t_z:,.0f} actions/s")
    grid_p, grid_m = np.meshgrid(np.arange(2, 65), np.arange(1, 4097))
    t_cf, _ = best(lambda: closed_form.step_time_s("1f1b", grid_p, grid_m, 0.01, 0.02, p2p_s=0.0002), args.repeat)
    print(f"closed form    1f1b over {grid_p.size:,} (pp, m) points in {t_cf * 1e3:.1f} ms = "
          f"{grid_p.size / t_cf:,.0f} points/s")


if __name__ == "__main__":
    main()
