"""Microbatches in flight per rank and stage, read from a schedule's action lists (what the memory estimator weighs).

A microbatch is *in flight* on stage s from the end of its F until its activation-freeing action: the full backward
B, or the input-gradient pass I of a split backward. After I most saved activations are freed, but W still needs
the saved inputs of the linear layers (and the output gradients), so a split backward leaves the microbatch
*awaiting W* from I until W: count those separately and weigh them by the bytes a stage keeps for W.

Counts are taken after each compute action of a rank, in list order (SEND/RECV actions are skipped). An overlapped
F&B pair (DualPipe) is two consecutive actions, F first, so the count after its F includes both microbatches, which
is what overlapped execution holds.
Closed forms checked in tests/unit/test_schedules.py: peak total on rank r is min(pp - r, m) for 1F1B and ZB-H1,
m for GPipe, min(2(pp - r) - 1, m) for ZB-H2 and min((pp - r - 1) * 2 + (vpp - 1) * G + 1, m * vpp) for
Megatron's interleaved 1F1B with group size G; the same for its combined 1F1B (Schedule.combined), whose one more
warm-up forward is the one a steady step no longer adds (its forward counted with the backward it runs with).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from projection.schedule.action import COMPUTE_KINDS, Schedule

Timeline = list[list[dict[int, int]]]


def _timelines(s: Schedule) -> tuple[Timeline, Timeline]:
    live: Timeline = []
    wait: Timeline = []
    for r, acts in enumerate(s.actions):
        stages = s.stages_of(r)
        cur = dict.fromkeys(stages, 0)
        pend = dict.fromkeys(stages, 0)
        rank_live: list[dict[int, int]] = []
        rank_wait: list[dict[int, int]] = []
        deferred: int | None = None  # a combined step's forward stage, counted with its backward
        steady_from = s.warmup[r] if s.combined and s.warmup else len(acts)  # forwards before the steady state
        forwards = 0
        for a in acts:
            if a.kind not in COMPUTE_KINDS:
                continue
            cur.setdefault(a.stage, 0)
            pend.setdefault(a.stage, 0)
            if a.kind == "F":
                forwards += 1
            if a.kind == "F" and forwards > steady_from:
                # Megatron's combined 1F1B runs this forward layer by layer with the backward after it, each
                # forward layer's activations saved as a backward layer's are freed: the step never holds one more
                # microbatch than before it, so its forward counts when the backward ends
                deferred = a.stage
            elif a.kind == "F":
                cur[a.stage] += 1
            elif a.kind == "B":
                cur[a.stage] -= 1
                if deferred is not None:
                    cur[deferred] += 1
                    deferred = None
            elif a.kind == "I":
                cur[a.stage] -= 1
                pend[a.stage] += 1
            else:
                pend[a.stage] -= 1
            rank_live.append(dict(cur))
            rank_wait.append(dict(pend))
        live.append(rank_live)
        wait.append(rank_wait)
    return live, wait


def inflight_timeline(s: Schedule) -> Timeline:
    """timeline[rank][k][stage]: microbatches in flight (F done, B/I not yet) after the rank's k-th compute action."""
    return _timelines(s)[0]


def awaiting_w_timeline(s: Schedule) -> Timeline:
    """timeline[rank][k][stage]: microbatches whose I ran and whose W has not, after the k-th compute action."""
    return _timelines(s)[1]


def _argmax_total(rank_timeline: list[dict[int, int]]) -> int:
    best, at = -1, -1
    for k, counts in enumerate(rank_timeline):
        total = sum(counts.values())
        if total > best:
            best, at = total, k
    return at


def peak_inflight(s: Schedule) -> list[dict[int, int]]:
    """Per rank, the per-stage in-flight counts at the first point where the rank's total in flight peaks."""
    out = []
    for r, rank_timeline in enumerate(inflight_timeline(s)):
        at = _argmax_total(rank_timeline)
        out.append(dict(rank_timeline[at]) if at >= 0 else dict.fromkeys(s.stages_of(r), 0))
    return out


def peak_inflight_total(s: Schedule) -> list[int]:
    """Per rank, the peak number of microbatches in flight summed over the rank's stages."""
    return [max((sum(c.values()) for c in tl), default=0) for tl in inflight_timeline(s)]


def peak_awaiting_w(s: Schedule) -> list[dict[int, int]]:
    """Per rank, the per-stage awaiting-W counts at the first point where the rank's total awaiting W peaks."""
    out = []
    for r, rank_timeline in enumerate(awaiting_w_timeline(s)):
        at = _argmax_total(rank_timeline)
        out.append(dict(rank_timeline[at]) if at >= 0 else dict.fromkeys(s.stages_of(r), 0))
    return out


