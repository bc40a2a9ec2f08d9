"""SimResult: what a pipeline simulation produced. Times are seconds from the start of the step.

Per rank, the step divides into busy (compute streams), exposed communication (a p2p receive into the rank or one of
its comm-stream tasks in flight while it computes nothing) and bubble (nothing at all):
  busy_s[r] + exposed_comm_s[r] + bubble_s[r] == step_time_s.
`bubble_ratio` is Primus pp_vis's definition, 1 - sum(busy) / (ranks * step): everything that is not compute, so
exposed p2p counts as bubble there (primus-projection.md §3.3).

The engines hand over flat lists (RunData); the per-rank timeline, exposed communication, critical path and peak
in-flight activations are derived on first access, so a sweep that only reads step_time_s pays nothing for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from projection.schedule.action import Action, Kind, Schedule

if TYPE_CHECKING:
    from projection.sim.dag import CompiledSchedule

CommInterval = tuple[int, str, float, float, int]  # (rank, label, start_s, end_s, position of the action it follows)


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One interval on one rank. `action` is the compute action (stream "compute"), the receive it models
    (RECV_F/RECV_B of the consuming stage, stream "p2p"; under the runtime walks of sim/p2p_walk.py also the send,
    SEND_F/SEND_B of the producing stage), or None for a comm task (stream "comm")."""

    action: Action | None
    start_s: float
    end_s: float
    stream: str
    label: str


@dataclass(frozen=True, eq=False)
class RunData:
    """Raw engine output, indexed by the compiled schedule's positions. `arrivals` (2 per position: inputs 1 and 2)
    and `transfers` (input slot, start_s, end_s) are given by the event loop, where links delay
    transfers; the exact walk leaves them None and they follow from end + p2p latency."""

    compiled: CompiledSchedule
    engine: str
    start: list[float]
    end: list[float]
    dur: list[float]
    lat1: list[float]
    lat2: list[float]
    arrivals: list[float] | None
    comm: tuple[CommInterval, ...]
    transfers: list[tuple[int, float, float]] | None = None  # (2 * position + input, start_s, end_s)
    events: int = 0  # events the event loop processed (0 for the walk)
    holding: tuple[int, ...] = ()  # indices into `comm` of the tasks that block their rank's compute
    # the runtime walks (sim/p2p_walk.py): the action whose end set each action's start (-1: none or a comm task),
    # and each send's transfer on its sender (rank, SEND_F/SEND_B action, start_s, end_s), which holds the sender
    pred: list[int] | None = None
    sends: tuple[tuple[int, Action, float, float], ...] = ()

    def arrival(self, p: int, j: int) -> float:
        """When input j (0 or 1) of position p was ready on p's rank (seconds); 0.0 when p has no such input."""
        if self.arrivals is not None:
            return self.arrivals[2 * p + j]
        cs = self.compiled
        d = cs.dep1[p] if j == 0 else cs.dep2[p]
        if d >= cs.n:
            return 0.0
        return self.end[d] + (self.lat1[p] if j == 0 else self.lat2[p])

    def transfer_list(self) -> list[tuple[int, Action, float, float]]:
        """(receiving rank, RECV_F/RECV_B action of the consuming stage, start_s, end_s) of each p2p transfer that
        takes time; under the runtime walks also (sending rank, SEND_F/SEND_B of the producing stage, ...), since
        their sends hold the sender until the transfer ends."""
        cs = self.compiled
        if self.transfers is not None:
            slots = self.transfers
        else:
            slots = [(2 * p + j, self.end[d], self.end[d] + lat[p]) for j, dep, lidx, lat in
                     ((0, cs.dep1, cs.lidx1, self.lat1), (1, cs.dep2, cs.lidx2, self.lat2))
                     for p in range(cs.n) if lidx[p] >= 0 and lat[p] > 0.0 and not (j and p in cs.pairs)
                     for d in (dep[p],)]
        out = []
        for x, s, e in slots:
            if e > s:
                a = cs.acts[x >> 1]
                kind: Kind = "RECV_F" if a.kind == "F" else "RECV_B"
                out.append((cs.rank_of[x >> 1], Action(a.stage, kind, a.microbatch), s, e))
        return out + list(self.sends)


def make_result(run: RunData) -> SimResult:
    """SimResult of an engine's raw output: step = latest end of any compute action or comm task (seconds)."""
    cs = run.compiled
    ends = [max(run.end[lo:hi], default=0.0) for lo, hi in zip(cs.lo, cs.hi, strict=True)]
    step = max([*ends, *(c[3] for c in run.comm), 0.0])
    busy = tuple(sum(run.dur[lo:hi]) for lo, hi in zip(cs.lo, cs.hi, strict=True))
    return SimResult(cs.schedule, run.engine, step, busy, run)


def label(a: Action) -> str:
    """Display name of an action: 'F s2 mb5', 'RECV_B s3 mb0'."""
    return f"{a.kind} s{a.stage} mb{a.microbatch}"


