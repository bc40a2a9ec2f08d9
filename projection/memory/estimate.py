"""`estimate_memory`: per pipeline rank, model states + in-flight activations (counted from the schedule's action
lists) + transient working sets + framework buffers, allocated and reserved peaks, and a verdict against HBM.

The allocated peak of a rank is the larger of two moments of a training step:
* forward/backward: model states + persistent buffers (buffers.py) + the saved activations of the microbatches in
  flight at the rank's worst point of its action list + the largest transient of that moment: on the stage holding
  the loss, the loss working set (plus, with --defer-embedding-wgrad-compute, the output-layer tensors held for the
  deferred weight gradients); during backward, the gradient working set (and the layer being recomputed). These
  transients happen at different times, so the peak takes the largest, not their sum.
* optimizer step: model states + persistent buffers + the step's own transients (Megatron's fp32 copies of 16-bit
  main grads). Optimizer state counts in full: the measured statistic is taken after the first step, when the
  lazily created moments exist.

Megatron's loss (megatron/core/tensor_parallel/cross_entropy.py and fusions/fused_cross_entropy.py, the native
implementations of both --cross-entropy-loss-fusion settings) upcasts the vocab-parallel logits to fp32 once and
turns that copy into the saved softmax in place (sub_, exp(out=), div_), so the loss moment holds the saved fp32
softmax plus the 16-bit logits it was cast from, nothing more; in backward the gradient is written into the softmax
in place and cast back to 16 bit (by autograd, or by the fused function itself), the same two tensors again.
TE's fused cross entropy (--cross-entropy-fusion-impl te) works in place on the 16-bit logits.

Activation offloading (what stays on the GPU per layer): memory/offload.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Literal

import numpy as np

from projection.errors import ConfigError, PlanError, Problem
from projection.memory.activations import (
    _SELECTIVE_DROPS,
    dims,
    embedding_tensors,
    layer_input_bytes,
    layer_tensors,
    loss_tensors,
    loss_working_set,
    op_sac_tensors,
    recomputed_layers,
)
from projection.memory.allocator import reserved_bytes
from projection.memory.buffers import (
    Runtime,
    deferred_wgrad_bytes,
    optimizer_step_bytes,
    persistent_buffer_bytes,
    runtime_for,
)
from projection.memory.model_states import model_state_bytes
from projection.memory.offload import layer_offload_splits, offload_split
from projection.memory.pipeline_io import (
    finished_matrices,
    in_flight_io_bytes,
    kept_input_grad_bytes,
    kept_output_weights,
    merge_copy_bytes,
    receive_buffer_bytes,
)
from projection.memory.report import MemoryReport, RankMemory, verdict
from projection.schedule.registry import TOO_MANY_MICROBATCHES_FIX, ScheduleTooLarge
from projection.specs.accumulation import schedule_microbatches
from projection.specs.scenario import Scenario
from projection.workload.params import per_rank_params
from projection.workload.stages import StageSlot, split_stages

# Per rank, after each compute action: live in-flight microbatches per virtual stage.
InflightTimeline = Sequence[Sequence[dict[int, int]]]
Matrices = tuple[tuple[tuple[int, ...], "np.ndarray"], ...]


def _loss_saved(sc: Scenario, rt: Runtime) -> dict[str, float]:
    """Tensors the loss stage saves per microbatch: final-norm input, output-layer input and the cross-entropy
    state. Megatron keeps the fp32 softmax for both native loss implementations; TE's fused loss the 16-bit
    gradient; other frameworks as activations.loss_tensors says."""
    m, t, p = sc.model, sc.training, sc.plan
    out = loss_tensors(m, t, p)
    if rt.megatron:
        D = dims(m, t, p)
        v = m.padded_vocab(p.tp) / D.t
        out["loss.softmax"] = (D.e if rt.ce_fusion_te else 4) * D.T * v
    return out


def _loss_working(sc: Scenario, rt: Runtime) -> float:
    """Transient bytes of the loss on top of its saved tensors (see module docstring)."""
    m, t, p = sc.model, sc.training, sc.plan
    if not rt.megatron:
        return loss_working_set(m, t, p)
    if rt.ce_fusion_te:
        return 0.0
    D = dims(m, t, p)
    return D.e * D.T * m.padded_vocab(p.tp) / D.t  # the 16-bit logits beside their fp32 copy


def stage_activation_bytes(sc: Scenario, slot: StageSlot, rt: Runtime | None = None,
                           memo: dict[tuple[object, ...], tuple[float, float]] | None = None
                           ) -> tuple[float, dict[str, float]]:
    """Bytes one in-flight microbatch keeps on virtual stage `slot`, and the named terms. `memo` caches per-layer
    results across calls of one estimate (layers of the same kind and recompute treatment keep the same bytes)."""
    memo = {} if memo is None else memo
    rt = rt or runtime_for(sc)
    m, t, p = sc.model, sc.training, sc.plan
    terms: dict[str, float] = {}
    for i, resident, _ in layer_offload_splits(sc, slot, memo):
        kind = "moe_layer" if m.is_moe_layer(i) else "dense_layer"
        terms[f"activations.{kind}s"] = terms.get(f"activations.{kind}s", 0.0) + resident
    if slot.embedding:
        terms["activations.embedding"] = sum(embedding_tensors(m, t, p).values())
    if slot.loss:
        terms["activations.loss"] = sum(_loss_saved(sc, rt).values())
    if slot.mtp_layers:
        # An MTP depth: its transformer layer (built like the last decoder layer, same recompute settings), the
        # inputs of its two norms and of eh_proj, and its own loss over the shared output layer.
        last = m.num_layers - 1
        # ... in fp8 even where the last decoder layer is kept in bf16 (Megatron-Core runs MTP in the global fp8
        # context: multi_token_prediction.py, "currently MTP only use global fp8 context")
        mtp_sc = sc if t.fp8 is None else sc.model_copy(update={"training": t.model_copy(update={
            "fp8": t.fp8.model_copy(update={"bf16_last_layers": 0})})})
        resident, off = offload_split(mtp_sc, last, last in recomputed_layers(p, (last,)))
        per_depth = resident + 3 * layer_input_bytes(m, t, p) + sum(_loss_saved(sc, rt).values())
        terms["activations.mtp"] = slot.mtp_layers * per_depth + (off if slot.loss else 0.0)
    return sum(terms.values()), terms


def _with_pipeline_io(sc: Scenario, slot: StageSlot, slots: Sequence[StageSlot],
                      stage: tuple[float, dict[str, float]]) -> tuple[float, dict[str, float]]:
    """A stage's bytes per in-flight microbatch with what torch.distributed.pipelining holds for it beyond the saved
    activations, less its received input where the first layer's term counts that receive buffer (counted with the
    buffers) (memory/pipeline_io.py; unchanged for other runtimes)."""
    n = len(slots)
    same_rank_next = slot.stage + 1 < n and slots[slot.stage + 1].pp_rank == slot.pp_rank
    same_rank_prev = slot.stage > 0 and slots[slot.stage - 1].pp_rank == slot.pp_rank
    held, counted = in_flight_io_bytes(sc, slot, n, same_rank_next, same_rank_prev)
    if not held and not counted:
        return stage
    terms = dict(stage[1])
    if held:
        terms["activations.pipeline_outputs"] = held
    if counted:
        key = "activations.moe_layers" if sc.model.is_moe_layer(slot.layers[0]) else "activations.dense_layers"
        terms[key] = max(0.0, terms.get(key, 0.0) - counted)
    return sum(terms.values()), terms


def _selective_recompute_bytes(sc: Scenario, tensors: dict[str, float], i: int) -> float:
    """Selective recompute rebuilds one module's dropped tensors right before that module's backward, beside the
    saved ones. Backward runs a layer's MLP/MoE block before its attention, so when an attention-side module is
    rebuilt the block's saved tensors are already freed (measured with MemTracker, tests/oracle). A 'layer:N'
    entry rebuilds a whole checkpointed layer whose input is already saved; TorchTitan's per-op checkpoint ('op')
    re-runs the whole block's forward at its first unpack, rebuilding everything it did not keep (layer i's
    inventory `tensors` against op_sac_tensors)."""
    p = sc.plan
    if p.recompute.granularity != "selective":
        return 0.0
    mods = p.recompute.modules or ("core_attn",)
    if "op" in mods:
        kept = op_sac_tensors(sc.model, sc.training, p, i)
        return max(0.0, sum(tensors.values()) - sum(kept.values()))
    dropped = {n for mod in mods for n in _SELECTIVE_DROPS.get(mod, ())}
    block_saved = sum(v for k, v in tensors.items() if not k.startswith("attn.") and k not in dropped)
    best = 0.0
    for mod in mods:
        if mod.startswith("layer:"):
            best = max(best, sum(tensors.values()) - layer_input_bytes(sc.model, sc.training, sc.plan))
            continue
        names = _SELECTIVE_DROPS.get(mod, ())
        attn = sum(tensors.get(n, 0.0) for n in names if n.startswith("attn."))
        block = sum(tensors.get(n, 0.0) for n in names if not n.startswith("attn."))
        best = max(best, block, attn - block_saved)
    return best


def working_moments(sc: Scenario, slots: Sequence[StageSlot], rt: Runtime | None = None
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """Transient bytes on top of the saved activations, at the two moments a rank can peak: the loss moment on the
    stage holding the loss (loss working set, deferred output-layer wgrad tensors) and the backward moment (the
    tensors being recomputed, the gradient of the largest live tensor plus two hidden-size gradients of the
    residual stream). With activation offloading, one layer's offloaded tensors are resident at either moment."""
    rt = rt or runtime_for(sc)
    m, t, p = sc.model, sc.training, sc.plan
    layers = [i for s in slots for i in s.layers]
    backward: dict[str, float] = {}
    if layers:
        full = set().union(*(recomputed_layers(p, s.layers) for s in slots))
        chunk = max(1, p.recompute.num_layers or 1) if p.recompute.method == "uniform" else 1
        probe = {layers[0], layers[-1], *[i for i in layers if m.is_moe_layer(i)][:1]}
        tensors = {i: layer_tensors(m, t, p, i) for i in probe}
        big = max(tensors, key=lambda i: sum(tensors[i].values()))
        largest = tensors[big]
        selective = _selective_recompute_bytes(sc, largest, big)
        if full:
            # A checkpointed chunk is rebuilt whole at the start of its backward; backward then runs the last
            # layer's MLP/MoE block first (every tensor of the layer live, plus the gradient of the block's largest
            # tensor) and its attention after the MLP's tensors are freed.
            attn = [v for k, v in largest.items() if k.startswith("attn.")]
            rest = [v for k, v in largest.items() if not k.startswith("attn.")]
            staged = max(sum(largest.values()) + max(rest, default=0.0), sum(attn) + max(attn, default=0.0))
            # the chunk's checkpointed input is already counted among the saved activations
            backward["working.recompute"] = (chunk - 1) * sum(largest.values()) + staged \
                - layer_input_bytes(m, t, p)
            backward["working.backward"] = 2 * layer_input_bytes(m, t, p)
        else:
            if selective:
                backward["working.recompute"] = selective
            backward["working.backward"] = max(largest.values()) + 2 * layer_input_bytes(m, t, p)
        transit = max(offload_split(sc, i)[1] for i in probe)
        if transit:
            backward["working.offload_transit"] = transit
        casts = _fp8_cast_bytes(sc, probe)
        if casts:
            backward["working.fp8_casts"] = casts
    loss: dict[str, float] = {}
    if any(s.loss for s in slots):
        loss["working.loss"] = _loss_working(sc, rt)
        held = deferred_wgrad_bytes(sc, rt, t.num_microbatches(p.dp_()))
        if held:
            loss["working.deferred_wgrad"] = held
        if "working.offload_transit" in backward:
            loss["working.offload_transit"] = backward["working.offload_transit"]
    return loss, backward


