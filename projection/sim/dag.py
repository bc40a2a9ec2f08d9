"""Exact single-pass walk of a static pipeline schedule (the default engine).

Each compute action starts at max(its rank is free, every input is ready) and runs for its priced seconds. An input
produced on another rank is ready p2p seconds after its producer ends (latency on the edge, no link sharing; the
event loop in des.py models shared links). Dependencies, in torch.distributed.pipelining's notation:
  F(s, m) <- F(s-1, m);   B(s, m) or I(s, m) <- F(s, m) and the input gradient from stage s+1 (its B or I);
  W(s, m) <- I(s, m).
Explicit SEND_*/RECV_* actions in a schedule are not timed: p2p is always derived from the data dependencies.
Extra comm tasks (costs.CommTask) run on each rank's comm stream, in the order given, after the walk; those that
block compute are advanced during it, as far as the next action of their rank needs (_StreamClock).

Because the schedule is static the result is a longest path, independent of visiting order; the walk visits each
action once (a rank blocked on an input parks until that input's producer is done), so it is O(actions).
Speed: integer positions and flat lists, no dicts or tuples in the hot loop (DESIGN.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from projection.errors import ConfigError, Problem
from projection.schedule.action import Action, Schedule
from projection.sim.costs import CommTask, StageCosts
from projection.sim.result import CommInterval, RunData, SimResult, make_result

KIND_CODE = {"F": 0, "B": 1, "I": 2, "W": 3}
IntArray = NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class CompiledSchedule:
    """A schedule as flat integer lists. Position p indexes compute actions rank-major in execution order;
    position `n` is a sentinel meaning "no dependency". `lidx*` index the latency table of `latency_table`
    (-1 = same rank, no p2p)."""

    schedule: Schedule
    acts: tuple[Action, ...]
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    rank_of: list[int]
    cidx: list[int]  # kind * n_stages + stage: index of the duration table
    dep1: list[int]
    dep2: list[int]
    lidx1: list[int]
    lidx2: list[int]
    slot: IntArray  # (kind * n_stages + stage) * n_microbatches + microbatch -> position, -1 if absent
    pairs: dict[int, int]  # overlapped F position -> its B's position (DualPipe); the F waits for the B's inputs

    @property
    def n(self) -> int:
        return len(self.acts)

    def position(self, action: Action) -> int:
        k = KIND_CODE.get(action.kind)
        sc = self.schedule
        if k is not None and 0 <= action.stage < sc.n_stages and 0 <= action.microbatch < sc.n_microbatches:
            p = int(self.slot[(k * sc.n_stages + action.stage) * sc.n_microbatches + action.microbatch])
            if p >= 0:
                return p
        raise ConfigError(Problem(f"action {action} is not in schedule {self.schedule.name!r}", key="comm_tasks",
                                  fix="name a compute action (F/B/I/W) that the schedule holds"))


def _problem(schedule: Schedule, msg: str, fix: str) -> ConfigError:
    return ConfigError(Problem(f"schedule {schedule.name!r}: {msg}", key="schedule", fix=fix))


def compile_schedule(schedule: Schedule) -> CompiledSchedule:
    """Integer form of `schedule`; raises ConfigError when an action is misplaced, repeated or lacks its inputs.
    Vectorised with numpy (a 262,144-action schedule compiles in about 0.1 s)."""
    n_st, n_mb = schedule.n_stages, schedule.n_microbatches
    if len(schedule.stage_to_rank) != n_st or len(schedule.actions) != schedule.n_ranks:
        raise _problem(schedule, "stage_to_rank / actions do not match n_stages / n_ranks", "rebuild the schedule")
    acts: list[Action] = []
    lo: list[int] = []
    hi: list[int] = []
    counts: list[int] = []
    for rank_acts in schedule.actions:
        lo.append(len(acts))
        compute = [a for a in rank_acts if a.kind in KIND_CODE]  # SEND_*/RECV_*: p2p comes from the data deps
        acts += compute
        hi.append(len(acts))
        counts.append(len(compute))
    n = len(acts)
    code = np.fromiter(map(KIND_CODE.__getitem__, [a.kind for a in acts]), np.int64, n)
    stage = np.fromiter([a.stage for a in acts], np.int64, n)
    mb = np.fromiter([a.microbatch for a in acts], np.int64, n)
    rank = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    bad = np.flatnonzero((stage < 0) | (stage >= n_st) | (mb < 0) | (mb >= n_mb))
    if bad.size:
        raise _problem(schedule, f"action {acts[bad[0]]} on rank {rank[bad[0]]} is out of range (stages {n_st}, "
                       f"microbatches {n_mb})", "use stage < n_stages and microbatch < n_microbatches")
    s2r = np.asarray(schedule.stage_to_rank, dtype=np.int64)
    bad = np.flatnonzero(s2r[stage] != rank)
    if bad.size:
        a = acts[bad[0]]
        raise _problem(schedule, f"action {a} is listed on rank {rank[bad[0]]} but stage {a.stage} lives on rank "
                       f"{s2r[a.stage]}", "list each action on the rank that holds its stage")
    plane = n_st * n_mb
    key = code * plane + stage * n_mb + mb
    slot = np.full(4 * plane, -1, dtype=np.int64)
    slot[key] = np.arange(n, dtype=np.int64)
    if n and not np.array_equal(slot[key], np.arange(n)):
        dup = int(np.flatnonzero(slot[key] != np.arange(n))[0])
        raise _problem(schedule, f"action {acts[dup]} appears twice", "give each (stage, kind, microbatch) once")
    prv, nxt, model = _neighbours(schedule)
    base = stage * n_mb + mb
    is_f, is_w, is_g = code == 0, code == 3, (code == 1) | (code == 2)
    q_prev = stage - 1 if prv is None else prv[base]
    q_next = np.where(stage + 1 < n_st, stage + 1, -1) if nxt is None else nxt[base]
    m_stage = stage if model is None else model[stage]
    d1 = np.full(n, -2, dtype=np.int64)  # -2: no input; -1: input missing
    f_in = is_f & (q_prev >= 0)
    d1[f_in] = slot[q_prev[f_in] * n_mb + mb[f_in]]
    d1[is_w] = slot[2 * plane + base[is_w]]
    d1[is_g] = slot[base[is_g]]
    d2 = np.full(n, -2, dtype=np.int64)
    g_in = is_g & (q_next >= 0)
    up = q_next[g_in] * n_mb + mb[g_in]
    d2[g_in] = np.where(slot[plane + up] >= 0, slot[plane + up], slot[2 * plane + up])
    missing = np.flatnonzero((d1 == -1) | (d2 == -1))
    if missing.size:
        names = [f"{acts[p]} needs {_need(acts[p], int(q_prev[p]), int(q_next[p]), bool(d1[p] == -1))}"
                 for p in missing[:8]]
        raise _problem(schedule, "actions without their inputs: " + ", ".join(names)
                       + (f" (+{missing.size - 8} more)" if missing.size > 8 else ""),
                       "every F needs the F of the stage before; every B/I needs its F and the gradient of the stage "
                       "after; W needs I")
    d1 = np.where(d1 < 0, n, d1)
    d2 = np.where(d2 < 0, n, d2)
    rank_ext = np.append(rank, -1)
    l1 = np.where((d1 < n) & (rank_ext[d1] != rank), m_stage - 1, -1)
    l2 = np.where((d2 < n) & (rank_ext[d2] != rank), n_st - 1 + m_stage, -1)
    dep1, dep2, lidx1, lidx2 = d1.tolist(), d2.tolist(), l1.tolist(), l2.tolist()
    pairs = _pair_overlapped(schedule, slot, code, dep1, dep2, lidx2)
    return CompiledSchedule(schedule, tuple(acts), tuple(lo), tuple(hi), rank.tolist(),
                            (code * n_st + stage).tolist(), dep1, dep2, lidx1, lidx2, slot, pairs)


def _need(a: Action, q_prev: int, q_next: int, first_missing: bool) -> str:
    m = a.microbatch
    if a.kind == "F":
        return f"{q_prev}F{m}"
    if a.kind == "W":
        return f"{a.stage}I{m}"
    return f"{a.stage}F{m}" if first_missing else f"{q_next}B{m} or {q_next}I{m}"


def _neighbours(schedule: Schedule) -> tuple[IntArray | None, IntArray | None, IntArray | None]:
    """For schedules with routes (DualPipe): previous and next stage per (stage, microbatch) (-1: none) and the model
    stage of each virtual stage; (None, None, None) for the plain order 0 .. n_stages-1."""
    if not schedule.routes:
        return None, None, None
    n_st, n_mb = schedule.n_stages, schedule.n_microbatches
    prv = np.full(n_st * n_mb, -1, dtype=np.int64)
    nxt = np.full(n_st * n_mb, -1, dtype=np.int64)
    for m in range(n_mb):
        path = schedule.route(m)
        for i, s in enumerate(path):
            prv[s * n_mb + m] = path[i - 1] if i > 0 else -1
            nxt[s * n_mb + m] = path[i + 1] if i + 1 < len(path) else -1
    return prv, nxt, np.asarray([schedule.model_stage(s) for s in range(n_st)], dtype=np.int64)


def _pair_overlapped(schedule: Schedule, slot: IntArray, codes: IntArray, dep1: list[int], dep2: list[int],
                     lidx2: list[int]) -> dict[int, int]:
    """Overlapped forward-backward pairs (Schedule.overlapped) run as one launch: the F also waits for the B's
    gradient input (a shadow dependency, not a second transfer), and the F's output counts as ready when the pair
    ends, so its consumers depend on the B."""
    if not schedule.overlapped:
        return {}
    n_st, n_mb = schedule.n_stages, schedule.n_microbatches
    pairs: dict[int, int] = {}
    for r, idx in enumerate(schedule.overlapped):
        for i in idx:
            f, b = schedule.actions[r][i], schedule.actions[r][i + 1]
            pf = int(slot[(KIND_CODE[f.kind] * n_st + f.stage) * n_mb + f.microbatch])
            pb = int(slot[(KIND_CODE[b.kind] * n_st + b.stage) * n_mb + b.microbatch])
            if f.kind != "F" or codes[pb] not in (1, 2) or pb != pf + 1:
                raise _problem(schedule, f"overlapped pair at rank {r} index {i} is {f}, {b}", "pair an F with the "
                               "B (or I) right after it")
            pairs[pf] = pb
            dep2[pf], lidx2[pf] = dep2[pb], lidx2[pb]
    for deps in (dep1, dep2):
        for q, d in enumerate(deps):
            if d in pairs and pairs[d] != q:
                deps[q] = pairs[d]
    return pairs


def duration_table(costs: StageCosts) -> list[float]:
    """Seconds indexed by kind * n_stages + stage (kinds F, B, I, W)."""
    return list(costs.f_s) + list(costs.b_s) + list(costs.i_s) + list(costs.w_s)


def latency_table(costs: StageCosts) -> list[float]:
    """p2p seconds: forward boundaries, then backward boundaries, then 0.0 (index -1: same rank)."""
    return list(costs.p2p_fwd_s) + list(costs.p2p_bwd_s) + [0.0]


def check_costs(cs: CompiledSchedule, costs: StageCosts) -> None:
    if costs.n_stages != cs.schedule.n_stages:
        raise ConfigError(Problem(f"costs price {costs.n_stages} stages but schedule {cs.schedule.name!r} has "
                                  f"{cs.schedule.n_stages}", key="costs", fix="price every virtual stage"))


def walk(schedule: Schedule | CompiledSchedule, costs: StageCosts) -> SimResult:
    """Simulate a static schedule exactly: each action starts at max(rank free, inputs ready + p2p)."""
    cs = schedule if isinstance(schedule, CompiledSchedule) else compile_schedule(schedule)
    check_costs(cs, costs)
    n = cs.n
    dtab = duration_table(costs)
    dur = [dtab[c] for c in cs.cidx]
    ltab = latency_table(costs)
    lat1 = [ltab[i] for i in cs.lidx1]
    lat2 = [ltab[i] for i in cs.lidx2]
    dep1, dep2 = cs.dep1, cs.dep2
    start = [0.0] * n
    end = [-1.0] * (n + 1)
    end[n] = 0.0
    n_ranks = len(cs.lo)
    ptr = list(cs.lo)
    his = cs.hi
    free = [0.0] * n_ranks
    waiters: dict[int, list[int]] = {}
    holds = blocking_tasks(cs, costs)
    streams = _StreamClock(cs, costs, end) if any(holds) else None
    stack = list(range(n_ranks - 1, -1, -1))
    while stack:
        r = stack.pop()
        p = ptr[r]
        hi = his[r]
        t = free[r]
        held = holds[r]
        while p < hi:
            d = dep1[p]
            e1 = end[d]
            if e1 < 0.0:
                waiters.setdefault(d, []).append(r)
                break
            d = dep2[p]
            e2 = end[d]
            if e2 < 0.0:
                waiters.setdefault(d, []).append(r)
                break
            e1 += lat1[p]
            if e1 > t:
                t = e1
            e2 += lat2[p]
            if e2 > t:
                t = e2
            if held and held[0][0] < p and streams is not None:  # a blocking comm task before p on this rank
                t = max(t, streams.hold_until(r, p))
            start[p] = t
            t += dur[p]
            end[p] = t
            if p in waiters:
                stack.extend(waiters.pop(p))
            p += 1
        ptr[r] = p
        free[r] = t
    blocked = [r for r in range(n_ranks) if ptr[r] < his[r]]
    if blocked:
        raise deadlock(cs, ptr, end)
    del end[n]
    comm = comm_stream_times(cs, costs, end)
    return make_result(RunData(cs, "dag", start, end, dur, lat1, lat2, None, comm,
                               holding=tuple(i for h in holds for _, i in h)))


def task_position(cs: CompiledSchedule, task: CommTask) -> int:
    """Position of the action a comm task follows; ConfigError when that action runs on another rank."""
    p = cs.position(task.after)
    if cs.rank_of[p] != task.rank:
        raise ConfigError(Problem(f"comm task {task.label!r} on rank {task.rank} follows {task.after}, which runs "
                                  f"on rank {cs.rank_of[p]}", key="comm_tasks", fix="use an action of that rank"))
    return p


def blocking_tasks(cs: CompiledSchedule, costs: StageCosts) -> list[list[tuple[int, int]]]:
    """Per rank, (position of `after`, task index) of each comm task with `blocks_compute`, in stream order. Raises
    ConfigError when one waits on its stream behind a task that follows a later action: that action would wait for
    the blocking task, which waits for it."""
    out: list[list[tuple[int, int]]] = [[] for _ in cs.lo]
    latest: dict[int, tuple[int, str]] = {}
    for i, task in enumerate(costs.comm_tasks):
        p = task_position(cs, task)
        if task.blocks_compute:
            prev = latest.get(task.rank)
            if prev is not None and prev[0] > p:
                raise ConfigError(Problem(f"comm task {task.label!r} holds rank {task.rank}'s compute after "
                                          f"{task.after} but waits on its stream behind {prev[1]!r}, which follows "
                                          f"{cs.acts[prev[0]]}: a deadlock", key="comm_tasks",
                                          fix="order each rank's comm tasks by the actions they follow"))
            out[task.rank].append((p, i))
        if p > latest.get(task.rank, (-1, ""))[0]:
            latest[task.rank] = (p, task.label)
    return out


class _StreamClock:
    """The comm streams of `walk`, advanced only as far as a blocking task needs: each task starts when its `after`
    ends and the previous task on its rank's stream is done (comm_stream_times gives the same floats)."""

    def __init__(self, cs: CompiledSchedule, costs: StageCosts, end: list[float]):
        self.end = end
        self.tasks = costs.comm_tasks
        self.after = [cs.position(t.after) for t in costs.comm_tasks]
        self.order: list[list[int]] = [[] for _ in cs.lo]
        for i, t in enumerate(costs.comm_tasks):
            self.order[t.rank].append(i)
        self.next = [0] * len(cs.lo)
        self.free = [0.0] * len(cs.lo)
        self.hold = [0.0] * len(cs.lo)

    def hold_until(self, r: int, p: int) -> float:
        """When every blocking task of rank r that follows an action before position p has ended."""
        order, k = self.order[r], self.next[r]
        while k < len(order) and self.after[order[k]] < p:
            i = order[k]
            t = max(self.free[r], self.end[self.after[i]]) + self.tasks[i].duration_s
            self.free[r] = t
            if self.tasks[i].blocks_compute:
                self.hold[r] = max(self.hold[r], t)
            k += 1
        self.next[r] = k
        return self.hold[r]


