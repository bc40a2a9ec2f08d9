"""`price_stages`: seconds per virtual pipeline stage for F, I, W and B of one microbatch, pipeline p2p seconds per
stage boundary, and where the seconds go (compute by op class, exposed communication by group, host overhead).

Per stage, the ops of projection.workload.ops (embedding, decoder layers, MTP depths, output layer and loss, in that
order) are run as actions by projection/perf/action_time.py with the overlap rules of projection/perf/items.py:
- F: the forward ops of each component in forward order;
- I: per component in backward order, its recomputed forward ops (activation recomputation re-runs a layer's forward
  just before its backward: Megatron CheckpointFunction) then its input-gradient ops;
- W: its weight-gradient ops, each followed, when gradient accumulation is not fused into the wgrad GEMM, by the
  add of the gradient into the fp32 main-gradient buffer (Megatron DDP's backward hook `main_grad.add_(grad)`);
  then the same hook's add for each parameter whose gradient no GEMM writes (norms, biases, the embedding tables:
  one kernel per tensor per microbatch, `StageParams.hooked`; not with FSDP, zero_stage 3, which reduces
  gradients per unit instead);
- B: the I and W ops of each component interleaved as a full backward runs them (so the column-parallel wgrad hides
  the input-gradient reduce-scatter). Schedules with split backward actions (zero-bubble, V, DualPipe) run I and W
  separately and B = I + W; the others run B and W is its weight-gradient part (I = B - W).
Pipeline p2p: one activation (forward) or gradient (backward) tensor of [s/cp (/tp with SP), b, h] in the params
dtype per boundary, priced as a send/recv over the two ranks' placement (intra- or inter-node); with the 2021-era
scatter/gather (plan.p2p_scatter_gather) 1/tp of it per link plus the receiver's all-gather over TP.
Host issue: each action's kernels are issued at projection/perf/costmodel.host_issue's seconds per kernel; its compute
kernels (not its collectives and copies) times the framework host factor of forward or backward actions
(costmodel.framework_host_factors: Megatron's modules against the eager reference the per-kernel figure was measured
on).
Collectives are priced with `cost_model.collective_seconds` over placements computed from the scenario's cluster
(projection/perf/placement.py), so a cost model built for another cluster size prices them right.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from projection.cost.collectives import GroupPlacement
from projection.cost.model import CostModel, op_label, priced_collective
from projection.memory.offload import layer_offload_splits
from projection.perf.action_time import ActionTime, add_times, run_items
from projection.perf.checks import check_ops, scalar_check_items, token_count_syncs
from projection.perf.costmodel import framework_host_factors, host_issue
from projection.perf.fsdp_sizes import FsdpSizes
from projection.perf.items import GEMMS, Entry, ItemBuilder, Unit, mark_async
from projection.perf.placement import boundary_placement, op_placements
from projection.perf.stage_params import StageParams, stage_params
from projection.schedule.action import Schedule
from projection.schedule.registry import SPLIT_BACKWARD
from projection.sim.costs import CommTask, StageCosts
from projection.specs.model import keys_per_query
from projection.specs.scenario import Scenario
from projection.specs.training import DTYPE_BYTES, TrainingSpec
from projection.workload.ops import Op, embedding_ops, layer_ops, mtp_ops, output_ops
from projection.workload.ops_base import cp_exchange
from projection.workload.stages import StageSlot, split_stages

"""Schedules whose action lists hold separate I and W actions (checked against build_schedule in the tests)."""


@dataclass(frozen=True)
class StagePrice:
    """One virtual stage, one microbatch. FLOPs are per rank: `model_flop` the executed forward and backward op
    FLOPs, `recompute_flop` the recomputed forward FLOPs (attention counted over the full s x s matrix, the
    convention of Megatron's model-FLOPs formula)."""

    stage: int
    pp_rank: int
    chunk: int
    f: ActionTime
    i: ActionTime
    w: ActionTime
    b: ActionTime
    model_flop: float
    recompute_flop: float
    params: StageParams
    fsdp_gather_s: tuple[float, ...] = ()  # per FSDP unit (forward order) when gathered once per step, else ()
    fsdp_scatter_s: tuple[float, ...] = ()  # per FSDP unit when reduce-scattered once per step, else ()
    fsdp_replicate_s: tuple[float, ...] = ()  # per unit, its HSDP replica all-reduce when reduced once per step

    @property
    def f_s(self) -> float:
        return self.f.seconds

    @property
    def i_s(self) -> float:
        return self.i.seconds

    @property
    def w_s(self) -> float:
        return self.w.seconds

    @property
    def b_s(self) -> float:
        return self.b.seconds


@dataclass(frozen=True)
class PricedStages:
    """Priced virtual stages (data-flow order, model stages for DualPipe) and pipeline boundaries (seconds)."""

    schedule: str
    stages: tuple[StagePrice, ...]
    p2p_fwd_s: tuple[float, ...]
    p2p_bwd_s: tuple[float, ...]
    p2p_bytes: int
    p2p_placements: tuple[GroupPlacement, ...]
    split_backward: bool
    host_kernel_issue_s: float
    provenance: Mapping[str, float] = field(default_factory=dict)
    """Seconds of one microbatch through every stage, per cost source ('roofline', 'calibrated: ...')."""
    host_source: str = ""  # where host_kernel_issue_s comes from (projection/perf/costmodel.host_issue)
    host_factors: tuple[float, float] = (1.0, 1.0)  # on host_kernel_issue_s in forward / backward actions
    """Framework host factors (projection/perf/costmodel.framework_host_factors)."""

    def action_time(self, stage: int, kind: str) -> ActionTime:
        """Priced action of schedule kind F, B, I or W on model stage `stage`."""
        sp = self.stages[stage]
        return {"F": sp.f, "I": sp.i, "W": sp.w}.get(kind, sp.b)

    def stage_costs(self, schedule: Schedule, comm_tasks: Sequence[CommTask] = ()) -> StageCosts:
        """StageCosts for `schedule` (its stages map to priced model stages via Schedule.model_stage)."""
        f, i, w = [], [], []
        for s in range(schedule.n_stages):
            sp = self.stages[schedule.model_stage(s)]
            if self.split_backward:
                f.append(sp.f_s)
                i.append(sp.i_s)
                w.append(sp.w_s)
            else:
                ws = min(sp.w_s, sp.b_s)
                f.append(sp.f_s)
                i.append(sp.b_s - ws)
                w.append(ws)
        n = schedule.n_stages - 1
        fwd = tuple(self.p2p_fwd_s[k] if k < len(self.p2p_fwd_s) else 0.0 for k in range(n))
        bwd = tuple(self.p2p_bwd_s[k] if k < len(self.p2p_bwd_s) else 0.0 for k in range(n))
        return StageCosts(tuple(f), tuple(i), tuple(w), fwd, bwd, tuple(comm_tasks))


LayerSignature = tuple[bool, int, bool, str, int]


def layer_signature(scenario: Scenario, layer: int) -> LayerSignature:
    """Decoder layers with equal signatures have equal op lists: they differ only in being MoE or dense, in their
    sliding window, in running fp8 or not (Fp8Spec.layer_in_fp8), in their context-parallel exchange (a per-layer
    --cp-comm-type) and, for recompute choices that name layers (layer ids, block, every N-th layer), in the layer
    index itself."""
    r = scenario.plan.recompute
    varies = (r.granularity == "full" and (r.layer_ids is not None or r.method == "block")) or \
        any(m.startswith("layer:") for m in r.modules)
    model, fp8 = scenario.model, scenario.training.fp8
    in_fp8 = fp8 is not None and fp8.layer_in_fp8(layer, model.num_layers)
    return (model.is_moe_layer(layer), model.window_of(layer) or 0, in_fp8, cp_exchange(scenario.plan, layer),
            layer if varies else -1)


def stage_components(scenario: Scenario, slot: StageSlot, cache: dict[LayerSignature, tuple[Op, ...]] | None = None
                     ) -> list[tuple[str, tuple[Op, ...]]]:
    """The op tuples of one stage's components in forward order: embedding, layers, MTP depths, output. `cache`
    reuses the op list of an equal layer (layer_signature)."""
    m, t, p = scenario.model, scenario.training, scenario.plan
    memo = cache if cache is not None else {}
    comps: list[tuple[str, tuple[Op, ...]]] = []
    if slot.embedding:
        comps.append(("embedding", embedding_ops(m, t, p)))
    for i in slot.layers:
        sig = layer_signature(scenario, i)
        if sig not in memo:
            memo[sig] = layer_ops(m, t, p, i)
        comps.append((f"layer{i}", memo[sig]))
    comps += [(f"mtp{d}", mtp_ops(m, t, p, d)) for d in range(slot.mtp_layers)]
    if slot.loss:
        comps.append(("output", output_ops(m, t, p)))
    return comps


def price_stages(scenario: Scenario, cost_model: CostModel) -> PricedStages:
    """Seconds per virtual stage (F, I, W, B for one microbatch) and per pipeline boundary for the scenario's plan
    and schedule (`plan.schedule`; V schedules place stages in a V)."""
    model, training, plan, cluster = scenario.model, scenario.training, scenario.plan, scenario.cluster
    host_s, host_source = host_issue(scenario, cost_model)
    host_f, host_b, factor_note = framework_host_factors(scenario, host_source)
    host_source = f"{host_source}; {factor_note}" if factor_note else host_source
    groups = op_placements(cluster, plan)
    compute_memo: dict[Op, float] = {}
    coll_memo: dict[tuple[str, int, str], float] = {}

    def compute_s(op: Op) -> float:
        if op not in compute_memo:
            compute_memo[op] = cost_model.op_seconds(op)
        return compute_memo[op]

    def coll_s(op: Op) -> float:
        key = (op.coll or "", op.coll_bytes, op.group or "")
        if key not in coll_memo:
            coll_memo[key] = cost_model.collective_seconds(op.coll or "all_reduce", op.coll_bytes, groups[op.group or
                                                                                                          "dp"])
        return coll_memo[key]

    builder = ItemBuilder(plan, compute_s, coll_s, token_count_syncs(scenario))
    fsdp = FsdpSizes(scenario, cost_model)
    once_ag = plan.pipelined_fsdp and not plan.sharding.reshard_after_forward
    prov: dict[str, float] = {}
    out = []
    layers: dict[LayerSignature, tuple[Op, ...]] = {}
    offload_memo: dict[tuple[object, ...], tuple[float, float]] = {}  # per-layer offload bytes, across stages
    priced: dict[tuple[object, ...], tuple[StagePrice, dict[str, float]]] = {}
    for slot in split_stages(model, plan):
        key = (slot.embedding, slot.loss, slot.mtp_layers, *(layer_signature(scenario, i) for i in slot.layers))
        if key in priced:  # an equal stage elsewhere in the pipeline: same seconds
            done, stage_prov = priced[key]
            out.append(replace(done, stage=slot.stage, pp_rank=slot.pp_rank, chunk=slot.chunk,
                               params=stage_params(model, plan, slot)))
            for k, v in stage_prov.items():
                prov[k] = prov.get(k, 0.0) + v
            continue
        comps = stage_components(scenario, slot, layers)
        params = stage_params(model, plan, slot)
        hooked = {n: (k, e) for n, k, e in params.hooked} if plan.sharding.zero_stage < 3 else {}
        mine: dict[str, float] = {}
        sourced: list[Op] = []  # what the stage's actions run, priced under each op's cost source
        gathers, scatters, replicas = fsdp.unit_seconds(params, [name for name, _ in comps])
        mine.update(fsdp.sources(plan, training.num_microbatches(plan.dp_())))  # the units' collectives
        copy_s = _offload_seconds(scenario, slot, offload_memo)
        fwd_units, i_units, w_units, b_units = [], [], [], []
        mflop = rflop = 0.0
        for (name, ops), ag, rs, ar, (outs, ins) in zip(comps, gathers, scatters, replicas, fsdp.copies, strict=True):
            fwd = [o for o in ops if o.phase == "F" and not o.recompute]
            rec = [o for o in ops if o.recompute]
            hook = _grad_hooks(name, *hooked.get(name, (0, 0)), training)
            bwd = mark_async(_with_grad_accumulation([o for o in ops if o.phase != "F"], training) + hook)
            # re-gathered for backward only when resharded after forward; TorchTitan's [norm, output] unit never is
            # (model_states.unsharded_unit_bytes)
            # (except under PP, where a resharded plan can only come from the "always" policy, which TorchTitan
            # passes to that unit too)
            bag = ag if plan.sharding.reshard_after_forward and not (
                name == "output" and plan.sharding.fsdp == "torch_fsdp2" and not plan.pipelined_fsdp) else ()
            # pipelined FSDP2 reduces once per step and never reshards after backward: without reshard after forward
            # it gathers once per step (dp.py schedules both); with it, each backward re-gathers and the next forward
            # finds the unit still unsharded (only the warm-up forwards gather, not priced)
            fag = () if plan.pipelined_fsdp else ag
            frs, far = ((), 0.0) if plan.pipelined_fsdp else (rs, ar)
            copy = copy_s.get(name, 0.0)
            # FSDP2's compute-stream copies (perf/fsdp_sizes.py): a gathered unit's copy-out before its ops, the
            # gradients' copy into the reduce-scatter buffer after them
            f_out = tuple(Entry(o) for o in outs) if fag else ()
            b_out = tuple(Entry(replace(o, phase="I")) for o in outs) if bag else ()
            cat = tuple(Entry(o) for o in ins) if frs else ()
            fwd_units.append(Unit(f_out + tuple(Entry(o) for o in fwd), gather_s=fag, offload_s=copy))
            rec_e = b_out + tuple(Entry(o) for o in rec)
            i_units.append(Unit(rec_e + tuple(e for e in bwd if e.op.phase == "I"), gather_s=bag, reload_s=copy))
            w_units.append(Unit(tuple(e for e in bwd if e.op.phase == "W") + cat, scatter_s=frs, replicate_s=far))
            b_units.append(Unit(rec_e + bwd + cat, gather_s=bag, scatter_s=frs, reload_s=copy, replicate_s=far))
            mflop += sum(o.total_flop for o in ops if not o.recompute)
            rflop += sum(o.total_flop * _noncausal_factor(o) for o in rec)
            # every op the actions run: FSDP2's copies, the forward, the recomputed forward, and the backward with the
            # main-gradient adds of unfused accumulation and of the hooked parameters (an audit found those left out)
            sourced += [*(e.op for e in f_out + b_out + cat), *fwd, *rec, *(e.op for e in bwd)]
        checks = scalar_check_items("loss", compute_s) if slot.loss and training.loss_nan_checks else []
        sourced += check_ops("loss") if checks else []
        for o in sourced:
            label = op_label(cost_model, o)
            mine[label] = mine.get(label, 0.0) + (coll_s(o) * o.count if o.kind == "collective" else compute_s(o))
        # the framework host factor is measured on a layer's compute kernels: collectives and copies keep host_s
        f = run_items(builder.items(fwd_units, False) + checks, host_s * host_f, host_s)
        i = run_items(builder.items(i_units[::-1], True), host_s * host_b, host_s)
        w = run_items(builder.items(w_units[::-1], True), host_s * host_b, host_s)
        split = plan.schedule in SPLIT_BACKWARD
        b = add_times((i, w)) if split else run_items(builder.items(b_units[::-1], True), host_s * host_b, host_s)
        out.append(StagePrice(slot.stage, slot.pp_rank, slot.chunk, f, i, w, b, mflop, rflop, params,
                              tuple(sum(g) for g in gathers) if once_ag else (),
                              tuple(sum(r) for r in scatters) if plan.pipelined_fsdp else (),
                              tuple(replicas) if plan.pipelined_fsdp else ()))
        priced[key] = (out[-1], mine)
        for k, v in mine.items():
            prov[k] = prov.get(k, 0.0) + v
    p2p_sources: dict[str, float] = {}
    p2p_bytes, fwd_s, places = _p2p(scenario, cost_model, out, groups["tp"], p2p_sources)
    for k, v in p2p_sources.items():  # each boundary crossed twice a microbatch: activation forward, gradient back
        prov[k] = prov.get(k, 0.0) + 2 * v
    return PricedStages(plan.schedule, tuple(out), fwd_s, fwd_s, p2p_bytes, places, plan.schedule in SPLIT_BACKWARD,
                        host_s, prov, host_source, (host_f, host_b))


def _offload_seconds(scenario: Scenario, slot: StageSlot,
                     memo: dict[tuple[object, ...], tuple[float, float]]) -> dict[str, float]:
    """Seconds to copy each decoder layer's offloaded activations (Megatron fine-grained or layer-level
    activation offloading, projection.memory.offload.layer_offload_splits: the same bytes the memory estimate
    moves off the GPU) over the device's host link, one direction: device to host after the layer's forward, back
    before its backward. Without a host link in the device YAML the copies are not priced (projection notes)."""
    bw = scenario.cluster.device.host_link_bytes_per_s
    off = scenario.plan.offload
    if not (off.activation_modules or off.activation_layers) or not bw:
        return {}
    return {f"layer{i}": off / bw for i, _, off in layer_offload_splits(scenario, slot, memo) if off > 0}


def _grad_hooks(component: str, tensors: int, elements: int, training: TrainingSpec) -> list[Op]:
    """The main-gradient adds of the parameters no GEMM writes a gradient for (norms, biases, embedding tables):
    per tensor, read its gradient (params dtype) and the fp32 buffer, write the buffer."""
    if tensors <= 0:
        return []
    act = DTYPE_BYTES[training.params_dtype]
    main = DTYPE_BYTES[training.optimizer.main_grads_dtype]
    return [Op(f"{component}.grad_hooks", "memory_bound", "W", dtype=training.params_dtype,
               bytes_read=elements * (act + main) / tensors, bytes_written=elements * main / tensors, count=tensors)]


def _with_grad_accumulation(bwd: list[Op], training: TrainingSpec) -> list[Op]:
    """Without gradient-accumulation fusion, each wgrad GEMM writes a gradient in the activation dtype that Megatron's
    DDP hook adds into the main-gradient buffer: read the gradient and the buffer, write the buffer."""
    if training.gradient_accumulation_fusion:
        return bwd
    act = DTYPE_BYTES[training.params_dtype]
    main = DTYPE_BYTES[training.optimizer.main_grads_dtype]
    out: list[Op] = []
    for op in bwd:
        out.append(op)
        if op.phase == "W" and op.kind in GEMMS:
            elems = op.m * op.n * (op.batch if op.kind == "grouped_gemm" else 1)
            out.append(replace(op, name=f"{op.name}.main_grad_add", kind="memory_bound", flop=0.0,
                               bytes_read=elems * (act + main), bytes_written=elems * main, m=0, n=0, k=0, batch=1,
                               layout="", count=1))
    return out


def _p2p(scenario: Scenario, cost_model: CostModel, stages: Sequence[StagePrice], tp_group: GroupPlacement,
         sources: dict[str, float]) -> tuple[int, tuple[float, ...], tuple[GroupPlacement, ...]]:
    """The boundary tensor's bytes, each boundary's send seconds (one direction) and placement; `sources` gets each
    boundary's seconds under its cost source."""
    plan, training, model = scenario.plan, scenario.training, scenario.model
    tokens = training.micro_batch_size * training.seq_length // plan.cp // (plan.tp if plan.sp_ else 1)
    size = tokens * model.hidden_size * DTYPE_BYTES[training.params_dtype]
    sent = size
    if plan.p2p_scattered:  # Narayanan et al. 2021 §4.1: each TP rank sends size / tp over its own link, and the
        # receiver all-gathers the tp chunks over its TP group before the pass (Megatron 2021 gather_split_1d_tensor)
        sent = size // plan.tp
    secs, places = [], []
    for a, b in zip(stages, stages[1:], strict=False):
        place = boundary_placement(scenario.cluster, plan, a.pp_rank, b.pp_rank)
        places.append(place)
        if place.n_ranks > 1:
            gather = priced_collective(cost_model, "all_gather", size, tp_group, sources) if plan.p2p_scattered \
                else 0.0
            secs.append(priced_collective(cost_model, "send_recv", sent, place, sources) + gather)
        else:
            secs.append(0.0)
    return size, tuple(secs), tuple(places)


def _noncausal_factor(op: Op) -> float:
    """Hardware FLOPs count recomputed attention as the model-FLOPs formula does, over the full s x s (or min(s, w)
    keys per query with a sliding window), where the causal op list holds the lower triangle (or the band)."""
    if op.kind != "attention" or not op.causal:
        return 1.0
    window = op.window or None
    return keys_per_query(op.n, window, causal=False) / keys_per_query(op.n, window, causal=True)
