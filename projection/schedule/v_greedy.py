"""The V-Half and V-Min orders that Primus runs: a pattern-then-squeeze construction on the V placement.

Source: Qi, Wan, Huang, Lin, "Pipeline Parallelism with Controllable Memory" (NeurIPS 2024, arXiv 2405.15362),
sections 3-4 (building blocks: a repeating per-microbatch pattern whose lifespan sets the activation memory), as
implemented by the authors in sail-sg/zero-bubble-pipeline-parallelism and shipped by AMD Primus as
primus/backends/megatron/core/pipeline_parallel/zerobubble/scheduler/zbv_greedy.py (`PipelineGraph`, commit
90fa0bd8fa81ff2c1020ec3b411352b07c78f6cd). Primus's runtime.py builds both memory setups ("half", "min") with fixed
costs F = B = W = 1000 and communication 1 ("Use fixed schedule for now"), so the order below ignores measured
costs. This module is our own re-implementation of that published algorithm (checked action for action against an
independent copy, tests/data/primus_v_orders.json), written to run in about linear time.

Terms. Rank r ("stage" in the authors' code) holds chunk 0 = our stage r and chunk 1 = our stage 2pp-1-r. Each
rank runs six passes per microbatch, numbered as the authors number them: 0 F of chunk 0, 1 F of chunk 1, 2 the
input-gradient backward (our I) of chunk 1, 3 I of chunk 0, and the weight-gradient passes W. Time is in unit slots
(every pass takes one slot, transfers take none); a schedule is, per rank and pass kind, the slot of each microbatch.

1. Stable pattern. Microbatch j starts each kind k at first[r][k] + 6j (one microbatch every 6 slots: two F, two I,
   two W). The first slots spread the four non-W kinds so that data flows down the ranks through chunk 0 and back up
   through chunk 1, with a lifespan (F to I) chosen for the memory target: V-Half holds about half of 1F1B's
   activations ((pp + 2) // 2 microbatches on the busiest rank), V-Min about a third ((pp + 4) // 3). See
   `stable_pattern`.
2. W placement. W passes go into the slots that F and I leave empty, oldest pending first; with split W the chunk-1
   W goes before chunk 0's (`place_w`).
3. Memory of a rank: F adds one unit, W frees it, I keeps it. With explicit W slots the peak is the running sum's
   maximum; without them, each empty slot frees one unit if a W is pending (W placed as in step 2). The largest peak
   over the ranks is the bound both squeezes keep.
4. Squeeze (`squeeze`): walk all passes in slot order; move each pass to the earliest free slot after its inputs
   (previous rank's or next rank's same pass, the same rank's preceding kind, the previous microbatch; a W after its
   microbatch's I), provided the rank's peak memory stays within the bound; the passes between the first chunk-0 I
   on rank 0 and the last chunk-0 F stay where they are (the steady state). Pass one counts W explicitly and also
   squeezes the warm-up; pass two drops W, lets memory count implicit W, and squeezes only the cool-down. After
   each pass, slots are recomputed by eager execution: every pass, in slot order, starts as soon as its inputs and
   its rank's previous pass are done.
5. The final order: drop W, place W again split by chunk, and list each rank's passes by slot (the authors' eager
   execution with real costs keeps this order, so costs never change it).

Efficiency: the authors' code re-evaluates a whole rank's memory for each candidate slot and scans every rank's
lists at each step (quadratic in the microbatch count). Here each rank keeps its memory profile per slot and a move
updates only the slots it changes (explicit W: a range add; implicit W: a replay until the old state is met again).
"""

from __future__ import annotations

from bisect import insort
from typing import Literal

MemSetup = Literal["half", "min"]
PassKind = Literal["F", "I", "W"]
Slots = list[list[int]]  # per pass kind, the slot of each microbatch (one rank)

F0, F1, I1, I0, W_ANY = 0, 1, 2, 3, 4  # pass kinds; W_ANY is the merged W list of the squeeze passes
_UPSTREAM = {F0: -1, I1: -1, F1: 1, I0: 1}  # the rank whose same pass feeds this one (-1 previous, +1 next)


