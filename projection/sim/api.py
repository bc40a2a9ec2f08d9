"""Pipeline simulation for notebooks and the CLI: one entry point over both engines, and a quick what-if.

    from projection.sim.api import simulate, what_if
    res = what_if("interleaved_1f1b", pp=8, n_microbatches=32, vpp=2, fwd_s=0.060, bwd_s=0.120, p2p_s=0.001)
    res.step_time_s, res.bubble_ratio, res.busy_s, res.critical_path[:5]
"""

from __future__ import annotations

import math
from typing import Literal

from projection.errors import ConfigError, Problem
from projection.schedule.action import Schedule
from projection.schedule.registry import build_schedule
from projection.sim.costs import StageCosts
from projection.sim.dag import walk
from projection.sim.des import Links, simulate_events
from projection.sim.p2p_walk import megatron_walk
from projection.sim.result import SimResult

Engine = Literal["dag", "des", "megatron"]


def simulate(schedule: Schedule, costs: StageCosts, *, engine: Engine = "dag", links: Links = "none") -> SimResult:
    """Simulate `schedule` priced by `costs`. engine="dag": exact walk (p2p as latency, the default); "des": event
    loop with separate compute/comm streams and `links` ("none", "pair", "nic") shared by transfers; "megatron":
    Megatron-LM's blocking p2p calls around 1F1B or interleaved 1F1B without overlap (sim/p2p_walk.py)."""
    if engine in ("dag", "megatron"):
        if links != "none":
            raise ConfigError(Problem(f"the exact walk has no link model (links={links!r})", key="links",
                                      fix='use engine="des" for shared links, or links="none"'))
        return walk(schedule, costs) if engine == "dag" else megatron_walk(schedule, costs)
    if engine == "des":
        return simulate_events(schedule, costs, links=links)
    raise ConfigError(Problem(f"unknown engine {engine!r}", key="engine", fix='use "dag", "des" or "megatron"'))


def rank_costs(schedule: Schedule, fwd_s: float, bwd_s: float, w_s: float | None = None,
               p2p_s: float = 0.0) -> StageCosts:
    """Uniform costs from per-rank seconds per microbatch: a rank's F, full backward and its W part are split evenly
    over the virtual stages a microbatch visits on it (so changing vpp keeps the model's work fixed; DualPipe's
    microbatches visit one of each rank's two stages); p2p seconds per boundary."""
    for key, value in (("fwd_s", fwd_s), ("bwd_s", bwd_s), ("w_s", w_s), ("p2p_s", p2p_s)):
        if value is not None and not 0.0 <= value < math.inf:
            raise ConfigError(Problem(f"{value!r} is not a duration", key=key, fix="give finite seconds >= 0"))
    w = 0.5 * bwd_s if w_s is None else w_s
    if w > bwd_s:
        raise ConfigError(Problem(f"the weight-gradient part {w} s exceeds the backward {bwd_s} s", key="w_s",
                                  fix="w_s is the W share of bwd_s (B = I + W)"))
    per = len(schedule.route(0)) / schedule.n_ranks
    return StageCosts.uniform(schedule.n_stages, fwd_s / per, bwd_s / per, w / per, p2p_s)


def what_if(name: str, pp: int, n_microbatches: int, vpp: int = 1, *, fwd_s: float = 1.0, bwd_s: float = 2.0,
            w_s: float | None = None, p2p_s: float = 0.0, engine: Engine = "dag",
            microbatch_group_size: int | None = None) -> SimResult:
    """Build schedule `name` and simulate it with per-rank seconds per microbatch (see rank_costs)."""
    try:
        sched = build_schedule(name, pp, n_microbatches, vpp, microbatch_group_size=microbatch_group_size)
    except ValueError as e:
        raise ConfigError(Problem(str(e), key="schedule", fix="pick pp, vpp and microbatches the schedule accepts"
                                  )) from e
    return simulate(sched, rank_costs(sched, fwd_s, bwd_s, w_s, p2p_s), engine=engine)
