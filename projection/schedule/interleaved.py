"""Interleaved 1F1B (Narayanan et al. 2021, "virtual pipeline"): vpp model chunks per rank, placed round-robin.

Both frameworks build the same kind of order (re-derived from Megatron-LM `megatron/core/pipeline_parallel/
schedules.py`, functions `get_pp_rank_microbatches`, `get_schedule_table` and
`forward_backward_pipelining_with_interleaving`, and from torch.distributed.pipelining `ScheduleInterleaved1F1B`):

* Microbatches are taken in groups of G; within a group, chunk 0 runs the whole group, then chunk 1, ... A rank's
  k-th forward is entry k of the table [(mb, chunk) for each group for chunk in 0..vpp-1 for mb in group]; its k-th
  backward is entry k with the chunk mirrored (vpp-1-chunk). Megatron's example, pp=2, G=3, m=5, vpp=2:
  microbatch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1 (the last group is whatever remains).
* Rank r runs W = min((pp - r - 1) * 2 + (vpp - 1) * G, m * vpp) warm-up forwards, then alternates forward k+W and
  backward k (forward first), then the remaining backwards. Peak in-flight microbatches on rank r: min(W + 1, m*vpp).

Where they differ (both styles are built here; Megatron is the default):
* G. Megatron: `--microbatch-group-size-per-virtual-pipeline-stage` (default pp), which must lie in [pp, m], and the
  remainder m % G must be 0 or >= pp (so with the default, m must be a multiple of pp). torch: G = m // max(1, m // pp)
  (the "rounds" of pp microbatches), requiring m % max(1, m // pp) == 0; this admits m < pp (G = m) and e.g. pp=4,
  m=10 (G = 5), which Megatron accepts only with --microbatch-group-size-per-virtual-pipeline-stage 5.
* vpp = 1. Megatron then runs its non-interleaved 1F1B (warm-up pp - r - 1); torch's interleaved class keeps the
  interleaved warm-up formula, 2 * (pp - r - 1).
With m a multiple of pp, G = pp and vpp >= 2 the two orders are identical.
"""

from __future__ import annotations

from typing import Literal

from projection.schedule.action import Action, Schedule
from projection.schedule.basic import one_f_one_b_rank
from projection.schedule.builders import act, looped_placement, make_schedule, require_positive

Style = Literal["megatron", "torch"]


def schedule_table(n_microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) of a rank's k-th forward, k = 0 .. m*vpp-1 (Megatron's schedule table)."""
    table = []
    for start in range(0, n_microbatches, group):
        members = range(start, min(start + group, n_microbatches))
        table += [(mb, chunk) for chunk in range(vpp) for mb in members]
    return table


def megatron_group_size(pp: int, n_microbatches: int, group: int | None) -> int:
    """Validated `--microbatch-group-size-per-virtual-pipeline-stage` (default pp); ValueError as Megatron would
    refuse."""
    g = pp if group is None else group
    m = n_microbatches
    if not isinstance(g, int) or isinstance(g, bool) or not pp <= g <= m:
        raise ValueError(f"interleaved_1f1b (Megatron): microbatch group size {g} must lie in [pp, n_microbatches] = "
                         f"[{pp}, {m}]" + (" (the default group size is pp, so n_microbatches must be >= pp)"
                                           if group is None else ""))
    rem = m % g
    if 0 < rem < pp:
        fits = [k for k in range(pp, m + 1) if not 0 < m % k < pp]  # m itself always fits
        other = "set --microbatch-group-size-per-virtual-pipeline-stage" if group is None else \
            "change --microbatch-group-size-per-virtual-pipeline-stage"
        raise ValueError(f"interleaved_1f1b (Megatron): n_microbatches % group size = {m} % {g} = {rem}, which must be "
                         f"0 or >= pp = {pp} (Megatron rejects the dependency bubble); use a multiple of {g} "
                         f"microbatches or {other} to one that leaves no remainder below pp, e.g. {fits[0]}")
    return g


def torch_group_size(pp: int, n_microbatches: int) -> int:
    """torch's microbatches per round; ValueError where torch's ScheduleInterleaved1F1B refuses."""
    rounds = max(1, n_microbatches // pp)
    if n_microbatches % rounds:
        raise ValueError(f"interleaved_1f1b (torch): n_microbatches = {n_microbatches} must be a multiple of the "
                         f"number of rounds max(1, n_microbatches // pp) = {rounds}")
    return n_microbatches // rounds


def warmup_count(rank: int, pp: int, m: int, vpp: int, group: int, extra: int = 0) -> int:
    """Warm-up forwards of rank `rank` (module docstring), `extra` more with Megatron's combined 1F1B."""
    return min((pp - rank - 1) * 2 + (vpp - 1) * group + extra, m * vpp)


