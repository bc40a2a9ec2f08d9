"""Heap-based discrete-event loop: compute and communication on separate streams per rank, sharing links.

Per rank: one compute stream (the schedule's actions, in order) and one comm stream (costs.CommTask, in the order
given). Every input produced on another rank is a p2p transfer of its boundary's p2p seconds, which occupies a link:
  links="none"  no sharing: a transfer only delays (then the result equals dag.walk exactly);
  links="pair"  one link per ordered (sender, receiver) rank pair: transfers on it run one at a time, FIFO;
  links="nic"   one egress NIC per sending rank: all its sends, and its comm tasks with `shares_nic`, run one at a
                time, FIFO (e.g. a DP reduce-scatter delays the PP activation sends queued behind it).
A compute action starts when its stream is free, every input has arrived and every earlier comm task of its rank that
blocks compute (CommTask.blocks_compute) has ended. Events are keyed (time_s, seq, kind,
index) so ties resolve in creation order: deterministic. All state lives in one _Loop object (SimPy's design).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Literal

from projection.errors import ConfigError, Problem
from projection.schedule.action import Schedule
from projection.sim.costs import StageCosts
from projection.sim.dag import (
    CompiledSchedule,
    blocking_tasks,
    check_costs,
    compile_schedule,
    deadlock,
    duration_table,
    latency_table,
    task_position,
)
from projection.sim.result import CommInterval, RunData, SimResult, make_result

Links = Literal["none", "pair", "nic"]
_DONE, _ARRIVED, _COMM_DONE = 0, 1, 2


class _Loop:
    """State of one simulation. Positions and input slots (2 * position + input) follow CompiledSchedule."""

    def __init__(self, cs: CompiledSchedule, costs: StageCosts, links: Links):
        self.cs = cs
        n = cs.n
        dtab = duration_table(costs)
        ltab = latency_table(costs)
        self.dur = [dtab[c] for c in cs.cidx]
        self.lat1 = [ltab[i] for i in cs.lidx1]
        self.lat2 = [ltab[i] for i in cs.lidx2]
        self.start = [0.0] * n
        self.end = [-1.0] * (n + 1)
        self.end[n] = 0.0
        self.arr = [0.0] * (2 * n)  # arrival of each input; -1 while a cross-rank input is in flight
        self.slot2 = [2 * p + 1 for p in range(n)]  # the slot input 2 is read from (the B's, for an overlapped F)
        self.xcons = [-1] * (n + 1)  # producer position -> the input slot it feeds on another rank
        self.xmore: dict[int, list[int]] = {}  # further slots, for a producer feeding several ranks
        for p in range(n):
            for x, d, li in ((2 * p, cs.dep1[p], cs.lidx1[p]), (2 * p + 1, cs.dep2[p], cs.lidx2[p])):
                if li < 0:
                    continue
                self.arr[x] = -1.0
                if x & 1 and p in cs.pairs:
                    self.slot2[p] = 2 * cs.pairs[p] + 1
                elif self.xcons[d] < 0:
                    self.xcons[d] = x
                else:
                    self.xmore.setdefault(d, []).append(x)
        n_ranks = len(cs.lo)
        self.ptr = list(cs.lo)
        self.busy = [False] * n_ranks
        self.links = links
        self.link_busy: dict[int, bool] = {}
        self.link_queue: dict[int, deque[int]] = {}
        self.xfer: list[tuple[int, float, float]] = []
        self.xfer_start = [0.0] * (2 * n)
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.n_events = 0
        # comm streams
        self.tasks = costs.comm_tasks
        self.task_after = [task_position(cs, t) for t in self.tasks]
        self.stream_tasks: list[list[int]] = [[] for _ in range(n_ranks)]
        for i, t in enumerate(self.tasks):
            self.stream_tasks[t.rank].append(i)
        self.waiting_tasks: dict[int, list[int]] = {}
        for i, p in enumerate(self.task_after):
            self.waiting_tasks.setdefault(p, []).append(i)
        self.comm_ptr = [0] * n_ranks
        self.comm_busy = [False] * n_ranks
        self.comm_start = [0.0] * len(self.tasks)
        self.comm_out: dict[int, CommInterval] = {}
        self.holds = [sorted(h) for h in blocking_tasks(cs, costs)]  # (after position, task) per rank
        self.hold_ptr = [0] * n_ranks

    def push(self, t: float, kind: int, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, i))

    def try_start(self, r: int, t: float) -> None:
        """Start rank r's next action at t if its compute stream is free and its inputs have arrived."""
        p = self.ptr[r]
        if self.busy[r] or p >= self.cs.hi[r]:
            return
        if self.arr[2 * p] < 0.0 or self.arr[self.slot2[p]] < 0.0:
            return
        end = self.end
        if end[self.cs.dep1[p]] < 0.0 or end[self.cs.dep2[p]] < 0.0:
            return  # a same-rank input not yet produced: only in a deadlocked schedule
        holds, k = self.holds[r], self.hold_ptr[r]
        while k < len(holds) and holds[k][0] < p:
            if holds[k][1] not in self.comm_out:
                return  # the compute stream waits for a blocking comm task (CommTask.blocks_compute)
            k += 1
        self.hold_ptr[r] = k
        self.start[p] = t
        self.busy[r] = True
        self.ptr[r] = p + 1
        self.push(t + self.dur[p], _DONE, p)

    def link_of(self, x: int) -> int:
        """Link index of the transfer feeding input slot x (or of comm task -(x + 1))."""
        cs = self.cs
        if x < 0:
            return self.tasks[-x - 1].rank
        p = x >> 1
        src = cs.rank_of[cs.dep1[p] if x & 1 == 0 else cs.dep2[p]]
        return src if self.links == "nic" else src * len(cs.lo) + cs.rank_of[p]

    def request_link(self, x: int, t: float) -> None:
        if self.links == "none":
            self.begin(x, t)
            return
        link = self.link_of(x)
        if self.link_busy.get(link, False):
            self.link_queue.setdefault(link, deque()).append(x)
        else:
            self.link_busy[link] = True
            self.begin(x, t)

    def begin(self, x: int, t: float) -> None:
        if x < 0:
            i = -x - 1
            self.comm_start[i] = t
            self.push(t + self.tasks[i].duration_s, _COMM_DONE, i)
        else:
            self.xfer_start[x] = t
            self.push(t + (self.lat1[x >> 1] if x & 1 == 0 else self.lat2[x >> 1]), _ARRIVED, x)

    def release_link(self, x: int, t: float) -> None:
        if self.links == "none" or (x < 0 and (self.links != "nic" or not self.tasks[-x - 1].shares_nic)):
            return
        link = self.link_of(x)
        q = self.link_queue.get(link)
        if q:
            self.begin(q.popleft(), t)
        else:
            self.link_busy[link] = False

    def try_comm(self, r: int, t: float) -> None:
        """Issue rank r's next comm task at t if its comm stream is free and the action it follows is done."""
        k = self.comm_ptr[r]
        if self.comm_busy[r] or k >= len(self.stream_tasks[r]):
            return
        i = self.stream_tasks[r][k]
        if self.end[self.task_after[i]] < 0.0:
            return
        self.comm_busy[r] = True
        self.comm_ptr[r] = k + 1
        if self.links == "nic" and self.tasks[i].shares_nic:
            self.request_link(-i - 1, t)
        else:
            self.begin(-i - 1, t)

    def run(self) -> None:
        cs = self.cs
        for r in range(len(cs.lo)):
            self.try_start(r, 0.0)
        heap = self.heap
        pop = heapq.heappop
        end, xcons, rank_of = self.end, self.xcons, cs.rank_of
        waiting = self.waiting_tasks
        while heap:
            t, _, kind, i = pop(heap)
            self.n_events += 1
            if kind == _DONE:
                end[i] = t
                r = rank_of[i]
                self.busy[r] = False
                x = xcons[i]
                if x >= 0:
                    self.request_link(x, t)
                    if i in self.xmore:
                        for x in self.xmore[i]:
                            self.request_link(x, t)
                if i in waiting:
                    self.try_comm(r, t)
                self.try_start(r, t)
            elif kind == _ARRIVED:
                self.arr[i] = t
                self.xfer.append((i, self.xfer_start[i], t))
                self.release_link(i, t)
                self.try_start(rank_of[i >> 1], t)
            else:
                task = self.tasks[i]
                self.comm_out[i] = (task.rank, task.label, self.comm_start[i], t, self.task_after[i])
                self.comm_busy[task.rank] = False
                self.release_link(-i - 1, t)
                self.try_comm(task.rank, t)
                if task.blocks_compute:
                    self.try_start(task.rank, t)


def simulate_events(schedule: Schedule | CompiledSchedule, costs: StageCosts, *, links: Links = "none") -> SimResult:
    """Event-loop simulation. With links="none" it reproduces dag.walk (same floats, same timeline)."""
    if links not in ("none", "pair", "nic"):
        raise ConfigError(Problem(f"unknown link model {links!r}", key="links", fix="use none, pair or nic"))
    cs = schedule if isinstance(schedule, CompiledSchedule) else compile_schedule(schedule)
    check_costs(cs, costs)
    loop = _Loop(cs, costs, links)
    loop.run()
    if any(loop.ptr[r] < cs.hi[r] for r in range(len(cs.lo))):
        raise deadlock(cs, loop.ptr, loop.end)
    del loop.end[cs.n]
    for pf, pb in cs.pairs.items():
        loop.arr[2 * pf + 1] = loop.arr[2 * pb + 1]
    comm = tuple(loop.comm_out[i] for i in range(len(loop.tasks)))
    run = RunData(cs, f"des:{links}", loop.start, loop.end, loop.dur, loop.lat1, loop.lat2, loop.arr, comm, loop.xfer,
                  loop.n_events, tuple(i for h in loop.holds for _, i in h))
    return make_result(run)
