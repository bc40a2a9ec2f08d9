"""Priced pipeline work: seconds per virtual stage and action kind, p2p seconds per stage boundary, extra comm tasks.

All times are seconds. Stage s is the virtual stage index of `Schedule` (data-flow order). A split backward is I
(input gradient) then W (weight gradient); a full backward B costs I + W, so `b_s[s] == i_s[s] + w_s[s]` always.
Boundary k sits between stages k and k+1: `p2p_fwd_s[k]` is the activation send k -> k+1, `p2p_bwd_s[k]` the
gradient send k+1 -> k. A p2p time is only paid when the two stages live on different ranks.

`CommTask` is extra communication on a rank's own comm stream (e.g. the DP reduce-scatter of a stage's gradients
after its last backward): it starts when the action it follows has finished and the previous task on the same stream
is done, and it overlaps compute. A task with `blocks_compute` also holds the rank's compute stream: no later action of
that rank starts before it ends (the compute stream waits on its event, as FSDP2's final post-backward callback makes
`current_stream().wait_event(...)` on the reduce-scatter of a stage's last backward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from projection.schedule.action import Action, Schedule


@dataclass(frozen=True, slots=True)
class CommTask:
    """`duration_s` of communication on `rank`'s comm stream, issued after `after` (an action of that rank) ends."""

    rank: int
    after: Action
    duration_s: float
    label: str = "comm"
    shares_nic: bool = True  # in the event loop's "nic" link mode, the task queues on the rank's NIC with p2p sends
    blocks_compute: bool = False  # the rank's actions after `after` wait for this task to end


@dataclass(frozen=True)
class StageCosts:
    """Seconds per virtual stage for F, I and W (B = I + W), p2p seconds per boundary, and extra comm tasks."""

    f_s: tuple[float, ...]
    i_s: tuple[float, ...]
    w_s: tuple[float, ...]
    p2p_fwd_s: tuple[float, ...]
    p2p_bwd_s: tuple[float, ...]
    comm_tasks: tuple[CommTask, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.f_s)
        if n < 1 or len(self.i_s) != n or len(self.w_s) != n:
            raise ValueError(f"f_s, i_s, w_s need one entry per virtual stage ({n}, {len(self.i_s)}, {len(self.w_s)})")
        if len(self.p2p_fwd_s) != n - 1 or len(self.p2p_bwd_s) != n - 1:
            raise ValueError(f"p2p_fwd_s and p2p_bwd_s need n_stages - 1 = {n - 1} entries (one per boundary)")
        for name in ("f_s", "i_s", "w_s", "p2p_fwd_s", "p2p_bwd_s"):
            for x in getattr(self, name):
                if not x >= 0.0 or x == float("inf"):
                    raise ValueError(f"{name} holds {x!r}: seconds must be finite and >= 0")
        for t in self.comm_tasks:
            if not t.duration_s >= 0.0:
                raise ValueError(f"comm task {t.label!r} has duration {t.duration_s!r}: seconds must be >= 0")

    @property
    def n_stages(self) -> int:
        return len(self.f_s)

    @property
    def b_s(self) -> tuple[float, ...]:
        """Full backward seconds per stage: I + W."""
        return tuple(i + w for i, w in zip(self.i_s, self.w_s, strict=True))

    @staticmethod
    def from_lists(f_s: Sequence[float], b_s: Sequence[float], w_s: Sequence[float] | None = None,
                   p2p_fwd_s: Sequence[float] | float = 0.0, p2p_bwd_s: Sequence[float] | float | None = None,
                   comm_tasks: Sequence[CommTask] = ()) -> StageCosts:
        """Per-stage F and full-B seconds; `w_s` is the W share of B (default half of B, the 50/50 split Primus
        uses for zero-bubble schedules, primus-projection.md §8.2). p2p: one number for every boundary or a list;
        the backward p2p defaults to the forward one."""
        n = len(f_s)
        ws = [0.5 * b for b in b_s] if w_s is None else list(w_s)
        if len(b_s) != n or len(ws) != n:
            raise ValueError(f"f_s, b_s and w_s need the same length ({n}, {len(b_s)}, {len(ws)})")
        if any(w > b for w, b in zip(ws, b_s, strict=True)):
            raise ValueError("w_s is the weight-gradient part of b_s: it must not exceed b_s")
        fwd = _per_boundary(p2p_fwd_s, n)
        bwd = fwd if p2p_bwd_s is None else _per_boundary(p2p_bwd_s, n)
        i_s = tuple(float(b) - float(w) for b, w in zip(b_s, ws, strict=True))
        return StageCosts(tuple(float(x) for x in f_s), i_s, tuple(float(w) for w in ws), fwd, bwd, tuple(comm_tasks))

    @staticmethod
    def uniform(n_stages: int, f_s: float, b_s: float, w_s: float | None = None, p2p_s: float = 0.0) -> StageCosts:
        """Every virtual stage costs the same: F `f_s`, full backward `b_s` (of which W `w_s`, default b/2)."""
        w = 0.5 * b_s if w_s is None else w_s
        return StageCosts.from_lists([f_s] * n_stages, [b_s] * n_stages, [w] * n_stages, p2p_s)

    def with_comm_tasks(self, tasks: Sequence[CommTask]) -> StageCosts:
        return StageCosts(self.f_s, self.i_s, self.w_s, self.p2p_fwd_s, self.p2p_bwd_s, tuple(tasks))


def _per_boundary(x: Sequence[float] | float, n_stages: int) -> tuple[float, ...]:
    if isinstance(x, int | float):
        return (float(x),) * (n_stages - 1)
    if len(x) != n_stages - 1:
        raise ValueError(f"p2p needs n_stages - 1 = {n_stages - 1} boundary entries, got {len(x)}")
    return tuple(float(v) for v in x)


def grad_sync_tasks(schedule: Schedule, seconds_per_stage: Sequence[float],
                    label: str = "dp_rs") -> tuple[CommTask, ...]:
    """One comm task per virtual stage (e.g. the DP reduce-scatter of its gradients) after that stage's last backward
    action (the last W, or the last B when the stage does not split its backward) on its rank."""
    tasks = []
    for rank, acts in enumerate(schedule.actions):
        last: dict[int, int] = {}
        for pos, a in enumerate(acts):
            if a.kind in ("B", "W"):
                last[a.stage] = pos
        for pos in sorted(last.values()):
            a = acts[pos]
            tasks.append(CommTask(rank, a, float(seconds_per_stage[a.stage]), f"{label} s{a.stage}"))
    return tuple(tasks)