def stable_pattern(pp: int, setup: MemSetup) -> list[tuple[int, int, int, int]]:
    """First slots (F0, F1, I1, I0) of microbatch 0 on each rank; microbatch j adds 6j. Qi et al. 2024 V-Half and
    V-Min building blocks as zbv_greedy.py's stable_pattern_v_half / stable_pattern_v_min give them, including the
    extra offset that keeps the slots of one rank distinct modulo 6 (pp even for V-Half, pp % 3 == 0 for V-Min)."""
    if setup == "half":
        gap = 3 if pp % 2 == 0 else 0
        return [(2 * r, 3 * pp - 2 - r, 3 * pp + gap + 2 * r - 1, 6 * pp + gap - 2 - r) for r in range(pp)]
    gap = 2 if pp % 3 == 0 else 0
    return [(r, 2 * pp - 1 - r, 2 * pp + gap + r, 4 * pp + gap - 1 - r) for r in range(pp)]


def _occupancy(kinds: Slots) -> list[int]:
    """Kind in each slot of a rank (-1 where empty), slots 0 .. last used one."""
    occ = [-1] * (max(lst[-1] for lst in kinds if lst) + 1)
    for k, lst in enumerate(kinds):
        for t in lst:
            assert occ[t] < 0, f"two passes in slot {t}"
            occ[t] = k
    return occ


def place_w(kinds: Slots, split: bool) -> list[list[int]]:
    """W slots for one rank's four non-W kinds: each empty slot takes the oldest pending W (with `split`, chunk 1's
    before chunk 0's); those left over follow the last slot. Returns one W list, or [chunk-1 W, chunk-0 W]."""
    occ = _occupancy(kinds[:4])
    pending = [0, 0]
    out: list[list[int]] = [[], []]
    for t, k in enumerate(occ):
        if k in (I1, I0):
            pending[k - I1 if split else 0] += 1
        elif k < 0:
            for w in (0, 1):
                if pending[w]:
                    out[w].append(t)
                    pending[w] -= 1
                    break
    t = len(occ) - 1
    for w in (0, 1):
        for _ in range(pending[w]):
            t += 1
            out[w].append(t)
    return out if split else out[:1]


def _profile(occ: list[int], explicit_w: bool) -> tuple[list[int], list[int]]:
    """Memory after each slot, and pending W after each slot (implicit W only; zeros otherwise): step 3 of the
    module doc. F adds one unit; an explicit W frees one; an empty slot frees one if a W is pending."""
    level, pend = [0] * len(occ), [0] * len(occ)
    cur = wait = 0
    for t, k in enumerate(occ):
        if k in (F0, F1):
            cur += 1
        elif k == W_ANY:
            cur -= 1
        elif k in (I1, I0):
            wait += 0 if explicit_w else 1
        elif wait:
            wait -= 1
            cur -= 1
        level[t], pend[t] = cur, wait
    return level, pend


def retime(stages: list[Slots]) -> list[Slots]:
    """Eager execution at unit cost without transfer time: every pass, taken in slot order, starts when its inputs
    (the feeding rank's same pass, the same rank's preceding kind, the previous microbatch) and its rank's previous
    pass have finished. W passes only follow their previous W and the rank's order."""
    pp = len(stages)
    order = sorted((t, r, k, j) for r, kinds in enumerate(stages) for k, lst in enumerate(kinds)
                   for j, t in enumerate(lst))
    end: list[list[list[int]]] = [[[-1] * len(lst) for lst in kinds] for kinds in stages]
    free = [0] * pp
    for _, r, k, j in order:
        deps = [free[r]]
        up = _UPSTREAM.get(k)
        if up is not None and 0 <= r + up < pp:
            deps.append(end[r + up][k][j])
        if k in (F1, I1, I0):
            deps.append(end[r][k - 1][j])
        if j:
            deps.append(end[r][k][j - 1])
        assert min(deps) >= 0, "eager execution met a pass before its inputs"
        end[r][k][j] = free[r] = max(deps) + 1
    return [[[e - 1 for e in lst] for lst in kinds] for kinds in end]


def _fits_explicit(level: list[int], occ: list[int], lo: int, hi: int, delta: int, cap: int) -> int:
    """Earliest free slot t in [lo, hi) such that adding `delta` to the memory over [t, hi) stays within cap;
    hi if none."""
    best, run = hi, -(1 << 60)
    for t in range(hi - 1, lo - 1, -1):
        run = max(run, level[t])
        if run + delta > cap:
            break
        if occ[t] < 0:
            best = t
    return best


