"""DualPipe and DualPipeV (DeepSeek-V3 technical report, arXiv 2412.19437, section 3.2.1; deepseek-ai/DualPipe).

Both overlap the forward of one microbatch with the backward of another on the same rank (computation hides the
other's communication), and use zero-bubble split backward (I then W from a FIFO queue) near the edges. An
overlapped pair is stored as two consecutive actions, F then B, and its index is listed in `Schedule.overlapped`.

DualPipeV ("cut-in-half" DualPipe, as torch.distributed.pipelining 2.13 `ScheduleDualPipeV`): V placement, rank r
holds stages r ("phase 0") and 2pp-1-r ("phase 1"); all m microbatches go down and back up. Per rank, with n = pp,
k = r and c = m, eight phases re-derived from the published step structure:
  1. 2(n-k-1) F phase 0           2. k+1 times (F phase 0, F phase 1)
  3. n-k-1 times (I phase 1, W, F phase 1)
  4. c-2n+k+1 times (F0 overlapped with B1, then F1 overlapped with B0); on the rank k = n-1 the very first pair
     is not overlapped
  5. n-k-1 times (B phase 1, F1 overlapped with B0)
  6. k+1 times (backward phase 1, backward phase 0): full B in the first half, I (W queued) in the second half; the
     switch falls at step (k+1)//2, before phase 1's backward when k is odd, between the two when k is even
  7. n-k-1 times (W, I phase 0)     8. k+1 times W
where each W runs the oldest queued weight gradient. Needs m >= 2pp (torch and DeepSeek both require it).

DualPipe (bidirectional): pp ranks hold two copies of the pp model stages; half of the microbatches enter at rank 0
(direction 0: stages 0..pp-1, microbatches 0..m/2-1) and half at rank pp-1 (direction 1: stages pp..2pp-1 on ranks
pp-1..0, microbatches m/2..m-1; stage pp+k runs model stage k, see Schedule.model_stage). Each rank runs the same
eight phases with n = pp/2, k = min(r, pp-1-r), c = m/2; phase 0 is the direction in which the rank sits in the
first half of the pipeline (direction 0 for r < pp/2, direction 1 otherwise). Needs even pp, even m and m >= 2pp.
"""

from __future__ import annotations

from projection.schedule.action import Action, Kind, Schedule
from projection.schedule.builders import act, make_schedule, require_positive, v_placement


def _dual_rank(n: int, k: int, chunks: int, stage: tuple[int, int], offset: tuple[int, int]
               ) -> tuple[list[Action], list[int]]:
    """One rank's actions and overlapped-pair indices for the shared DualPipe / DualPipeV phase structure."""
    ops: list[Action] = []
    pairs: list[int] = []
    fwd = [0, 0]
    bwd = [0, 0]
    weights: list[Action] = []

    def forward(phase: int) -> None:
        ops.append(act(stage[phase], "F", offset[phase] + fwd[phase]))
        fwd[phase] += 1

    def backward(phase: int, split: bool) -> None:
        kind: Kind = "I" if split else "B"
        mb = offset[phase] + bwd[phase]
        ops.append(act(stage[phase], kind, mb))
        bwd[phase] += 1
        if split:
            weights.append(act(stage[phase], "W", mb))

    def weight() -> None:
        if weights:
            ops.append(weights.pop(0))

    def overlap(f_phase: int, b_phase: int) -> None:
        pairs.append(len(ops))
        forward(f_phase)
        backward(b_phase, False)

    for _ in range(2 * (n - k - 1)):
        forward(0)
    for _ in range(k + 1):
        forward(0)
        forward(1)
    for _ in range(n - k - 1):
        backward(1, True)
        weight()
        forward(1)
    for i in range(chunks - 2 * n + k + 1):
        if i == 0 and k == n - 1:
            forward(0)
            backward(1, False)
        else:
            overlap(0, 1)
        overlap(1, 0)
    for _ in range(n - k - 1):
        backward(1, False)
        overlap(1, 0)
    split = False
    steps = k + 1
    for i in range(steps):
        if i == steps // 2 and k % 2 == 1:
            split = True
        backward(1, split)
        if i == steps // 2 and k % 2 == 0:
            split = True
        backward(0, split)
    for _ in range(n - k - 1):
        weight()
        backward(0, True)
    for _ in range(k + 1):
        weight()
    assert not weights, "DualPipe phases left weight gradients unscheduled"
    return ops, pairs


def dualpipev(pp: int, n_microbatches: int) -> Schedule:
    """DualPipeV: V placement, overlapped forward-backward pairs in the steady state. Needs m >= 2pp."""
    require_positive(pp, n_microbatches, 2)
    if n_microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs n_microbatches >= 2 * pp = {2 * pp} (got {n_microbatches})")
    per_rank, overlapped = [], []
    for r in range(pp):
        ops, pairs = _dual_rank(pp, r, n_microbatches, (r, 2 * pp - 1 - r), (0, 0))
        per_rank.append(ops)
        overlapped.append(pairs)
    return make_schedule("dualpipev", v_placement(pp), n_microbatches, per_rank, overlapped=overlapped)


def dualpipe(pp: int, n_microbatches: int) -> Schedule:
    """DualPipe: bidirectional, two copies of the pp model stages. Needs even pp, even m and m >= 2pp."""
    require_positive(pp, n_microbatches, 1)
    m = n_microbatches
    if pp % 2:
        raise ValueError(f"dualpipe needs an even pp (got {pp}): each rank pairs with rank pp-1-r")
    if m % 2 or m < 2 * pp:
        raise ValueError(f"dualpipe needs an even n_microbatches >= 2 * pp = {2 * pp} (got {m}): half of them "
                         "enter from each end of the pipeline")
    half = m // 2
    per_rank, overlapped = [], []
    for r in range(pp):
        second_half = r >= pp // 2
        by_direction = ((r, 0), (2 * pp - 1 - r, half))
        phase0, phase1 = (by_direction[1], by_direction[0]) if second_half else by_direction
        ops, pairs = _dual_rank(pp // 2, min(r, pp - 1 - r), half, (phase0[0], phase1[0]), (phase0[1], phase1[1]))
        per_rank.append(ops)
        overlapped.append(pairs)
    routes = [tuple(range(pp))] * half + [tuple(range(pp, 2 * pp))] * half
    return make_schedule("dualpipe", v_placement(pp), m, per_rank, routes=routes, overlapped=overlapped)
