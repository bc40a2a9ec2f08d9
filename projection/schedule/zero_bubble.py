"""Zero-bubble ZB-H1 and ZB-H2 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", ICLR 2024): one stage per rank,
backward split into I (input gradient, on the critical path) and W (weight gradient, schedulable anywhere after I).

Both orders are hand-crafted patterns re-derived from the paper (section 3, figure 3) and checked by unit-time
simulation with T_F = T_I = T_W (tests/unit/test_schedules.py):

ZB-H1 ("1x memory"): the 1F1B order with every B replaced by I, and rank r deferring its first r W passes, which
then fill the cool-down bubbles; each rank runs one W after each I once r I passes are ahead. Peak in-flight
microbatches (F run, I not yet) on rank r: min(pp - r, m), as 1F1B. Bubble (pp-1)(T_F + T_I - T_W), a third of
1F1B's when all passes take the same time: makespan 3m + pp - 1 units. This is the order torch 2.13's
`ScheduleInterleavedZeroBubble` generates with one stage per rank (tests/oracle/test_schedules_vs_torch.py).

ZB-H2 ("2x memory"): rank r runs min(2(pp - r) - 1, m) warm-up forwards, exactly enough to fill the time until its
first I can arrive, then repeats (I, W, F), deferring its first 2r W passes to the tail (at most m minus its warm-up,
which keeps small m no slower than ZB-H1); with m >= 2pp every rank is then busy without a gap for its 3m units (the
schedule is a parallelogram, bubble (pp-1)(T_F + T_I - 2 T_W) = 0 apart from the start-up skew). Peak in-flight
microbatches on rank r: min(2(pp - r) - 1, m), i.e. 2pp - 1 on the first rank.
"""

from __future__ import annotations

from projection.schedule.action import Action, Schedule
from projection.schedule.builders import act, looped_placement, make_schedule, require_positive


def _zb_rank(rank: int, m: int, warmup: int, deferred: int, pattern: str) -> list[Action]:
    """Warm-up forwards, then per step the passes in `pattern` (from "F", "I", "W"), W only after `deferred` steps."""
    ops = [act(rank, "F", mb) for mb in range(warmup)]
    nf, ni, nw, step = warmup, 0, 0, 0
    while ni < m:
        for kind in pattern:
            if kind == "F" and nf < m:
                ops.append(act(rank, "F", nf))
                nf += 1
            elif kind == "I":
                ops.append(act(rank, "I", ni))
                ni += 1
            elif kind == "W" and step >= deferred:
                ops.append(act(rank, "W", nw))
                nw += 1
        step += 1
    ops += [act(rank, "W", mb) for mb in range(nw, m)]
    return ops


def zb_h1(pp: int, n_microbatches: int) -> Schedule:
    """ZB-H1: 1F1B memory, W passes deferred r steps on rank r to fill the cool-down."""
    require_positive(pp, n_microbatches, 1)
    m = n_microbatches
    per_rank = [_zb_rank(r, m, min(pp - r - 1, m), r, "FIW") for r in range(pp)]
    return make_schedule("zb_h1", looped_placement(pp, 1), m, per_rank)


def zb_h2(pp: int, n_microbatches: int) -> Schedule:
    """ZB-H2: 2pp-1 warm-up forwards on the first rank, W passes deferred up to 2r steps on rank r (parallelogram)."""
    require_positive(pp, n_microbatches, 1)
    m = n_microbatches
    per_rank = []
    for r in range(pp):
        warmup = min(2 * (pp - r) - 1, m)
        per_rank.append(_zb_rank(r, m, warmup, min(2 * r, m - warmup), "IWF"))
    return make_schedule("zb_h2", looped_placement(pp, 1), m, per_rank)
