"""Exact walk of a pipeline schedule run with a framework's own point-to-point calls (schedule/p2p_calls.py):
Megatron-LM's calls around 1F1B and interleaved 1F1B, with or without `--overlap-p2p-communication`
(schedule/megatron_calls.py), and torch.distributed.pipelining's Schedule1F1B (schedule/torch_calls.py).

A call posts its sends and receives together; a send is done only when the peer has posted the matching receive,
so each op of a call ends at

    done(op) = max(post(op), post(partner op)) + p2p seconds of the boundary it crosses

and a rank that waits for the call (at once when it blocks, or at a later wait) goes on at the latest of its ops. A
rank that reaches a call before a peer holds there, which the dependency walk (dag.py, where a send never holds its
sender and a receive waits only for the data) does not model: in Megatron's interleaved schedule without overlap
each steady F+B pair ends in one exchange with both neighbours, so a slow neighbour holds the rank even when the
rank's own next input is already there. torch's 2.10+ multi-stage runtime (each receive waited just before the pass
that needs it, sends never waited until the step ends) is the dependency walk.

The walk parks a rank on the partner op it waits for and wakes it when that op is posted, so it is O(actions + ops).
Comm tasks (costs.CommTask) are handled as in dag.walk.
"""

from __future__ import annotations

from collections.abc import Callable

from projection.errors import ConfigError, Problem
from projection.schedule.action import Action, Schedule
from projection.schedule.megatron_calls import megatron_calls
from projection.schedule.p2p_calls import POST, WAIT, P2pCalls, decode
from projection.schedule.torch_calls import torch_1f1b_calls
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


def megatron_walk(schedule: Schedule, costs: StageCosts, calls: P2pCalls | None = None, *,
                  overlap: bool = False) -> SimResult:
    """`schedule` (1F1B or Megatron-order interleaved 1F1B) with Megatron-LM's p2p calls (`calls`, default
    megatron_calls(schedule, overlap)), as the module docstring describes."""
    if calls is None:
        calls = _calls(lambda s: megatron_calls(s, overlap), schedule, "Megatron's p2p walk runs 1F1B and "
                       "Megatron-order interleaved 1F1B only")
    return p2p_walk(schedule, costs, calls, "megatron")


def torch_1f1b_walk(schedule: Schedule, costs: StageCosts) -> SimResult:
    """`schedule` (1F1B, one stage per rank) as torch.distributed.pipelining's Schedule1F1B runs it."""
    calls = _calls(torch_1f1b_calls, schedule, "torch's Schedule1F1B runs 1F1B with one stage per rank")
    return p2p_walk(schedule, costs, calls, "torch1f1b")


def _calls(build: Callable[[Schedule], P2pCalls], schedule: Schedule, fix: str) -> P2pCalls:
    try:
        return build(schedule)
    except ValueError as e:
        raise ConfigError(Problem(str(e), key="plan.schedule", fix=fix)) from None