def _fp8_cast_bytes(sc: Scenario, layers: set[int]) -> float:
    """FP8 libraries that cast on the fly hold the fp8 copies of the running GEMM's operands (1 B each), the largest
    over the layers' FP8 GEMMs at the backward moment. For a linear of weight W (m x k) over x (n x k) with output
    gradient dy (n x m): torchao casts W + x in forward, dy + W for dgrad and dy + x for wgrad (W not at all when FSDP
    gathered it in fp8, Fp8Spec.gathers_in_fp8); Primus-Turbo casts only dy, its fp8 x and W being saved
    activations. Transformer Engine's copies are cached or saved, counted elsewhere."""
    f8 = sc.training.fp8
    if f8 is None or f8.caches_weights:
        return 0.0
    from projection.workload.ops import layer_ops

    best = 0.0
    for i in layers:
        for op in layer_ops(sc.model, sc.training, sc.plan, i):
            if op.kind not in ("gemm", "grouped_gemm") or op.dtype != "fp8" or op.phase != "F":
                continue
            gathered = f8.gathers_in_fp8("experts" if op.kind == "grouped_gemm" else "attention")
            w = 0 if gathered else op.m * op.k
            x, dy = op.n * op.k, op.n * op.m
            held = dy if f8.saves_fp8_weights else max(w + x, dy + w, dy + x)
            best = max(best, op.batch * held)
    return float(best)