def _replay(occ: list[int], level: list[int], pend: list[int], t: int, vacated: int,
            cap: int) -> list[tuple[int, int]] | None:
    """Implicit-W memory from slot t on, after a pass moved from slot `vacated` to t (occ already updated), until it
    meets the stored state again at or after `vacated`; the new (level, pending) per slot from t, or None as soon as
    the level exceeds cap."""
    cur, wait = (level[t - 1], pend[t - 1]) if t else (0, 0)
    out: list[tuple[int, int]] = []
    for s in range(t, len(occ)):
        k = occ[s]
        if k in (F0, F1):
            cur += 1
        elif k in (I1, I0):
            wait += 1
        elif wait:
            wait -= 1
            cur -= 1
        if cur > cap:
            return None
        if s >= vacated and cur == level[s] and wait == pend[s]:
            break
        out.append((cur, wait))
    return out


def squeeze(stages: list[Slots], explicit_w: bool) -> list[Slots]:
    """Step 4 of the module doc (zbv_greedy.py `reorder`). `stages`: per rank, the four non-W kinds' slots.
    Returns per rank five lists (the four kinds and the merged W) after eager re-timing."""
    pp = len(stages)
    kinds = [[list(lst) for lst in st] + ([place_w(st, split=False)[0]] if explicit_w else []) for st in stages]
    occs = [_occupancy(st) for st in kinds]
    profiles = [_profile(occ, explicit_w) for occ in occs]
    cap = max(max(level, default=0) for level, _ in profiles)
    last_mb = len(kinds[0][F0]) - 1
    b_sorted: list[list[int]] = [[] for _ in range(pp)]  # slots of the I passes already walked, per rank
    # Only walked passes move, and only earlier, so the walk (the authors' repeated minimum over all lists' heads)
    # is the sort of the starting slots; ties go to the lower rank, then the lower kind.
    order = sorted((t, r, k, j) for r, st in enumerate(kinds) for k, lst in enumerate(st) for j, t in enumerate(lst))
    phase = 0  # 0 warm-up, 1 steady state (kept), 2 cool-down
    for now, r, k, j in order:
        st, occ = kinds[r], occs[r]
        if phase == 0 and k == I0 and r == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not explicit_w):
            if phase == 1 and k == F0 and j == last_mb:
                phase = 2
            if k in (I1, I0):
                insort(b_sorted[r], now)
            continue
        ready = -1
        up = _UPSTREAM.get(k)
        if up is not None and 0 <= r + up < pp:
            ready = max(ready, kinds[r + up][k][j])
        if k in (F1, I1, I0):
            ready = max(ready, st[k - 1][j])
        if k == W_ANY:  # the j-th I on this rank by slot: W j was placed after it, unwalked I passes lie later
            ready = max(ready, b_sorted[r][j])
        if j:
            ready = max(ready, st[k][j - 1])
        ready += 1
        assert ready <= now
        level, pend = profiles[r]
        new = now
        if explicit_w:
            delta = {F0: 1, F1: 1, W_ANY: -1}.get(k, 0)
            new = _fits_explicit(level, occ, ready, now, delta, cap)
            for s in range(new, now):
                level[s] += delta
        else:
            for cand in range(ready, now):
                if occ[cand] >= 0:
                    continue
                occ[cand], occ[now] = k, -1
                states = _replay(occ, level, pend, cand, now, cap)
                if states is not None:
                    for s, (lv, pw) in enumerate(states, start=cand):
                        level[s], pend[s] = lv, pw
                    new = cand
                    break
                occ[cand], occ[now] = -1, k
        if new != now:
            occ[new], occ[now] = k, -1
            st[k][j] = new
        if k in (I1, I0):
            insort(b_sorted[r], new)
    if not explicit_w:
        kinds = [st + place_w(st, split=False) for st in kinds]
    return retime(kinds)


def v_orders(pp: int, n_microbatches: int, setup: MemSetup) -> list[list[tuple[int, PassKind, int]]]:
    """Per rank, the order of (chunk, kind in F/I/W, microbatch) that Primus's zbv_greedy builds for `setup`."""
    m = n_microbatches
    first = stable_pattern(pp, setup)
    start: list[Slots] = [[list(range(x, x + 6 * m, 6)) for x in row] for row in first]
    pass_one = [st[:4] for st in squeeze(start, explicit_w=True)]
    pass_two = [st[:4] for st in squeeze(pass_one, explicit_w=False)]
    chunk_kind: list[tuple[int, PassKind]] = [(0, "F"), (1, "F"), (1, "I"), (0, "I"), (1, "W"), (0, "W")]
    out = []
    for st in pass_two:
        full = st + place_w(st, split=True)
        slots = sorted((t, k, j) for k, lst in enumerate(full) for j, t in enumerate(lst))
        out.append([(*chunk_kind[k], j) for _, k, j in slots])
    return out