def p2p_walk(schedule: Schedule, costs: StageCosts, calls: P2pCalls, engine: str) -> SimResult:
    """Simulate `schedule` with each rank running its program of `calls` (result engine name `engine`)."""
    cs = compile_schedule(schedule)
    check_costs(cs, costs)
    n_st = schedule.n_stages
    dtab = duration_table(costs)
    dur = [dtab[c] for c in cs.cidx]
    ltab = latency_table(costs)
    # an activation from stage s crosses forward boundary s; a gradient from stage s backward boundary s - 1
    lat = [ltab[s] if kind == "F" else ltab[n_st - 1 + s - 1] for kind, s, _ in calls.op_key]
    partner, progs, ops_of = calls.partner, calls.programs, calls.calls
    n_ranks = len(cs.lo)
    start = [0.0] * cs.n
    end = [0.0] * (cs.n + 1)
    post = [-1.0] * len(lat)
    ptr = [0] * n_ranks
    clock = [0.0] * n_ranks
    holds = blocking_tasks(cs, costs)
    streams = _StreamClock(cs, costs, end) if any(holds) else None
    # pred[p]: the action whose end set p's start (the rank's previous action, or the action a peer ended before
    # posting the op p's rank waited for last); -1 when nothing, or a comm task, did (result.critical_path)
    pred = [-1] * cs.n
    last = [-1] * n_ranks
    post_pred = [-1] * len(lat)
    waiters: dict[int, list[int]] = {}
    stack = list(range(n_ranks - 1, -1, -1))
    while stack:
        r = stack.pop()
        i, t, prog, lo, q = ptr[r], clock[r], progs[r], cs.lo[r], last[r]
        while i < len(prog):
            item = prog[i]
            if item >= 0:
                p = lo + item
                if streams is not None and holds[r] and holds[r][0][0] < p:
                    held = streams.hold_until(r, p)
                    if held > t:
                        t, q = held, -1
                start[p] = t
                pred[p] = q
                t += dur[p]
                end[p] = t
                q = p
            else:
                c, mode = decode(item)
                ops = ops_of[c]
                if mode != WAIT and post[ops[0]] < 0.0:  # first arrival: post every op of the call
                    for o in ops:
                        post[o] = t
                        post_pred[o] = q
                        stack.extend(waiters.pop(o, ()))
                if mode != POST:
                    missing = next((partner[o] for o in ops if post[partner[o]] < 0.0), -1)
                    if missing >= 0:
                        waiters.setdefault(missing, []).append(r)
                        break
                    for o in ops:
                        b = partner[o] if post[partner[o]] > post[o] else o
                        done = post[b] + lat[o]
                        if done > t:
                            t, q = done, post_pred[b]
            i += 1
        ptr[r], clock[r], last[r] = i, t, q
    blocked = [r for r in range(n_ranks) if ptr[r] < len(progs[r])]
    if blocked:  # the call builders pair every op, so this is a defect, not a user error
        raise RuntimeError(f"p2p walk of {schedule.name!r} deadlocked on ranks {blocked}")
    del end[cs.n]
    lat1 = [ltab[i] for i in cs.lidx1]
    lat2 = [ltab[i] for i in cs.lidx2]
    arrivals, transfers = _inputs(cs, end, lat1, lat2, calls, post, lat)
    comm = comm_stream_times(cs, costs, end)
    return make_result(RunData(cs, engine, start, end, dur, lat1, lat2, arrivals, comm, transfers,
                               holding=tuple(i for h in holds for _, i in h), pred=pred,
                               sends=_sends(calls, post, lat)))


def _sends(calls: P2pCalls, post: list[float], lat: list[float]) -> tuple[tuple[int, Action, float, float], ...]:
    """Each send's transfer on its sender (rank, SEND_F/SEND_B of the producing stage, start_s, end_s): a send is
    in flight on both ranks from the later of the two posts, and the sender waits for it as the receiver does."""
    out = []
    for o, key in enumerate(calls.op_key):
        if calls.op_send[o] and lat[o] > 0.0:
            t0 = max(post[o], post[calls.partner[o]])
            out.append((calls.op_rank[o], Action(key[1], "SEND_F" if key[0] == "F" else "SEND_B", key[2]), t0,
                        t0 + lat[o]))
    return tuple(out)


def _inputs(cs: CompiledSchedule, end: list[float], lat1: list[float], lat2: list[float], calls: P2pCalls,
            post: list[float], lat: list[float]) -> tuple[list[float], list[tuple[int, float, float]]]:
    """Per position, when each input was on the rank (a local input when its producer ended, a remote one when the
    receive that brought it ended, 0.0 for none), and each receive's transfer (2 * position + input, start_s, end_s)
    for the timeline."""
    n = cs.n
    arrivals = [0.0] * (2 * n)
    for p in range(n):
        for j, d, la in ((0, cs.dep1[p], lat1[p]), (1, cs.dep2[p], lat2[p])):
            if d < n:
                arrivals[2 * p + j] = end[d] + la
    transfers = []
    for o, key in enumerate(calls.op_key):
        if calls.op_send[o]:
            continue
        kind, s, mb = key  # the consumer: F of the next stage, or B of the stage before (its gradient input)
        x = 2 * cs.position(Action(s + 1, "F", mb)) if kind == "F" else 2 * cs.position(Action(s - 1, "B", mb)) + 1
        t0 = max(post[o], post[calls.partner[o]])
        arrivals[x] = t0 + lat[o]
        transfers.append((x, t0, t0 + lat[o]))
    return arrivals, transfers
