"""`estimate_memory`: per pipeline rank, model states + in-flight activations (counted from the schedule's action
lists) + transient working sets + buffers, allocated and reserved peaks, and a verdict against HBM."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from projection.memory.activations import (
    embedding_tensors,
    layer_input_bytes,
    layer_tensors,
    loss_tensors,
    loss_working_set,
    recomputed_layers,
    saved_layer_bytes,
)
from projection.memory.allocator import reserved_bytes, runtime_bytes
from projection.memory.model_states import model_state_bytes
from projection.memory.report import MemoryReport, RankMemory, verdict
from projection.specs.scenario import Scenario
from projection.workload.params import per_rank_params
from projection.workload.stages import StageSlot, split_stages

# Per rank, after each compute action: live in-flight microbatches per virtual stage.
InflightTimeline = Sequence[Sequence[dict[int, int]]]


def stage_activation_bytes(sc: Scenario, slot: StageSlot) -> tuple[float, dict[str, float]]:
    """Bytes one in-flight microbatch keeps on virtual stage `slot`, and the named terms."""
    m, t, p = sc.model, sc.training, sc.plan
    terms: dict[str, float] = {}
    full = recomputed_layers(p, slot.layers)
    chunk = max(1, p.recompute.num_layers or 1) if p.recompute.method == "uniform" else 1
    for n, i in enumerate(slot.layers):
        kind = "moe_layer" if m.is_moe_layer(i) else "dense_layer"
        b = saved_layer_bytes(m, t, p, i, i in full, chunk_head=(n % chunk == 0))
        terms[f"activations.{kind}s"] = terms.get(f"activations.{kind}s", 0.0) + b
    if slot.embedding:
        terms["activations.embedding"] = sum(embedding_tensors(m, t, p).values())
    if slot.loss:
        terms["activations.loss"] = sum(loss_tensors(m, t, p).values())
    if slot.mtp_layers:
        last = m.num_layers - 1
        per_depth = sum(layer_tensors(m, t, p, last).values()) + 3 * layer_input_bytes(m, t, p) \
            + sum(loss_tensors(m, t, p).values())
        terms["activations.mtp"] = slot.mtp_layers * per_depth
    return sum(terms.values()), terms


def working_set_bytes(sc: Scenario, slots: Sequence[StageSlot]) -> dict[str, float]:
    """Transient bytes on top of the saved activations at the rank's peak: the largest layer being recomputed
    (its full activations rebuilt during backward), the gradient of its largest saved tensor plus two hidden-size
    gradients (residual stream), and the loss working set on the stage holding the loss."""
    m, t, p = sc.model, sc.training, sc.plan
    out: dict[str, float] = {}
    layers = [i for s in slots for i in s.layers]
    if not layers:
        return out
    full = set().union(*(recomputed_layers(p, s.layers) for s in slots))
    chunk = max(1, p.recompute.num_layers or 1) if p.recompute.method == "uniform" else 1
    tensors = {i: layer_tensors(m, t, p, i) for i in {layers[0], layers[-1], *[i for i in layers
                                                                              if m.is_moe_layer(i)][:1]}}
    largest = max(tensors.values(), key=lambda d: sum(d.values()))
    if full:
        out["working.recompute"] = chunk * sum(largest.values())
    out["working.backward"] = max(largest.values()) + 2 * layer_input_bytes(m, t, p)
    if any(s.loss for s in slots):
        out["working.loss"] = loss_working_set(m, t, p)
    return out


def default_inflight(sc: Scenario) -> InflightTimeline:
    """In-flight timeline of the plan's schedule, read from its action lists."""
    from projection.schedule.inflight import inflight_timeline
    from projection.schedule.registry import build_schedule

    p = sc.plan
    n_micro = sc.training.num_microbatches(p.dp_())
    sched = build_schedule(p.schedule, p.pp, n_micro, p.vpp_, microbatch_group_size=p.microbatch_group_size)
    return inflight_timeline(sched)


def estimate_memory(sc: Scenario, inflight: Callable[[Scenario], InflightTimeline] = default_inflight) -> MemoryReport:
    """Per-rank memory of one training step (bytes)."""
    slots = split_stages(sc.model, sc.plan)
    timeline = inflight(sc)
    ranks = []
    for rp in per_rank_params(sc.model, sc.plan):
        r = rp.pp_rank
        mine = [s for s in slots if s.pp_rank == r]
        per_stage = {s.stage: stage_activation_bytes(sc, s) for s in mine}
        # Peak of sum over stages of live microbatches x bytes per microbatch, over the rank's action sequence.
        best, best_counts = 0.0, {}
        for counts in timeline[r]:
            total = sum(n * per_stage[st][0] for st, n in counts.items() if st in per_stage)
            if total > best:
                best, best_counts = total, dict(counts)
        act_terms: dict[str, float] = {}
        for st, n in best_counts.items():
            for k, v in per_stage.get(st, (0.0, {}))[1].items():
                act_terms[k] = act_terms.get(k, 0.0) + n * v
        work = working_set_bytes(sc, mine)
        states = model_state_bytes(sc.model, sc.training, sc.plan, rp)
        other = runtime_bytes(sc)
        terms = {**states.terms, **{k: round(v) for k, v in act_terms.items()},
                 **{k: round(v) for k, v in work.items()}, **other}
        by = {"weights": states.weights, "gradients": states.gradients, "optimizer": states.optimizer,
              "activations": round(sum(act_terms.values()) + sum(work.values())), "buffers": 0,
              "other": sum(other.values())}
        peak = sum(by.values())
        ranks.append(RankMemory(pp_rank=r, bytes=by, terms=terms, peak_bytes=peak,
                                reserved_bytes=reserved_bytes(peak, by["activations"]), cpu_bytes=states.cpu_optimizer,
                                inflight=best_counts, layers=len(rp.layers)))
    return verdict(sc, ranks)
