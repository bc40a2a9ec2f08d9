"""V-shaped schedules (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", NeurIPS 2024): two stages
per rank placed in a V (rank r holds stage r, "chunk 0", and stage 2pp-1-r, "chunk 1"), backward split into I and W.

ZB-V (V-ZB in that paper; first given in Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241 section 6):
the hand-crafted order as torch.distributed.pipelining 2.13 generates it (`ScheduleZBVZeroBubble`), re-derived
phase by phase. Rank r, n = max(m, 2pp - 1) microbatches:
  1. 2(pp - r) - 1 forwards of chunk 0;
  2. r times (F chunk 1, F chunk 0);
  3. pp - r times (F, I, W of chunk 1);
  4. steady state, while chunk 1 lags chunk 0 or chunk 0 has forwards left: [F chunk 0 if any left], I and W of
     chunk 0, then F, I and W of chunk 1;
  5. cool-down: r times (I chunk 0, I chunk 1), pp - r times (I chunk 0, W chunk 0), then the remaining W of
     chunk 1, then those of chunk 0.
Actions on microbatches >= m (present when m < 2pp - 1) are dropped. Peak in-flight chunk activations on a rank:
2pp (= pp full-stage microbatches, as 1F1B).

V-Half and V-Min: the orders AMD Primus runs (`zbv_greedy.PipelineGraph` with fixed unit costs, from the authors'
sail-sg/zero-bubble-pipeline-parallelism), re-implemented in projection/schedule/v_greedy.py: a stable pattern of
6 unit slots per microbatch, squeezed twice under the pattern's own activation peak, W placed in the free slots.
The order does not depend on the pass costs (Primus builds it at F = B = W). Activation caps of the papers' table 1,
(pp + 2) // 2 and (pp + 4) // 3 microbatches of full-stage activation (2x that in chunk activations), hold for
these orders when W frees its half of a chunk activation (2 * live + pending W <= 2 * cap; tests). Unit-time
bubbles with m = 4pp, pp = 4 / 8: V-Half 0.05 / 0.08, V-Min 0.10 / 0.12 (paper: about pp/2m = 0.125 and
2pp/3m = 0.167). Any m >= 1 builds (Primus puts no bound on the microbatch count for these setups).
"""

from __future__ import annotations

from projection.schedule.action import Action, Kind, Schedule
from projection.schedule.builders import act, make_schedule, require_positive, v_placement
from projection.schedule.v_greedy import MemSetup, v_orders


def _zbv_rank(rank: int, pp: int, m: int) -> list[Action]:
    return [a for a in zbv_padded(rank, pp, m) if a.microbatch < m]


def zbv_padded(rank: int, pp: int, m: int) -> list[Action]:
    """Rank `rank`'s ZB-V order before the actions on microbatches >= m are dropped: torch's `pipeline_order`
    holds None in their places, so with the rank's leading empty steps action i is at time step rank + i."""
    n = max(m, 2 * pp - 1)
    s0, s1 = rank, 2 * pp - 1 - rank
    ops: list[Action] = []
    count = {(s, k): 0 for s in (s0, s1) for k in ("F", "I", "W")}

    def put(stage: int, kind: Kind) -> None:
        ops.append(act(stage, kind, count[stage, kind]))
        count[stage, kind] += 1

    for _ in range(2 * (pp - rank) - 1):
        put(s0, "F")
    for _ in range(rank):
        put(s1, "F")
        put(s0, "F")
    for _ in range(pp - rank):
        put(s1, "F")
        put(s1, "I")
        put(s1, "W")
    while count[s1, "F"] < count[s0, "F"] or count[s0, "F"] < n:
        if count[s0, "F"] < n:
            put(s0, "F")
        put(s0, "I")
        put(s0, "W")
        put(s1, "F")
        put(s1, "I")
        put(s1, "W")
    for _ in range(rank):
        put(s0, "I")
        put(s1, "I")
    for _ in range(pp - rank):
        put(s0, "I")
        put(s0, "W")
    while count[s1, "W"] < count[s1, "I"]:
        put(s1, "W")
    while count[s0, "W"] < count[s0, "I"]:
        put(s0, "W")
    return ops


def zbv(pp: int, n_microbatches: int) -> Schedule:
    """ZB-V: zero bubble at 1F1B activation memory, two V-placed stages per rank."""
    require_positive(pp, n_microbatches, 2)
    per_rank = [_zbv_rank(r, pp, n_microbatches) for r in range(pp)]
    return make_schedule("zbv", v_placement(pp), n_microbatches, per_rank)


def _v_schedule(name: str, pp: int, m: int, setup: MemSetup) -> Schedule:
    last = 2 * pp - 1
    per_rank = [[act(r if chunk == 0 else last - r, kind, mb) for chunk, kind, mb in order]
                for r, order in enumerate(v_orders(pp, m, setup))]
    return make_schedule(name, v_placement(pp), m, per_rank)


def v_half(pp: int, n_microbatches: int) -> Schedule:
    """V-Half: about half of 1F1B's activation memory, (pp + 2) // 2 microbatches."""
    require_positive(pp, n_microbatches, 2)
    return _v_schedule("v_half", pp, n_microbatches, "half")


def v_min(pp: int, n_microbatches: int) -> Schedule:
    """V-Min: about a third of 1F1B's activation memory, (pp + 4) // 3 microbatches."""
    require_positive(pp, n_microbatches, 2)
    return _v_schedule("v_min", pp, n_microbatches, "min")
