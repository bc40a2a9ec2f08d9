"""Data-parallel communication of one step: gradient reduction in buckets, distributed-optimizer parameter
all-gather, HSDP replica all-reduce and the tied-embedding gradient all-reduce; as comm-stream tasks for the
pipeline simulator and as the exposed parameter all-gather.

Megatron-LM (megatron/core/distributed/distributed_data_parallel.py, param_and_grad_buffer.py):
- gradients live in contiguous buffers, dense parameters and expert parameters apart; a buffer is cut into buckets of
  `--ddp-bucket-size` elements, default max(40,000,000, 1,000,000 x data-parallel size with CP) ("larger DP sizes
  need larger buckets to ensure collectives do not become latency-bound"), filled in backprop order;
- bucketing is off (one bucket per buffer) without `--overlap-grad-reduce`, on pipeline ranks other than the first
  ("data-parallel communication on these stages is not on the critical path") and for model chunks after the first
  (`disable_bucketing=(model_chunk_idx > 0)` in megatron/training/training.py);
- a bucket is all-reduced (DDP) or reduce-scattered (distributed optimizer) over the dp x cp group (experts: the
  expert-data-parallel group) in the main-gradient dtype. With overlap it is launched as soon as the last
  microbatch's backward has produced all its gradients; without, every bucket after the whole backward;
- the distributed optimizer all-gathers the updated parameters (params dtype) per bucket: inside the optimizer step
  without `--overlap-param-gather`, else launched at the start of the next forward and waited for by each bucket's
  first forward (the first bucket cannot be hidden).
Timing inside an action: the buckets of a stage become ready in proportion to the parameters its last backward has
processed (backprop order); the communication stream runs them one after another; the part that ends after the
action is a CommTask on the rank's comm stream (it overlaps the rank's later actions in the simulator). A rank's
tasks are given in the order their actions end, the order the host issues them (with interleaving, the deepest model
chunk's last backward comes first).
FSDP (zero_stage 3) reduces per unit inside the backward (projection/perf/items.py); with HSDP each unit's shard
gradient is then all-reduced over the replicas, on a stream of its own (FSDP2 foreach_reduce). FSDP2 inside
torch.distributed.pipelining stages (ParallelPlan.pipelined_fsdp) gathers each unit once per step, by its first
forward (prefetched back to back like an overlapped parameter gather), and reduces every unit once, right after the
stage's last backward.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from projection.cost.collectives import CollectiveKind, GroupPlacement
from projection.cost.model import CostModel, priced_collective
from projection.perf.placement import (
    boundary_placement,
    expert_dp_placement,
    expert_shard_placements,
    shard_placements,
)
from projection.perf.pricing import PricedStages, StagePrice
from projection.perf.stage_params import gather_bytes
from projection.schedule.action import Action, Schedule
from projection.sim.costs import CommTask
from projection.sim.result import SimResult
from projection.specs.scenario import Scenario
from projection.specs.training import DTYPE_BYTES
from projection.workload.stages import tied_embedding_ranks


@dataclass(frozen=True)
class Bucket:
    """One collective of one bucket. stage: schedule stage it belongs to; order: position in backprop order."""

    pp_rank: int
    stage: int
    kind: CollectiveKind
    group: str  # "dp" (dense, dp x cp), "edp" (experts), "embedding"
    params: int
    size_bytes: int
    seconds: float
    order: int


@dataclass(frozen=True)
class DPComm:
    """tasks: comm-stream tasks for StageCosts; grad_s / param_gather_s: full seconds per pp rank."""

    tasks: tuple[CommTask, ...]
    grad_buckets: tuple[Bucket, ...]
    param_buckets: tuple[Bucket, ...]
    grad_s: tuple[float, ...]
    param_gather_s: tuple[float, ...]
    crosses_nodes: bool
    overlap_param_gather: bool
    aligned_param_gather: bool = False  # launched at the step's start on every pp rank (param_gather_exposed_s)
    provenance: Mapping[str, float] = field(default_factory=dict)  # seconds per cost source, one step, all pp ranks
    # (rank, stage) whose buckets start inside the stage's last backward (overlapped, neither aligned nor FSDP): the
    # part past that action is the rank's task "dp grad s<stage>"; bucket_spans places each bucket
    in_backward: tuple[tuple[int, int], ...] = ()


def bucket_elements(scenario: Scenario) -> int:
    """Megatron's default --ddp-bucket-size: max(40e6, 1e6 x dp x cp) elements."""
    plan = scenario.plan
    return max(40_000_000, 1_000_000 * plan.dp_() * plan.cp)