def _loss_freed_in_backward(sc: Scenario, slots: Sequence[StageSlot], counts: dict[int, int],
                            rt: Runtime) -> dict[str, float]:
    """Saved loss tensors of the one microbatch whose backward is running on the loss stage: its loss backward ran
    first and released them, so the backward moment does not hold them."""
    out: dict[str, float] = {}
    for s in slots:
        if s.loss and counts.get(s.stage, 0) > 0:
            per_mb = sum(_loss_saved(sc, rt).values())
            out["activations.loss"] = per_mb
            if s.mtp_layers:
                out["activations.mtp"] = s.mtp_layers * per_mb
    return out


def default_inflight(sc: Scenario) -> InflightTimeline:
    """In-flight timeline of the plan's schedule, read from its action lists."""
    from projection.schedule.inflight import inflight_timeline
    from projection.schedule.registry import build_schedule

    p = sc.plan
    n_micro = schedule_microbatches(sc)  # one pipeline schedule (TorchTitan runs one per accumulation step)
    sched = build_schedule(p.schedule, p.pp, n_micro, p.vpp_, microbatch_group_size=p.microbatch_group_size,
                           style=p.schedule_style, combined_1f1b=p.megatron_combined_1f1b)
    return inflight_timeline(sched)


def _default_matrices(sc: Scenario) -> Matrices:
    p = sc.plan
    m = schedule_microbatches(sc)
    try:
        return _schedule_matrices(p.schedule, p.pp, m, p.vpp_, p.microbatch_group_size, p.schedule_style,
                                  p.megatron_combined_1f1b)
    except ScheduleTooLarge as e:
        raise ConfigError(Problem(str(e), key="training.global_batch_size", file=sc.source,
                                  fix=TOO_MANY_MICROBATCHES_FIX)) from None
    except ValueError as e:  # the schedule's own rule (e.g. a V schedule's microbatch count): a user error
        raise ConfigError(Problem(str(e), key="plan.schedule", file=sc.source,
                                  fix=f"pick a schedule that accepts pp {p.pp}, vpp {p.vpp_} and {m} microbatches "
                                  "(projection schedule --help lists them)")) from None