def deadlock(cs: CompiledSchedule, ptr: list[int], end: list[float]) -> ConfigError:
    """The error for a schedule whose ranks block each other: names each blocked rank's next action and its input."""
    parts = []
    for r in range(len(cs.lo)):
        p = ptr[r]
        if p >= cs.hi[r]:
            continue
        waits = [str(cs.acts[d]) for d in (cs.dep1[p], cs.dep2[p]) if d < cs.n and end[d] < 0.0]
        parts.append(f"rank {r} at {cs.acts[p]} waits for {' and '.join(waits) or '?'}")
    return _problem(cs.schedule, "deadlock: " + "; ".join(parts),
                    "reorder the per-rank lists so every input is produced before a rank waits for it")


def comm_stream_times(cs: CompiledSchedule, costs: StageCosts,
                      end: list[float]) -> tuple[CommInterval, ...]:
    """(rank, label, start_s, end_s, position of `after`) of each extra comm task: in the given order per rank's
    comm stream, each after its `after` action and the previous task on that stream."""
    if not costs.comm_tasks:
        return ()
    stream_free: dict[int, float] = {}
    out = []
    for task in costs.comm_tasks:
        p = task_position(cs, task)
        t = max(stream_free.get(task.rank, 0.0), end[p])
        out.append((task.rank, task.label, t, t + task.duration_s, p))
        stream_free[task.rank] = t + task.duration_s
    return tuple(out)