def is_bucketed(scenario: Scenario, pp_rank: int, chunk: int) -> bool:
    """Megatron cuts a gradient buffer into buckets only with --overlap-grad-reduce, on the first pipeline rank's
    first model chunk (module docstring); elsewhere the buffer is one bucket."""
    return scenario.plan.overlap.grad_reduce and pp_rank == 0 and chunk == 0


def buckets(scenario: Scenario, params: int, bucketed: bool) -> list[int]:
    """Bucket sizes (elements, backprop order) of a gradient buffer of `params` elements."""
    return _split(params, bucket_elements(scenario) if bucketed else None)


def _split(params: int, size: int | None) -> list[int]:
    """Bucket sizes in backprop order: full buckets, the remainder last (it holds the first layers)."""
    if params <= 0:
        return []
    if size is None or params <= size:
        return [params]
    n = math.ceil(params / size)
    return [size] * (n - 1) + [params - size * (n - 1)]


def dp_comm_tasks(scenario: Scenario, cost_model: CostModel, schedule: Schedule, priced: PricedStages) -> DPComm:
    """Gradient buckets (as comm tasks) and parameter all-gathers of every pipeline rank for one step."""
    plan, training, cluster = scenario.plan, scenario.training, scenario.cluster
    zero = plan.sharding.zero_stage
    dense_place, replicate = shard_placements(cluster, plan)
    expert_place = expert_dp_placement(cluster, plan) if scenario.model.moe is not None else None
    grad_b = DTYPE_BYTES[training.optimizer.main_grads_dtype]
    param_b = DTYPE_BYTES[training.params_dtype]
    overlap = plan.overlap.grad_reduce
    # Megatron's interleaved schedule with align_grad_reduce (config.grad_sync_func): no bucket overlaps the backward
    # that fills it; each chunk is reduced whole, from the backward of virtual microbatch (its last + pp rank)
    aligned = overlap and plan.overlap.align_grad_reduce and plan.schedule == "interleaved_1f1b" \
        and plan.schedule_style == "megatron" and plan.vpp_ > 1 and zero in (0, 1, 2)
    kind: CollectiveKind = "all_reduce" if zero == 0 else "reduce_scatter"
    places: list[GroupPlacement] = [dense_place] + ([expert_place] if expert_place else [])
    if zero == 3:  # FSDP: the shard groups and the HSDP replicas are what cross nodes
        expert_shard, expert_rep = expert_shard_placements(cluster, plan) if expert_place else (None, None)
        places = [p for p in (dense_place, replicate, expert_shard, expert_rep) if p is not None]
    grads: list[Bucket] = []
    params_ag: list[Bucket] = []
    tasks: list[CommTask] = []
    in_backward: list[tuple[int, int]] = []
    grad_s = [0.0] * schedule.n_ranks
    pg_s = [0.0] * schedule.n_ranks

    provenance: dict[str, float] = {}  # cost sources of the step's buckets, over every pp rank

    def sec(k: CollectiveKind, nbytes: float, place: GroupPlacement) -> float:
        return priced_collective(cost_model, k, nbytes, place, provenance) if place.n_ranks > 1 and nbytes > 0 \
            else 0.0

    for r, acts in enumerate(schedule.actions):
        end_tasks: list[float] = []
        first_task = len(tasks)
        for s in schedule.stages_of(r):
            sp = priced.stages[schedule.model_stage(s)]
            bucketed = is_bucketed(scenario, sp.pp_rank, sp.chunk) and s == schedule.model_stage(s)
            mine: list[Bucket] = []
            # bytes per gathered element of each group (fp8 param gather: 1 B per converted GEMM weight)
            wire = [gather_bytes(training, scenario.model.num_layers, name, d, e)
                    for name, d, e in sp.params.components]
            per_elem = {"dp": sum(b for b, _ in wire) / sp.params.dense if sp.params.dense else param_b,
                        "edp": sum(b for _, b in wire) / sp.params.expert if sp.params.expert else param_b}
            for group, n, place in (("dp", sp.params.dense, dense_place), ("edp", sp.params.expert, expert_place)):
                if place is None or zero == 3:
                    continue
                for order, elems in enumerate(buckets(scenario, n, bucketed)):
                    mine.append(Bucket(r, s, kind, group, elems, elems * grad_b, sec(kind, elems * grad_b, place),
                                       order))
                    if zero in (1, 2):
                        ag = round(elems * per_elem[group])
                        params_ag.append(Bucket(r, s, "all_gather", group, elems, ag, sec("all_gather", ag, place),
                                                order))
            if sp.fsdp_gather_s or sp.fsdp_scatter_s:
                params_ag += _pipelined_fsdp_gathers(r, s, sp)
                mine += _pipelined_fsdp_scatter(r, s, sp)
            grads += mine
            grad_s[r] += sum(b.seconds for b in mine)
            if not mine:
                continue
            if sp.fsdp_scatter_s:  # every unit's post-backward runs right after the stage's last backward, and
                # the stage's root post-backward callback makes the compute stream wait for it (FSDP2
                # FSDPParamGroup.finalize_backward: current_stream().wait_event on the post-reduce events)
                tasks.append(CommTask(r, last_backward(acts, s), mine[0].seconds, f"fsdp grad s{s}",
                                      _crosses(places), blocks_compute=True))
                continue
            if aligned and sum(b.seconds for b in mine) > 0.0:  # nothing to run over a group of one rank
                # the chunk's buckets launched together, r backward steps after its last backward on rank r
                tasks.append(CommTask(r, _delayed_backward(acts, last_backward(acts, s), r),
                                      sum(b.seconds for b in mine), f"dp grad s{s}", _crosses(places)))
            elif overlap and not aligned:
                last = last_backward(acts, s)
                in_backward.append((r, s))
                tail = _tail_s(mine, priced.action_time(schedule.model_stage(s), last.kind).seconds)
                if tail > 0.0:
                    tasks.append(CommTask(r, last, tail, f"dp grad s{s}", _crosses(places)))
            elif not overlap:
                end_tasks.append(sum(b.seconds for b in mine))
        emb = _embedding_grad(scenario, cost_model, r)
        if emb is not None:
            grads.append(emb)
            grad_s[r] += emb.seconds
            end_tasks.append(emb.seconds)
        if end_tasks and sum(end_tasks) > 0.0:
            tasks.append(CommTask(r, _last_compute(acts), sum(end_tasks), "dp grad (after backward)",
                                  _crosses(places)))
        # the comm stream runs a rank's tasks in the order the host issues them: when their action ends (Megatron
        # starts a model chunk's gradient sync as its last backward finishes, deepest chunk first), not stage order
        position = {a: i for i, a in enumerate(acts)}
        tasks[first_task:] = sorted(tasks[first_task:], key=lambda t: position[t.after])
        pg_s[r] = sum(b.seconds for b in params_ag if b.pp_rank == r)
    return DPComm(tuple(tasks), tuple(grads), tuple(params_ag), tuple(grad_s), tuple(pg_s), _crosses(places),
                  plan.overlap.param_gather or plan.pipelined_fsdp,
                  # Megatron's interleaved schedule (param_sync_func); torch's multi-stage runtime issues every
                  # stage's unshard before any compute
                  (plan.schedule == "interleaved_1f1b" and plan.schedule_style == "megatron"
                   and plan.sharding.zero_stage in (1, 2)) or (plan.pipelined_fsdp and plan.vpp_ > 1), provenance,
                  tuple(in_backward))