def _rank_ops(rank: int, pp: int, m: int, vpp: int, group: int, extra: int = 0) -> list[Action]:
    table = schedule_table(m, vpp, group)
    total = m * vpp
    warmup = warmup_count(rank, pp, m, vpp, group, extra)

    def fwd(k: int) -> Action:
        mb, chunk = table[k]
        return act(chunk * pp + rank, "F", mb)

    def bwd(k: int) -> Action:
        mb, chunk = table[k]
        return act((vpp - 1 - chunk) * pp + rank, "B", mb)

    ops = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops.append(fwd(warmup + k))
        ops.append(bwd(k))
    ops += [bwd(k) for k in range(total - warmup, total)]
    return ops


def interleaved_1f1b(pp: int, n_microbatches: int, vpp: int, *, microbatch_group_size: int | None = None,
                     style: Style = "megatron", combined_1f1b: bool = False) -> Schedule:
    """Interleaved 1F1B over pp ranks with vpp chunks each (stage s on rank s % pp), in Megatron's or torch's order.
    `combined_1f1b` (Megatron, vpp > 1): Megatron-Core's combined 1F1B under overlap_moe_expert_parallel_comm, which
    runs one more warm-up forward on every rank (schedules.py get_pp_rank_microbatches: "so that the forward and
    backward computations are independent in all 1f1b steps") and each steady forward together with its backward,
    layer by layer (Schedule.combined)."""
    require_positive(pp, n_microbatches, vpp)
    m = n_microbatches
    if combined_1f1b and (style != "megatron" or vpp == 1):
        raise ValueError("the combined 1F1B is Megatron's interleaved schedule's (vpp > 1)")
    if style == "megatron":
        if vpp == 1:
            per_rank = [one_f_one_b_rank(r, pp, m) for r in range(pp)]
            return make_schedule("interleaved_1f1b", looped_placement(pp, 1), m, per_rank,
                                 warmup=[min(pp - r - 1, m) for r in range(pp)])
        group = megatron_group_size(pp, m, microbatch_group_size)
        extra = int(combined_1f1b)
        per_rank = [_rank_ops(r, pp, m, vpp, group, extra) for r in range(pp)]
        return make_schedule("interleaved_1f1b", looped_placement(pp, vpp), m, per_rank,
                             warmup=[warmup_count(r, pp, m, vpp, group, extra) for r in range(pp)],
                             combined=combined_1f1b)
    elif style == "torch":
        if microbatch_group_size is not None:
            raise ValueError("interleaved_1f1b (torch): the microbatch group size is derived from pp and "
                             "n_microbatches; pass microbatch_group_size=None or style='megatron'")
        group = torch_group_size(pp, m)
    else:
        raise ValueError(f"unknown interleaved_1f1b style {style!r} (expected 'megatron' or 'torch')")
    per_rank = [_rank_ops(r, pp, m, vpp, group) for r in range(pp)]
    return make_schedule("interleaved_1f1b", looped_placement(pp, vpp), m, per_rank)


def torch_time_steps(pp: int, n_microbatches: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    """Time step of each action of interleaved_1f1b(style="torch"), per rank in execution order: the index of the
    action in torch's `pipeline_order[rank]`, where None slots pad each rank so that all ranks share one clock.

    Re-derived from torch.distributed.pipelining `_get_1f1b_rank_ops` (torch 2.4-2.13, unchanged): rank r starts
    with r empty steps; after its W warm-up forwards it waits `(vpp * pp + 2 * (pp - 1 - r)) - (W + r)` empty steps
    (the earliest step of its first backward; none when negative or without warm-up); the 1F1B pairs follow back to
    back; each cool-down backward comes after one empty step. Torch up to 2.9 runs these steps in lock-step
    (sim/lockstep.py); 2.10+ runs the same order with explicit send and receive actions instead."""
    require_positive(pp, n_microbatches, vpp)
    group = torch_group_size(pp, n_microbatches)
    total = n_microbatches * vpp
    out = []
    for rank in range(pp):
        warmup = min((pp - rank - 1) * 2 + (vpp - 1) * group, total)
        steps = list(range(rank, rank + warmup))
        # the empty steps follow the last warm-up forward, so a rank without warm-up has none
        t = rank + warmup + (max(0, (vpp * pp + 2 * (pp - 1 - rank)) - (warmup + rank)) if warmup else 0)
        steps += range(t, t + 2 * (total - warmup))
        t += 2 * (total - warmup)
        steps += [t + 2 * k + 1 for k in range(warmup)]
        out.append(tuple(steps))
    return tuple(out)