@lru_cache(maxsize=512)
def _schedule_matrices(name: str, pp: int, n_micro: int, vpp: int, group: int | None,
                       style: Literal["megatron", "torch"] = "megatron", combined_1f1b: bool = False) -> Matrices:
    """In-flight matrices of a schedule, cached by its shape (hashing a built Schedule would cost O(actions))."""
    from projection.schedule.inflight import inflight_matrices
    from projection.schedule.registry import build_schedule

    return inflight_matrices(build_schedule(name, pp, n_micro, vpp, microbatch_group_size=group, style=style,
                                            combined_1f1b=combined_1f1b))


def estimate_memory(sc: Scenario, inflight: Callable[[Scenario], InflightTimeline] | None = None,
                    runtime: Runtime | None = None) -> MemoryReport:
    """Per-rank memory of one training step (bytes). `inflight` overrides the schedule's in-flight timeline
    (default: built from the plan's schedule); `runtime` supplies framework facts (default: runtime_for(sc))."""
    from projection.schedule.inflight import timeline_matrices

    if sc.plan.schedule == "dualpipe":
        # DualPipe keeps two model stages (r and pp-1-r, i.e. two weight copies' worth of layers) per rank; the
        # stage split here places one. DualPipeV (vpp 2) is the supported V-shaped variant.
        raise PlanError(Problem("memory for the bidirectional 'dualpipe' schedule is not modelled yet",
                                key="plan.schedule", file=sc.source, fix="use dualpipev (vpp 2) or another schedule"))
    rt = runtime or runtime_for(sc)
    slots = split_stages(sc.model, sc.plan)
    memo: dict[tuple[object, ...], tuple[float, float]] = {}
    mats = _default_matrices(sc) if inflight is None else timeline_matrices(inflight(sc))
    # torch's output_chunks: finished microbatches per point (unknown for a caller's own timeline) x bytes kept
    keep = kept_output_weights(sc, slots)
    done_mats = finished_matrices(sc) if any(keep.values()) and inflight is None else None
    ranks = []
    for rp in per_rank_params(sc.model, sc.plan):
        r = rp.pp_rank
        mine = [s for s in slots if s.pp_rank == r]
        per_stage = {s.stage: _with_pipeline_io(sc, s, slots, stage_activation_bytes(sc, s, rt, memo))
                     for s in mine}
        loss_ws, bwd_ws = working_moments(sc, mine, rt)
        loss_stages = {s.stage for s in mine if s.loss}
        # The worst point of the rank's action sequence: live microbatches x bytes each, plus the larger transient
        # of that point (the loss moment only where a microbatch is live on the loss stage; the backward moment
        # without the loss tensors its own loss backward already released).
        freed_if_live = _loss_freed_in_backward(sc, mine, dict.fromkeys(loss_stages, 1), rt)
        Moment = tuple[float, dict[str, float], dict[str, float]]
        none: dict[str, float] = {}
        at_backward: Moment = (sum(bwd_ws.values()) - sum(freed_if_live.values()), bwd_ws, freed_if_live)
        at_loss: Moment = (sum(loss_ws.values()), loss_ws, none)
        idle: Moment = (sum(bwd_ws.values()), bwd_ws, none)
        best_counts: dict[int, int] = {}
        work, freed = none, none
        stages, counts = mats[r]
        host_activations = 0.0  # pinned host memory the offloaded activations of the in-flight microbatches fill
        kept_at = 0
        if counts.shape[0]:
            weights = np.array([per_stage[st][0] if st in per_stage else 0.0 for st in stages])
            saved = counts @ weights
            if done_mats is not None:  # outputs output_chunks keeps after their backward (pipeline_io.py)
                kept_now = done_mats[r][1] @ np.array([keep.get(st, 0.0) for st in stages])
                saved = saved + kept_now
            off = {s.stage: sum(o for _, _, o in layer_offload_splits(sc, s, memo)) for s in mine}
            if any(off.values()):
                host_activations = float(np.max(counts @ np.array([off.get(st, 0.0) for st in stages])))
            cols = [j for j, st in enumerate(stages) if st in loss_stages]
            live = np.asarray((counts[:, cols] > 0).any(axis=1) if cols else np.zeros(len(saved), dtype=bool))
            when_live = max(at_backward, at_loss, key=lambda x: x[0])
            at = int(np.argmax(saved + np.where(live, when_live[0], idle[0])))
            _, work, freed = when_live if bool(live[at]) else idle
            best_counts = {st: int(n) for st, n in zip(stages, counts[at], strict=True)}
            if done_mats is not None and kept_now[at]:
                kept_at = round(float(kept_now[at]))
        act_terms: dict[str, float] = {"activations.pipeline_kept_outputs": kept_at} if kept_at else {}
        for st, n in best_counts.items():
            for k, v in per_stage.get(st, (0.0, {}))[1].items():
                act_terms[k] = act_terms.get(k, 0.0) + n * v
        for k, v in freed.items():
            act_terms[k] = max(0.0, act_terms.get(k, 0.0) - v)
        states = model_state_bytes(sc.model, sc.training, sc.plan, rp)
        bufs = persistent_buffer_bytes(sc, rt, mine)
        recv = receive_buffer_bytes(sc, mine, len(slots), schedule_microbatches(sc))
        if recv:
            bufs["buffers.pipeline_receive_buffers"] = round(recv)
        grads = kept_input_grad_bytes(sc, mine, schedule_microbatches(sc))
        if grads:
            bufs["buffers.pipeline_input_grads"] = round(grads)
        step = optimizer_step_bytes(sc, rt, rp)
        base = {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
                "buffers": sum(bufs.values()), "other": 0}
        fwd_bwd = {**base, "activations": round(sum(act_terms.values()) + sum(work.values()))}
        # after the last backward, torch's output_chunks (pipeline_io.py) still holds every output it keeps: beside
        # the last stage's merged copy of them as the step ends, then through the optimizer step
        kept = {"activations.pipeline_kept_outputs": round(sum(schedule_microbatches(sc) * keep[s.stage]
                                                               for s in mine))}
        merged = {**kept, "activations.pipeline_output_merge": round(merge_copy_bytes(
            sc, mine, len(slots), schedule_microbatches(sc)))}
        opt_step = {**base, "activations": sum(kept.values()), "other": base["other"] + sum(step.values())}
        at_merge = {**base, "activations": sum(merged.values())}
        moments = [(fwd_bwd, {**{k: round(v) for k, v in act_terms.items()}, **{k: round(v) for k, v in work.items()}}),
                   (opt_step, {**step, **kept}), (at_merge, merged)]
        # the addends of the moment the peak is at: the forward/backward's activations and working set, the
        # optimizer step's own buffers, or the last stage's merge of its kept outputs (the first such moment wins)
        by, at_terms = max(moments, key=lambda mo: sum(mo[0].values()))
        if by is not fwd_bwd:  # no microbatch is in flight at the merge or the optimizer step
            best_counts = dict.fromkeys(best_counts, 0)
        terms = {**states.terms, **bufs, **{k: v for k, v in at_terms.items() if v or k not in merged}}
        peak = sum(by.values())
        ranks.append(RankMemory(pp_rank=r, bytes=by, terms=terms, peak_bytes=peak,
                                reserved_bytes=reserved_bytes(peak, by["activations"],
                                                              sc.training.kernels.expandable_segments),
                                cpu_bytes=states.cpu_optimizer + round(host_activations),
                                inflight=best_counts, layers=len(rp.layers),
                                microbatch_activation_bytes={st: round(v[0]) for st, v in per_stage.items()}))
    return verdict(sc, ranks)