def _pipelined_fsdp_gathers(rank: int, stage: int, sp: StagePrice) -> list[Bucket]:
    """FSDP2 units gathered once per step by their first forward (ParallelPlan.pipelined_fsdp), as parameter
    buckets: `order` counts backprop order, so the first unit of the forward is the last in that order."""
    units = sp.fsdp_gather_s
    comps = sp.params.components if len(sp.params.components) == len(units) else ()
    out = []
    for k, secs in enumerate(units):
        elems = comps[k][1] + comps[k][2] if comps else round(secs * 1e12)  # no split known: weigh by seconds
        out.append(Bucket(rank, stage, "all_gather", "dp", elems, 0, secs, len(units) - 1 - k))
    return out


def _pipelined_fsdp_scatter(rank: int, stage: int, sp: StagePrice) -> list[Bucket]:
    """The once-per-step gradient reduction of a pipelined FSDP2 stage, as one bucket: its units' reduce-scatters
    back to back on the shard group's stream and, with HSDP, each unit's replica all-reduce on its own stream once
    that unit's reduce-scatter is done."""
    rs_end = ar_end = 0.0
    for rs, ar in zip(sp.fsdp_scatter_s, sp.fsdp_replicate_s or (0.0,) * len(sp.fsdp_scatter_s), strict=True):
        rs_end += rs
        ar_end = max(ar_end, rs_end) + ar
    secs = max(rs_end, ar_end)
    return [Bucket(rank, stage, "reduce_scatter", "dp", sp.params.total, 0, secs, 0)] if secs > 0 else []