@dataclass(frozen=True, eq=False)
class SimResult:
    """Step time (s), busy seconds per rank, and derived views (timeline, exposed comm, critical path ...)."""

    schedule: Schedule
    engine: str
    step_time_s: float
    busy_s: tuple[float, ...]
    run: RunData = field(repr=False)

    @property
    def n_ranks(self) -> int:
        return len(self.busy_s)

    @cached_property
    def timeline(self) -> tuple[tuple[TimelineEntry, ...], ...]:
        """Per rank, every interval sorted by (start_s, stream): compute actions, p2p receives, comm tasks."""
        cs, run = self.run.compiled, self.run
        per: list[list[TimelineEntry]] = [[] for _ in range(self.n_ranks)]
        for p in range(cs.n):
            a = cs.acts[p]
            per[cs.rank_of[p]].append(TimelineEntry(a, run.start[p], run.end[p], "compute", label(a)))
        for r, a, s, e in run.transfer_list():
            per[r].append(TimelineEntry(a, s, e, "p2p", label(a)))
        for r, name, s, e, _ in run.comm:
            per[r].append(TimelineEntry(None, s, e, "comm", name))
        order = {"compute": 0, "p2p": 1, "comm": 2}
        return tuple(tuple(sorted(x, key=lambda e: (e.start_s, order[e.stream]))) for x in per)

    @cached_property
    def exposed_comm_s(self) -> tuple[float, ...]:
        """Per rank, seconds when a receive or comm task is in flight and the rank computes nothing."""
        cs, run = self.run.compiled, self.run
        comm: list[list[tuple[float, float]]] = [[] for _ in range(self.n_ranks)]
        for r, _, s, e in run.transfer_list():
            comm[r].append((s, e))
        for r, _, s, e, _ in run.comm:
            comm[r].append((s, e))
        out = []
        for r in range(self.n_ranks):
            busy = list(zip(run.start[cs.lo[r]:cs.hi[r]], run.end[cs.lo[r]:cs.hi[r]], strict=True))
            out.append(uncovered_length(union_intervals(comm[r]), busy))
        return tuple(out)

    @cached_property
    def bubble_s(self) -> tuple[float, ...]:
        """Per rank, seconds with neither compute nor communication in flight."""
        return tuple(max(0.0, self.step_time_s - b - x) for b, x in zip(self.busy_s, self.exposed_comm_s,
                                                                          strict=True))

    @property
    def bubble_ratio(self) -> float:
        """1 - sum(busy) / (ranks * step): Primus pp_vis's bubble ratio (exposed comm counts as bubble)."""
        if self.step_time_s <= 0.0:
            return 0.0
        return 1.0 - sum(self.busy_s) / (self.n_ranks * self.step_time_s)

    @cached_property
    def critical_path(self) -> tuple[Action, ...]:
        """Compute actions on a longest path, in time order: each one's start is set by its predecessor (the
        previous action on its rank or a producer on another rank; under the runtime walks, RunData.pred: also a
        peer whose post a call waited for)."""
        cs, run = self.run.compiled, self.run
        if cs.n == 0:
            return ()
        p = max(range(cs.n), key=lambda q: (run.end[q], -q))
        i_last = max(range(len(run.comm)), key=lambda i: run.comm[i][3], default=-1)
        if i_last >= 0 and run.comm[i_last][3] > run.end[p]:
            p = _comm_origin(run.comm, i_last, run.end)
        path = [p]
        while True:
            s = run.start[p]
            if run.pred is not None and run.pred[p] >= 0:  # the runtime walks say which action set the start
                p = run.pred[p]
                path.append(p)
                continue
            nxt = -1
            for j, dep in ((0, cs.dep1), (1, cs.dep2)):
                if dep[p] < cs.n and run.arrival(p, j) == s:
                    nxt = dep[p]
                    break
            if nxt < 0 and p > cs.lo[cs.rank_of[p]] and run.end[p - 1] == s:
                nxt = p - 1
            if nxt < 0:  # held by a comm task that blocks compute: continue from the action at its root
                held = [i for i in run.holding if run.comm[i][0] == cs.rank_of[p] and run.comm[i][4] < p
                        and run.comm[i][3] == s]
                nxt = _comm_origin(run.comm, held[0], run.end) if held else -1
            if nxt < 0:
                break
            path.append(nxt)
            p = nxt
        return tuple(cs.acts[q] for q in reversed(path))

    @cached_property
    def peak_in_flight(self) -> tuple[int, ...]:
        """Per rank, the most microbatches whose F is done and whose B (or I) is not: stashed activations."""
        out = []
        for acts in self.schedule.actions:
            live = peak = 0
            for a in acts:
                if a.kind == "F":
                    live += 1
                    peak = max(peak, live)
                elif a.kind in ("B", "I"):
                    live -= 1
            out.append(peak)
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (seconds)."""
        return {
            "schedule": self.schedule.name, "engine": self.engine, "pp": self.schedule.n_ranks,
            "stages": self.schedule.n_stages, "microbatches": self.schedule.n_microbatches,
            "step_time_s": self.step_time_s, "bubble_ratio": self.bubble_ratio,
            "ranks": [{"rank": r, "busy_s": self.busy_s[r], "bubble_s": self.bubble_s[r],
                       "exposed_comm_s": self.exposed_comm_s[r], "peak_in_flight": self.peak_in_flight[r]}
                      for r in range(self.n_ranks)],
            "critical_path": [str(a) for a in self.critical_path],
        }


def _comm_origin(comm: tuple[CommInterval, ...], i: int, end: list[float]) -> int:
    """The action at the root of comm task i: the action it follows, or, when the task waited for the previous task
    on its stream, that task's root."""
    while True:
        r, _, s, _, after = comm[i]
        if end[after] == s:
            return after
        prev = [k for k in range(i) if comm[k][0] == r and comm[k][3] == s]
        if not prev:
            return after
        i = prev[-1]


def union_intervals(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge intervals (start, end) into disjoint ones sorted by start; empty ones are dropped."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(iv):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def uncovered_length(iv: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Length of the union `iv` not covered by `cover` (disjoint intervals sorted by start)."""
    total = 0.0
    j = 0
    for s, e in iv:
        while j < len(cover) and cover[j][1] <= s:
            j += 1
        t = s
        k = j
        while k < len(cover) and cover[k][0] < e:
            cs, ce = cover[k]
            if cs > t:
                total += cs - t
            t = max(t, ce)
            k += 1
        if e > t:
            total += e - t
    return total
