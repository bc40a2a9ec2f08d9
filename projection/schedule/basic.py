"""GPipe and 1F1B: one stage per rank (GPipe also runs several stages per rank as looped breadth-first).

GPipe (Huang et al. 2019): every rank runs all forwards, then all backwards. The microbatch order is
torch.distributed.pipelining's: `ScheduleGPipe` (one stage per rank) runs backwards in microbatch order 0..m-1;
with vpp > 1 stages per rank it is `ScheduleLoopedBFS` (Lamy-Poirier 2022, breadth-first): forwards stage by stage
in ascending order, then backwards stage by stage in descending order, microbatches last-to-first.

1F1B (PipeDream-Flush, Narayanan et al. 2021; Megatron `forward_backward_pipelining_without_interleaving`): rank r
runs min(pp - r - 1, m) warm-up forwards, then alternates one forward and one backward (forward first) until the
forwards run out, then the remaining backwards. torch's `Schedule1F1B` executes the same order (its loop is written
as warm-up min(pp - r, m) forwards, then backward-forward pairs: the same sequence) but requires m >= pp.
Peak in-flight microbatches on rank r: min(pp - r, m).
"""

from __future__ import annotations

from projection.schedule.action import Action, Schedule
from projection.schedule.builders import act, looped_placement, make_schedule, require_positive


def gpipe(pp: int, n_microbatches: int, vpp: int = 1) -> Schedule:
    """GPipe (vpp = 1) or looped breadth-first (vpp > 1): all forwards, then all backwards."""
    require_positive(pp, n_microbatches, vpp)
    m = n_microbatches
    per_rank: list[list[Action]] = []
    for r in range(pp):
        stages = [c * pp + r for c in range(vpp)]
        ops = [act(s, "F", mb) for s in stages for mb in range(m)]
        if vpp == 1:
            ops += [act(r, "B", mb) for mb in range(m)]
        else:
            ops += [act(s, "B", mb) for s in reversed(stages) for mb in reversed(range(m))]
        per_rank.append(ops)
    return make_schedule("gpipe", looped_placement(pp, vpp), m, per_rank)


def one_f_one_b_rank(rank: int, pp: int, n_microbatches: int) -> list[Action]:
    """The 1F1B action list of one rank (stage = rank)."""
    m = n_microbatches
    warmup = min(pp - rank - 1, m)
    ops = [act(rank, "F", mb) for mb in range(warmup)]
    for k in range(m - warmup):
        ops.append(act(rank, "F", warmup + k))
        ops.append(act(rank, "B", k))
    ops += [act(rank, "B", mb) for mb in range(m - warmup, m)]
    return ops


def one_f_one_b(pp: int, n_microbatches: int) -> Schedule:
    """1F1B (PipeDream-Flush) over pp ranks, one stage each."""
    require_positive(pp, n_microbatches, 1)
    per_rank = [one_f_one_b_rank(r, pp, n_microbatches) for r in range(pp)]
    return make_schedule("1f1b", looped_placement(pp, 1), n_microbatches, per_rank,
                         warmup=[min(pp - r - 1, n_microbatches) for r in range(pp)])
