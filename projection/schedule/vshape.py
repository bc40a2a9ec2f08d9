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

V-Half and V-Min: the paper's activation caps, (pp + 2) // 2 and (pp + 4) // 3 microbatches of full-stage activation
(2x that in chunk activations; table 1 of the paper and the authors' scheduler playground). Their orders are
re-derived here by a deterministic unit-time list scheduler, not copied from the authors' builders: time advances in
units (T_F = T_I = T_W = 1 per chunk); at each unit every idle rank starts, in priority order, I of chunk 1, I of
chunk 0, F of chunk 1, F of chunk 0, else a pending W (oldest first). Memory is counted in half chunk activations:
F adds 2, I frees 1 and W the other 1 (the inputs of linear layers stay until W). F of chunk 1 needs 2 free units,
F of chunk 0 needs 4 (it keeps room for the same microbatch's chunk-1 forward, which makes the greedy deadlock
free). Unit-time bubbles with m = 4pp, pp = 4 / 8 / 16: V-Half 0.05 / 0.12 / 0.16 (paper: about pp/2m = 0.125),
V-Min 0.26 / 0.14 / 0.26 (paper: about 2pp/3m = 0.167); ZB-V 0.03 / 0.04 / 0.04. Orders differ from the authors'.
"""

from __future__ import annotations

from projection.schedule.action import Action, Kind, Schedule
from projection.schedule.builders import act, make_schedule, require_positive, v_placement


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


def _greedy_v(pp: int, m: int, cap_chunks: int) -> list[list[Action]]:
    """Unit-time list scheduling of the V placement under `cap_chunks` chunk activations per rank (see module doc)."""
    n_st = 2 * pp
    cap = 2 * cap_chunks
    f_done: dict[tuple[int, int], int] = {}  # (stage, mb) -> finish time of F
    i_done: dict[tuple[int, int], int] = {}  # (stage, mb) -> finish time of I
    nf = [0] * n_st
    ni = [0] * n_st
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    mem = [0] * pp
    ops: list[list[Action]] = [[] for _ in range(pp)]
    remaining = 3 * n_st * m
    t = 0
    while remaining:
        started = False
        for r in range(pp):
            s0, s1 = r, n_st - 1 - r
            choice: tuple[int, Kind, int] | None = None
            for s in (s1, s0):  # I: chunk 1 first
                k = ni[s]
                if k < nf[s] and (i_done.get((s + 1, k), t + 1) if s + 1 < n_st else f_done[s, k]) <= t:
                    choice = (s, "I", k)
                    break
            if choice is None:
                for s, need in ((s1, 2), (s0, 4)):  # F: chunk 1 first
                    k = nf[s]
                    if k < m and mem[r] + need <= cap and (s == 0 or f_done.get((s - 1, k), t + 1) <= t):
                        choice = (s, "F", k)
                        break
            if choice is None and pending_w[r]:
                s, k = pending_w[r].pop(0)
                choice = (s, "W", k)
            if choice is None:
                continue
            s, kind, k = choice
            ops[r].append(act(s, kind, k))
            started = True
            remaining -= 1
            if kind == "F":
                nf[s] += 1
                f_done[s, k] = t + 1
                mem[r] += 2
            elif kind == "I":
                ni[s] += 1
                i_done[s, k] = t + 1
                pending_w[r].append((s, k))
                mem[r] -= 1
            else:
                mem[r] -= 1
        assert started, f"V greedy scheduler stalled at t={t} (pp={pp}, m={m}, cap={cap_chunks})"
        t += 1
    return ops


def v_half(pp: int, n_microbatches: int) -> Schedule:
    """V-Half: about half of 1F1B's activation memory, (pp + 2) // 2 microbatches."""
    require_positive(pp, n_microbatches, 2)
    per_rank = _greedy_v(pp, n_microbatches, 2 * ((pp + 2) // 2))
    return make_schedule("v_half", v_placement(pp), n_microbatches, per_rank)


def v_min(pp: int, n_microbatches: int) -> Schedule:
    """V-Min: about a third of 1F1B's activation memory, (pp + 4) // 3 microbatches."""
    require_positive(pp, n_microbatches, 2)
    per_rank = _greedy_v(pp, n_microbatches, 2 * ((pp + 4) // 3))
    return make_schedule("v_min", v_placement(pp), n_microbatches, per_rank)
