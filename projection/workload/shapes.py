"""The kernel shapes one training step runs, per rank type: GEMMs (BLAS m, n, k, dtype, layout), grouped GEMMs,
attention calls, named memory-bound kernels (norms, activations, cross-entropy, softmax: `op`, m = rows, n = row
length, size = bytes read + written; ops_base.py) and collectives, each with its count per step. What a tuning or
calibration run needs (the role of Primus's hipBLASLt shape dump); `projection shapes` prints it and `projection
calibrate gemm|attention|memory|collective` benchmarks it.

Rank types: pipeline ranks hold different layers (embedding, loss, MoE pattern), so rows are per pp rank; ranks whose
rows are identical are merged ("pp1-2"). Counts per step = invocations per microbatch x microbatches per step
(global batch / (micro batch x dp)). Step-level collectives besides the per-layer ones: pipeline send/recv of
activations and gradients (Megatron p2p of [s/cp/tp_sp, b, h] tensors), and data-parallel gradient reduction (all-reduce
with DDP; reduce-scatter plus parameter all-gather with the distributed optimizer; ZeRO-3 / FSDP: all-gather forward
and backward plus reduce-scatter), shown as one row with the total size per step (the framework splits it into buckets).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from projection.specs.scenario import Scenario
from projection.specs.training import DTYPE_BYTES
from projection.workload.ops import Op, stage_ops
from projection.workload.params import per_rank_params
from projection.workload.stages import split_stages, tied_embedding_ranks

SHAPE_KINDS = ("gemm", "grouped_gemm", "attention", "memory_bound", "collective")
COLUMNS = ("rank_type", "kind", "phase", "recompute", "dtype", "layout", "m", "n", "k", "batch", "heads", "kv_heads",
           "head_dim_v", "causal", "collective", "group", "size_bytes", "op", "count_per_step", "flop_per_step")


@dataclass(frozen=True)
class ShapeRow:
    """One distinct kernel shape of one rank type and how often a step runs it. Unused fields are 0 / ''."""

    rank_type: str
    kind: str
    phase: str
    recompute: bool
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    batch: int
    heads: int
    kv_heads: int
    head_dim_v: int
    causal: bool
    collective: str
    group: str
    size_bytes: int
    op: str
    count_per_step: int
    flop_per_step: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(op: Op) -> tuple[Any, ...]:
    if op.kind == "collective":
        return (op.kind, op.phase, op.recompute, "", "", 0, 0, 0, 1, 0, 0, 0, False, op.coll or "", op.group or "",
                op.coll_bytes, "")
    if op.kind == "memory_bound":
        return (op.kind, op.phase, op.recompute, op.dtype, "", op.m, op.n, 0, 1, 0, 0, 0, False, "", "",
                int(op.bytes_read + op.bytes_written), op.kernel)
    return (op.kind, op.phase, op.recompute, op.dtype, op.layout, op.m, op.n, op.k, op.batch, op.heads, op.kv_heads,
            op.head_dim_v, op.causal, "", "", 0, "")


def step_shapes(scenario: Scenario) -> tuple[ShapeRow, ...]:
    """Every distinct shape of the step, per rank type, sorted by rank type, kind and descending FLOPs/size."""
    model, training, plan = scenario.model, scenario.training, scenario.plan
    n_micro = training.num_microbatches(plan.dp_())
    slots = split_stages(model, plan)
    per_rank: list[Counter[tuple[Any, ...]]] = []
    flops: list[dict[tuple[Any, ...], float]] = []
    for rank in range(plan.pp):
        counts: Counter[tuple[Any, ...]] = Counter()
        flop: dict[tuple[Any, ...], float] = {}
        for slot in (s for s in slots if s.pp_rank == rank):
            for op in stage_ops(model, training, plan, slot):
                if op.kind in SHAPE_KINDS and (op.kind != "memory_bound" or op.fn):
                    key = _key(op)
                    counts[key] += op.count * n_micro
                    flop[key] = flop.get(key, 0.0) + op.total_flop * n_micro
        for key, count in _step_collectives(scenario, rank, n_micro).items():
            counts[key] += count
        per_rank.append(counts)
        flops.append(flop)
    rows: list[ShapeRow] = []
    rank = 0
    while rank < plan.pp:
        last = rank
        while last + 1 < plan.pp and per_rank[last + 1] == per_rank[rank]:
            last += 1
        label = "all" if plan.pp == 1 else f"pp{rank}" if last == rank else f"pp{rank}-{last}"
        ordered = sorted(per_rank[rank].items(), key=lambda kv: (SHAPE_KINDS.index(kv[0][0]), kv[0][1],
                                                                 -flops[rank].get(kv[0], 0.0), -kv[0][15]))
        rows += [ShapeRow(**dict(zip(COLUMNS, (label, *key, count, flops[rank].get(key, 0.0)), strict=True)))
                 for key, count in ordered]
        rank = last + 1
    return tuple(rows)


def _step_collectives(sc: Scenario, pp_rank: int, n_micro: int) -> Counter[tuple[Any, ...]]:
    """Pipeline p2p and data-parallel gradient / parameter collectives of one pp rank for one step."""
    model, training, plan = sc.model, sc.training, sc.plan
    out: Counter[tuple[Any, ...]] = Counter()
    act = DTYPE_BYTES[training.params_dtype]
    if plan.pp > 1:
        tokens = training.micro_batch_size * training.seq_length // plan.cp // (plan.tp if plan.sp_ else 1)
        size = tokens * model.hidden_size * act
        slots = [s for s in split_stages(model, plan) if s.pp_rank == pp_rank]
        last = plan.pp * plan.vpp_ - 1
        for phase, sends in (("F", sum(s.stage < last for s in slots)), ("I", sum(s.stage > 0 for s in slots))):
            if sends:
                out[("collective", phase, False, "", "", 0, 0, 0, 1, 0, 0, 0, False, "send_recv", "pp", size, "")] += \
                    sends * n_micro
    rp = per_rank_params(model, plan)[pp_rank]
    experts = rp.by_component.get("experts", 0)
    grad_b = DTYPE_BYTES[training.optimizer.main_grads_dtype]
    if pp_rank in tied_embedding_ranks(model, plan):
        # the word-embedding gradient of the first stage and of its copy's (output layer or MTP), all-reduced between
        # them once per step (Megatron finalize_model_grads: _allreduce_word_embedding_grads; perf/dp.py prices it)
        emb = model.padded_vocab(plan.tp) * model.hidden_size // plan.tp * grad_b
        out[("collective", "W", False, "", "", 0, 0, 0, 1, 0, 0, 0, False, "all_reduce", "embedding", emb, "")] += 1
    f8 = training.fp8 if training.fp8 is not None and training.fp8.param_gather else None
    # gathered bytes: 1 B per GEMM weight the FP8 library converts when parameters are gathered in fp8
    wire = {c: n * (1 if f8 is not None and f8.gathers_in_fp8(c) else act) for c, n in rp.by_component.items()}
    gathered = {"dp": sum(v for c, v in wire.items() if c != "experts"), "edp": wire.get("experts", 0)}
    for group, params, ways in (("dp", rp.params - experts, plan.dp_() * plan.cp), ("edp", experts, plan.edp())):
        if params <= 0 or ways <= 1:
            continue
        zero = plan.sharding.zero_stage
        # FSDP syncs every microbatch (TorchTitan's gradient accumulation keeps gradient sync on), except inside
        # torch.distributed.pipelining stages, which reduce once per step and, without reshard after forward,
        # gather once (ParallelPlan.pipelined_fsdp)
        per_mb = n_micro if zero == 3 and not plan.pipelined_fsdp else 1
        reshard = plan.sharding.reshard_after_forward
        rows = [("W", "all_reduce", params * grad_b, 1)] if zero == 0 else \
            [("W", "reduce_scatter", params * grad_b, per_mb)]
        if zero in (1, 2):
            rows.append(("F", "all_gather", gathered[group], 1))  # updated parameters after the optimizer step
        if zero == 3:
            # TorchTitan's [norm, output] unit is not resharded after forward (but for the "always" policy, the
            # only one that reshards under PP), so it is gathered once per forward
            once = wire.get("output", 0) if group == "dp" and plan.sharding.fsdp == "torch_fsdp2" and not (
                plan.pipelined_fsdp and reshard) else 0
            # unpipelined: every forward gathers, and every backward again when resharded after forward; pipelined:
            # once per step, or with reshard after forward once per backward (no reshard after backward there)
            count = (n_micro if reshard else 1) if plan.pipelined_fsdp else n_micro * (1 + int(reshard))
            rows.append(("F", "all_gather", gathered[group] - once, count))
            if once:
                rows.append(("F", "all_gather", once, per_mb))
            rep = plan.sharding.dp_replicate
            if rep > 1:  # HSDP: each reduced shard all-reduced over the replicas (experts too: TorchTitan's HSDP)
                out[("collective", "W", False, "", "", 0, 0, 0, 1, 0, 0, 0, False, "all_reduce", f"{group}_replicate",
                     int(params / (ways // rep) * grad_b), "")] += per_mb
        for phase, kind, size, count in rows:
            out[("collective", phase, False, "", "", 0, 0, 0, 1, 0, 0, 0, False, kind, group, int(size), "")] += count
    return out
