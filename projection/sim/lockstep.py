"""Exact walk of a schedule run in lock-step time steps, as torch.distributed.pipelining ran its multi-stage
schedules up to torch 2.9 (`PipelineScheduleMulti._step_microbatches`; ScheduleInterleaved1F1B until 2.10 moved it
to `_PipelineScheduleRuntime`, whose explicit send and receive actions the dependency walk in dag.py models).

Every rank walks the same clock of time steps (`pipeline_order[rank]`, padded with empty steps). At step t rank r
runs its action, if any, then posts one batch of point-to-point operations and waits for all of them
(`_batch_p2p(ops).wait()`): the sends of its own action (a forward's output to the rank of the next stage, a
backward's input gradient to the rank of the previous one) and a receive for every such send a neighbour's step-t
action makes to it. A send completes only once its receiver has posted the matching receive, so the batch of rank r
at step t ends when every rank it exchanges with at t has reached its own step-t batch, plus the transfer:

    reach_r(t) = done_r(t-1),      ready_r(t) = reach_r(t) + seconds of r's action at t (0 for an empty step)
    done_r(t)  = max(ready_r(t), ready_q(t) for every q exchanging with r at t) + max p2p seconds of those transfers

and done_r(t) = ready_r(t) where r exchanges nothing at t. An empty step costs nothing by itself, but the rank still
waits on its receives there. A forward and a backward in the same step on two neighbours therefore both take the
backward's time: the price of the shared clock against the dependency-driven runtime.

Comm tasks (costs.CommTask) are handled as in dag.walk: those that block compute delay the next action of their rank,
and all run on the rank's comm stream after the walk.
"""

from __future__ import annotations

from collections.abc import Sequence

from projection.errors import ConfigError, Problem
from projection.schedule.action import Schedule
from projection.sim.costs import StageCosts
from projection.sim.dag import (
    CompiledSchedule,
    _StreamClock,
    blocking_tasks,
    check_costs,
    comm_stream_times,
    compile_schedule,
    duration_table,
    latency_table,
)
from projection.sim.result import RunData, SimResult, make_result


def lockstep_walk(schedule: Schedule, costs: StageCosts, steps: Sequence[Sequence[int]]) -> SimResult:
    """Simulate `schedule` with every rank's k-th action at time step steps[rank][k] (strictly increasing) and a
    blocking batch of point-to-point operations after every step, as described in the module docstring."""
    cs = compile_schedule(schedule)
    check_costs(cs, costs)
    n_ranks = len(cs.lo)
    if len(steps) != n_ranks or any(len(st) != cs.hi[r] - cs.lo[r] for r, st in enumerate(steps)) or any(
            b <= a for st in steps for a, b in zip((-1, *st), st, strict=False)):
        raise ConfigError(Problem(f"time steps do not match the {n_ranks} ranks' actions of schedule "
                                  f"{schedule.name!r}", key="steps", fix="give each rank's actions strictly "
                                  "increasing non-negative time steps, one per action"))
    n = cs.n
    dtab = duration_table(costs)
    dur = [dtab[c] for c in cs.cidx]
    ltab = latency_table(costs)
    n_st = schedule.n_stages
    s2r = schedule.stage_to_rank
    at: list[dict[int, int]] = [{t: cs.lo[r] + k for k, t in enumerate(st)} for r, st in enumerate(steps)]
    # each action's send: (receiving rank, p2p seconds); a forward feeds stage s+1, a backward stage s-1
    send: list[tuple[int, float] | None] = []
    for a in cs.acts:
        if a.kind == "F" and a.stage + 1 < n_st:
            send.append((s2r[a.stage + 1], ltab[a.stage]))
        elif a.kind in ("B", "I") and a.stage > 0:
            send.append((s2r[a.stage - 1], ltab[n_st - 1 + a.stage - 1]))
        else:
            send.append(None)
    start = [0.0] * n
    end = [0.0] * (n + 1)
    holds = blocking_tasks(cs, costs)
    streams = _StreamClock(cs, costs, end) if any(holds) else None
    done = [0.0] * n_ranks
    last = max((st[-1] for st in steps if st), default=-1)
    lat1 = [ltab[i] for i in cs.lidx1]
    lat2 = [ltab[i] for i in cs.lidx2]
    early = received_too_late(cs, steps)
    if early is not None:
        raise ConfigError(Problem(f"schedule {schedule.name!r}: {early}", key="steps",
                                  fix="give each action a time step after those of the inputs it receives"))
    for t in range(last + 1):
        ready = list(done)
        peers: list[dict[int, float]] = [{} for _ in range(n_ranks)]
        for r in range(n_ranks):
            p = at[r].get(t)
            if p is None:
                continue
            s = ready[r]
            if streams is not None and holds[r] and holds[r][0][0] < p:
                s = max(s, streams.hold_until(r, p))
            start[p] = s
            end[p] = ready[r] = s + dur[p]
            out = send[p]
            if out is not None and out[0] != r:  # the same rank: no p2p (one rank holding both stages)
                q, lat = out
                peers[r][q] = max(peers[r].get(q, 0.0), lat)
                peers[q][r] = max(peers[q].get(r, 0.0), lat)
        for r in range(n_ranks):
            if peers[r]:
                done[r] = max(ready[r], *(ready[q] for q in peers[r])) + max(peers[r].values())
            else:
                done[r] = ready[r]
    del end[n]
    comm = comm_stream_times(cs, costs, end)
    return make_result(RunData(cs, "lockstep", start, end, dur, lat1, lat2, None, comm,
                               holding=tuple(i for h in holds for _, i in h)))


def received_too_late(schedule: Schedule | CompiledSchedule, steps: Sequence[Sequence[int]]) -> str | None:
    """The first pass that runs before its input is received, or None. An input from another rank arrives in the
    batch that ends its producer's time step, so that step must come first; otherwise torch's lock-step runtime
    runs the pass on a buffer not yet received (its forward_one_chunk / backward_one_chunk read the receive buffer
    without waiting). torch's own interleaved orders do this with vpp >= 2 and fewer microbatches than pp, and for
    some other counts that are not a multiple of pp; never for a multiple (tests/unit/test_lockstep_walk.py)."""
    cs = schedule if isinstance(schedule, CompiledSchedule) else compile_schedule(schedule)
    step_of = [0] * cs.n + [-1]  # position n: "no input"
    for r, st in enumerate(steps):
        for k, t in enumerate(st):
            step_of[cs.lo[r] + k] = t
    for p in range(cs.n):
        for d, li in ((cs.dep1[p], cs.lidx1[p]), (cs.dep2[p], cs.lidx2[p])):
            if li >= 0 and step_of[d] >= step_of[p]:
                return (f"{cs.acts[p]} runs at time step {step_of[p]}, but its input from {cs.acts[d]} is received at "
                        f"the end of step {step_of[d]}")
    return None