def _crosses(places: list[GroupPlacement]) -> bool:
    return any(p.n_nodes > 1 for p in places)


def last_backward(acts: tuple[Action, ...], stage: int) -> Action:
    return next(a for a in reversed(acts) if a.stage == stage and a.kind in ("B", "W"))


def _delayed_backward(acts: tuple[Action, ...], last: Action, steps: int) -> Action:
    """The backward action `steps` backward actions after `last` on its rank (Megatron's backward_step_helper_
    postprocess launches a chunk's sync at virtual microbatch id - pp rank); past the rank's last backward, the rank's
    last compute (the schedule's closing grad_sync_func calls)."""
    backward = [a for a in acts if a.kind in ("B", "W")]
    i = backward.index(last) + steps
    return backward[i] if i < len(backward) else _last_compute(acts)


def _last_compute(acts: tuple[Action, ...]) -> Action:
    return next(a for a in reversed(acts) if a.kind in ("F", "B", "I", "W"))


def _tail_s(buckets: list[Bucket], action_s: float) -> float:
    """Seconds the stage's bucket chain (bucket_spans) runs past the end of its last backward action."""
    return max(0.0, max((end for _, _, end in bucket_spans(buckets, action_s)), default=0.0) - action_s)


def bucket_spans(buckets: list[Bucket], action_s: float) -> list[tuple[Bucket, float, float]]:
    """(bucket, start, end) of a stage's gradient buckets, in seconds from the start of its last backward action
    (`action_s` long). Dense and expert parameters live in buffers of their own (Megatron's DDP: `buffers` and
    `expert_parallel_buffers`), spread over the same layers: a bucket is ready when the backward has processed its
    buffer's parameters up to it, in proportion to that buffer's own total (a one-bucket buffer only at the end);
    the ready buckets run one after another on one communication stream, in the order they become ready."""
    totals: dict[str, float] = defaultdict(float)
    for b in buckets:
        totals[b.group] += b.params
    ready: list[tuple[float, int, Bucket]] = []
    done: dict[str, float] = defaultdict(float)
    for b in sorted(buckets, key=lambda x: (x.order, x.group)):
        done[b.group] += b.params
        ready.append((action_s * done[b.group] / (totals[b.group] or 1), b.order, b))
    end = 0.0
    out = []
    for at, _, b in sorted(ready, key=lambda x: (x[0], x[1])):
        start = max(end, at)
        end = start + b.seconds
        out.append((b, start, end))
    return out


