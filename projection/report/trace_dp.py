"""The data-parallel gradient buckets of a Chrome trace (report/trace.py): each bucket Megatron's DDP launches inside
a stage's last backward (perf/dp.py `in_backward`, overlapped gradient reduction), drawn as the pricing placed it.

perf/dp.bucket_spans gives each bucket's start and end in seconds from the start of that backward action; the
part of the chain past the action is what the simulation ran as the rank's comm task `dp grad s<stage>`, which may
start later (the comm stream busy) or run longer (a shared NIC) than the chain's own tail. So a bucket's time
inside the action is drawn from the action's simulated start, and its time past the action is mapped linearly onto
the simulated task's interval; a bucket that runs across the action's end while the task starts later is drawn in
two parts. The task itself is then not drawn again (`replaced`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from projection.sim.result import SimResult, TimelineEntry

if TYPE_CHECKING:
    from projection.perf.dp import DPComm
    from projection.perf.pricing import PricedStages

BUCKET_TID = 7
EPS_S = 1e-12


def replaced(dp: DPComm | None, rank: int) -> set[str]:
    """Labels of the rank's comm tasks whose buckets are drawn instead."""
    return set() if dp is None else {f"dp grad s{s}" for r, s in dp.in_backward if r == rank}


def bucket_events(result: SimResult, priced: PricedStages | None, dp: DPComm | None, rank: int,
                  offset_s: float, extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Complete events of `rank`'s in-backward buckets, `offset_s` after the step's start (a round's start)."""
    if dp is None or priced is None:
        return []
    from projection.perf.dp import bucket_spans, last_backward

    sched = result.schedule
    entries = result.timeline[rank]
    out: list[dict[str, Any]] = []
    for r, s in dp.in_backward:
        if r != rank:
            continue
        last = last_backward(sched.actions[rank], s)
        action_s = priced.action_time(sched.model_stage(s), last.kind).seconds
        t0 = next(e.start_s for e in entries if e.stream == "compute" and e.action == last)
        task = next((e for e in entries if e.action is None and e.label == f"dp grad s{s}"), None)
        spans = bucket_spans([b for b in dp.grad_buckets if b.pp_rank == rank and b.stage == s], action_s)
        tail = max((end for _, _, end in spans), default=0.0) - action_s
        for b, start, end in spans:
            name = f"{b.kind.replace('_', '-')} bucket {b.order} ({b.group})"
            args = {"stage": s, "bucket": b.order, "group": b.group, "params": b.params, "bytes": b.size_bytes,
                    **extra}
            for a, z in _parts(start, end, action_s, t0, tail, task):
                out.append({"ph": "X", "name": name, "cat": "comm", "pid": rank, "tid": BUCKET_TID,
                            "ts": (offset_s + a) * 1e6, "dur": (z - a) * 1e6,
                            "args": {"start_s": offset_s + a, "end_s": offset_s + z, **args}})
    return out


def _parts(start: float, end: float, action_s: float, t0: float, tail: float,
           task: TimelineEntry | None) -> list[tuple[float, float]]:
    """The simulated intervals of a bucket running from `start` to `end` seconds after its action's start (module
    docstring)."""
    def at(x: float) -> float:  # a point of the chain on the simulated timeline
        if x <= action_s or task is None or tail <= EPS_S:
            return t0 + x
        return task.start_s + (x - action_s) * (task.end_s - task.start_s) / tail

    if start < action_s < end and task is not None and task.start_s > t0 + action_s + EPS_S:
        return [(t0 + start, t0 + action_s), (task.start_s, at(end))]
    return [(at(start), at(end))]