def peak_weighted(s: Schedule, inflight_bytes: Mapping[int, float],
                  awaiting_w_bytes: Mapping[int, float] | None = None) -> list[float]:
    """Per rank, max over its action sequence of sum_stage (in flight x inflight_bytes[stage] + awaiting W x
    awaiting_w_bytes[stage]) in bytes; stages missing from a mapping weigh 0. Stages differ in activation size, so
    this peak need not fall where the count peaks."""
    w_bytes = awaiting_w_bytes or {}
    live, wait = _timelines(s)
    out = []
    for rank_live, rank_wait in zip(live, wait, strict=True):
        best = 0.0
        for cur, pend in zip(rank_live, rank_wait, strict=True):
            total = sum(n * inflight_bytes.get(st, 0.0) for st, n in cur.items())
            total += sum(n * w_bytes.get(st, 0.0) for st, n in pend.items())
            best = max(best, total)
        out.append(best)
    return out


State = tuple[tuple[int, int], ...]  # ((stage, live microbatches), ...) sorted by stage


@lru_cache(maxsize=256)
def peak_candidates(s: Schedule) -> tuple[tuple[State, ...], ...]:
    """Per rank, the in-flight states that can hold the rank's activation peak for some non-negative bytes per
    stage: the distinct states after forward actions (activations only grow on F) that no other such state
    dominates stage by stage. The weighted peak over the full timeline equals the max over these few states."""
    out = []
    for rank_timeline, acts in zip(inflight_timeline(s), s.actions, strict=True):
        compute = [a for a in acts if a.kind in COMPUTE_KINDS]
        # a combined 1F1B step's forward counts with its backward (_timelines): there activations grow on B too
        states = {tuple(sorted(c.items())) for c, a in zip(rank_timeline, compute, strict=True)
                  if a.kind == "F" or s.combined}
        keep = [st for st in states if not any(o != st and _dominates(o, st) for o in states)]
        out.append(tuple(sorted(keep)))
    return tuple(out)


def _dominates(a: State, b: State) -> bool:
    da, db = dict(a), dict(b)
    return all(da.get(k, 0) >= v for k, v in db.items())


@lru_cache(maxsize=256)
def inflight_matrices(s: Schedule) -> tuple[tuple[tuple[int, ...], np.ndarray], ...]:
    """Per rank: (its stages, counts[k, j] = live microbatches of stage j after the k-th compute action) as an int
    array, so a weighted peak over the timeline is one matrix-vector product. Cached; the arrays are read-only."""
    out = timeline_matrices(inflight_timeline(s), [s.stages_of(r) for r in range(s.n_ranks)])
    for _, mat in out:
        mat.setflags(write=False)
    return out


Matrices = tuple[tuple[tuple[int, ...], np.ndarray], ...]


@lru_cache(maxsize=256)
def done_matrices(s: Schedule) -> Matrices:
    """Per rank, in inflight_matrices' layout: done[k, j] = microbatches whose activation-freeing pass (B, or I of a
    split backward) on stage j has run, after the rank's k-th compute action (what torch's `output_chunks` still
    keeps once fwd_cache has let go, memory/pipeline_io.py). Cached; the arrays are read-only."""
    timeline = []
    for acts in s.actions:
        done: dict[int, int] = {}
        rows = []
        for a in acts:
            if a.kind not in COMPUTE_KINDS:
                continue
            if a.kind in ("B", "I"):
                done[a.stage] = done.get(a.stage, 0) + 1
            rows.append(dict(done))
        timeline.append(rows)
    out = timeline_matrices(timeline, [s.stages_of(r) for r in range(s.n_ranks)])
    for _, mat in out:
        mat.setflags(write=False)
    return out


def timeline_matrices(timeline: Sequence[Sequence[dict[int, int]]],
                      stages: Sequence[tuple[int, ...]] | None = None) -> Matrices:
    """The layout of inflight_matrices for a timeline given as dicts (e.g. a custom in-flight model); `stages`
    fixes each rank's column order (default: the stages seen, sorted)."""
    out = []
    for r, rank_timeline in enumerate(timeline):
        cols = stages[r] if stages is not None else tuple(sorted({st for c in rank_timeline for st in c}))
        mat = np.array([[c.get(st, 0) for st in cols] for c in rank_timeline], dtype=np.int64).reshape(
            len(rank_timeline), len(cols))
        out.append((tuple(cols), mat))
    return tuple(out)