def _embedding_grad(scenario: Scenario, cost_model: CostModel, rank: int) -> Bucket | None:
    """Tied embeddings or MTP with pp > 1: the word-embedding gradients of the first stage and of the stage holding
    its copy are all-reduced (Megatron finalize_model_grads: _allreduce_word_embedding_grads; stages.
    tied_embedding_ranks)."""
    model, plan = scenario.model, scenario.plan
    ranks = tied_embedding_ranks(model, plan)
    if rank not in ranks:
        return None
    elems = model.padded_vocab(plan.tp) * model.hidden_size // plan.tp
    nbytes = elems * DTYPE_BYTES[scenario.training.optimizer.main_grads_dtype]
    place = boundary_placement(scenario.cluster, plan, *ranks)
    return Bucket(rank, -1, "all_reduce", "embedding", elems, nbytes,
                  cost_model.collective_seconds("all_reduce", nbytes, place), 0)


def param_gather_exposed_s(dp: DPComm, priced: PricedStages, schedule: Schedule, sim: SimResult) -> tuple[float, ...]:
    """Per pp rank, seconds of the parameter all-gather the step cannot hide: all of it without
    overlap_param_gather; with it, max_k(end of gather k - when bucket k's first forward needs it), the gathers
    running back to back from the start of the step and bucket k needed when the first forward of its stage has
    processed the parameters of the buckets before it (forward order = reverse backprop order). The gathers start at
    the step's start on every pipeline rank under Megatron's interleaved schedule, whose `param_sync_func` launches
    them for the first model chunks up front (align_param_gather, the default: "all PP stages will launch param
    all-gathers simultaneously"), so a later rank hides them behind its share of the pipeline fill; otherwise at the
    rank's first forward (Megatron's forward pre-hooks; FSDP2's root pre-forward makes the gather stream wait for
    the compute stream, which waits for the pipeline receive).
    """
    out = []
    aligned = dp.aligned_param_gather
    for r in range(schedule.n_ranks):
        mine = [b for b in dp.param_buckets if b.pp_rank == r]
        total = sum(b.seconds for b in mine)
        if not dp.overlap_param_gather or not mine:
            out.append(total)
            continue
        starts = _first_forward_starts(sim, r)
        origin = 0.0 if aligned else min(starts.values(), default=0.0)  # docstring
        needs: list[tuple[float, float]] = []
        for s in sorted({b.stage for b in mine}, key=lambda x: starts.get(x, 0.0)):
            stage_b = sorted((b for b in mine if b.stage == s), key=lambda b: -b.order)
            f_s = priced.stages[schedule.model_stage(s)].f_s
            n_total = sum(b.params for b in stage_b) or 1
            before = 0
            for b in stage_b:
                needs.append((starts.get(s, 0.0) - origin + f_s * before / n_total, b.seconds))
                before += b.params
        end = worst = 0.0
        for need, g in needs:
            end += g
            worst = max(worst, end - need)
        out.append(min(total, max(0.0, worst)))
    return tuple(out)


def _first_forward_starts(sim: SimResult, rank: int) -> dict[int, float]:
    starts: dict[int, float] = {}
    for e in sim.timeline[rank]:
        if e.stream == "compute" and e.action is not None and e.action.kind == "F":
            starts.setdefault(e.action.stage, e.start_s)
    return starts
