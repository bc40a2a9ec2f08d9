"""The per-rank op list (workload) of one microbatch: decoder layers, embedding, output layer and loss, MTP depths.

Each function returns a flat tuple of `Op`s: the forward ops (phase F) in execution order, then the forward ops that
activation recomputation re-runs before the backward (phase F, `recompute=True`), then the backward ops in execution
order, each an input-gradient (I: dgrad GEMMs, attention backward, norm/activation backward, conjugate collectives)
or a weight-gradient (W: wgrad GEMMs, embedding gradient) op. Conventions (GEMM layouts, collective sizes, causal
attention FLOPs) are stated in ops_base.py and ops_attention.py. Pure functions of the specs: safe to cache.

Recompute selection follows Megatron-LM (--recompute-granularity/-method/-num-layers/-modules, Korthikanti et al.
2022 §5) and TorchTitan (activation_checkpoint mode full / selective 'op' or 'N'):
- full, uniform (or no method): every layer; full, block: the first `num_layers` layers of each virtual stage;
  full with `layer_ids`: those global layers;
- selective modules: core_attn, mlp, moe (router, dispatch, experts, shared experts), moe_act, layernorm,
  mla_up_proj, shared_experts;
- TorchTitan 'layer:N': full recompute of every N-th layer ((i + 1) % N == 0); 'op' (per-op SAC policy,
  workload/op_sac.py): memory-bound ops, grouped expert GEMMs, FP8 GEMMs, the router, TP all-gathers and every
  second mm are re-run; attention, the other mm outputs, reduce-scatters and all-to-alls are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec
from projection.workload.model_flops import model_flops_per_step
from projection.workload.op_sac import op_sac_recompute
from projection.workload.ops_attention import attention_pieces
from projection.workload.ops_base import (
    CollKind,
    Dims,
    GroupAxis,
    Op,
    OpKind,
    Phase,
    Piece,
    coll,
    column_linear,
    cp_a2a_size,
    cp_exchange,
    dims,
    mem,
    pointwise,
    tp_exit,
)
from projection.workload.ops_eager import eager_cross_entropy, norm
from projection.workload.ops_mlp import ffn_pieces
from projection.workload.stages import StageSlot, split_stages

__all__ = ["CollKind", "GroupAxis", "Op", "OpKind", "Phase", "embedding_ops", "layer_ops", "model_flops_per_step",
           "mtp_ops", "output_ops", "stage_ops"]

_MODULE_TAGS = {"core_attn": {"core_attn"}, "mlp": {"mlp"}, "moe": {"moe", "moe_act", "shared_experts"},
                "moe_act": {"moe_act"}, "layernorm": {"layernorm"}, "mla_up_proj": {"mla_up_proj"},
                "shared_experts": {"shared_experts"}}


def layer_ops(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, layer_index: int) -> tuple[Op, ...]:
    """Ops of decoder layer `layer_index` (0-based, global) on one rank, for one microbatch (a layer kept in bf16
    under fp8 runs as the job without fp8: TrainingSpec.for_layer)."""
    d = dims(model, training.for_layer(layer_index, model.num_layers), plan)
    if len(plan.cp_comm.split()) > 1:  # a per-layer exchange list (native scenarios): this layer's
        d = replace(d, cp_exchange=cp_exchange(plan, layer_index), cp_a2a=cp_a2a_size(plan, layer_index))
    pieces = _layer_pieces(model, d, layer_index)
    fwd = [op for p in pieces for op in p.fwd]
    rec = _recomputed(fwd, _recompute_mode(model, plan, layer_index), model, plan, _fp8_mm(training))
    return (*fwd, *rec, *(op for p in reversed(pieces) for op in p.bwd))


def embedding_ops(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> tuple[Op, ...]:
    """Word (+ learned position) embedding on the first stage: vocab-parallel lookup, then the TP reduction
    (all-reduce, or reduce-scatter into the sequence-parallel region); backward: embedding gradient (W)."""
    return _assemble(_embedding_pieces(model, dims(model, training, plan), "embedding"))


def output_ops(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> tuple[Op, ...]:
    """Final norm, logits GEMM (vocab-parallel; fp8 only where Fp8Spec.output_layer) and cross-entropy loss."""
    d = dims(model, training, plan)
    return _assemble(_output_pieces(model, training, d, "output"))


def mtp_ops(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, depth: int = 0) -> tuple[Op, ...]:
    """One multi-token-prediction depth (Megatron MultiTokenPredictionLayer, DeepSeek-V3 §2.2): embedding of the
    shifted tokens, enorm/hnorm, eh_proj 2h -> h (column-parallel, output gathered over TP), a decoder layer built
    like the last one, final norm, and the shared output layer with its loss."""
    d = dims(model, training, plan)
    pre = f"mtp{depth}"
    h, t = d.h, d.tokens
    gather = Piece("mtp", (coll(f"{pre}.eh_proj.ag", "F", "all_gather", t * h * d.act_bytes, "tp"),),
                   (coll(f"{pre}.eh_proj.rs", "I", "reduce_scatter", t * h * d.act_bytes, "tp"),)) if d.tp > 1 \
        else Piece("mtp", (), ())
    head = [*_embedding_pieces(model, d, f"{pre}.embedding"),
            norm(f"{pre}.enorm", d, d.tokens_sp, h, "mtp"), norm(f"{pre}.hnorm", d, d.tokens_sp, h, "mtp"),
            column_linear(f"{pre}.eh_proj", d, t, h // d.tp, 2 * h, dtype=d.act, tag="mtp"), gather]
    last = model.num_layers - 1
    layer = [_prefixed(p, pre) for p in _layer_pieces(model, d, last)]
    tail = _output_pieces(model, training, d, f"{pre}.output")
    pieces = [*head, *layer, *tail]
    fwd = [op for p in pieces for op in p.fwd]
    rec = _recomputed([op for p in layer for op in p.fwd], _recompute_mode(model, plan, last), model, plan,
                      _fp8_mm(training))
    return (*fwd, *rec, *(op for p in reversed(pieces) for op in p.bwd))


def stage_ops(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, slot: StageSlot) -> tuple[Op, ...]:
    """Every op of one virtual pipeline stage for one microbatch, in forward order per component: embedding, decoder
    layers, MTP depths, output layer and loss (backward ops stay inside each component's tuple)."""
    out: list[Op] = []
    if slot.embedding:
        out += embedding_ops(model, training, plan)
    for i in slot.layers:
        out += layer_ops(model, training, plan, i)
    for depth in range(slot.mtp_layers):
        out += mtp_ops(model, training, plan, depth)
    if slot.loss:
        out += output_ops(model, training, plan)
    return tuple(out)


def _layer_pieces(model: ModelSpec, d: Dims, layer_index: int) -> list[Piece]:
    # TorchTitan's float8 TP plan (Fp8Spec.tp_float8) gathers the attention's and a dense feed-forward's inputs and
    # output gradients in fp8; a MoE block keeps apply_moe_ep_tp's plain plan
    plan = replace(d, fp8_tp_gather=True, fp8_tp_gather_bwd=True) if d.fp8_tp_plan else d
    ffn = d if model.is_moe_layer(layer_index) else plan
    return [*attention_pieces(model, plan, layer_index), *ffn_pieces(model, ffn, layer_index)]


def _assemble(pieces: Sequence[Piece]) -> tuple[Op, ...]:
    return (*(op for p in pieces for op in p.fwd), *(op for p in reversed(pieces) for op in p.bwd))


def _prefixed(piece: Piece, prefix: str) -> Piece:
    return Piece(piece.tag, tuple(replace(o, name=f"{prefix}.{o.name}") for o in piece.fwd),
                 tuple(replace(o, name=f"{prefix}.{o.name}") for o in piece.bwd))


def _embedding_pieces(model: ModelSpec, d: Dims, name: str) -> list[Piece]:
    t, h, ab = d.tokens, d.h, d.act_bytes
    lookup = Piece("embedding", (mem(name, "F", t * 8 + t * h * ab, t * h * ab, d.act, "embedding"),),
                   (mem(f"{name}.wgrad", "W", t * 8 + t * h * ab, t * h * d.main_grad_bytes, d.act, "embedding"),))
    pieces = [lookup]
    if model.position_embedding == "learned":
        pieces.append(pointwise(f"{name}.position", d, 2 * t * h, t * h, "embedding"))
        if d.sp and d.tp > 1:
            # Megatron LanguageModelEmbedding: with a learned position table the word embeddings are all-reduced
            # (reduce_scatter_embeddings is off), the positions added to every token, then split over the sequence
            # (scatter_to_sequence_parallel_region, whose backward all-gathers the gradient)
            return [*pieces, Piece("embedding", (coll(f"{name}.ar", "F", "all_reduce", t * h * ab, "tp"),),
                                   (coll(f"{name}.ag", "I", "all_gather", t * h * ab, "tp"),))]
    return [*pieces, tp_exit(name, d, h, "embedding")]


def _output_pieces(model: ModelSpec, training: TrainingSpec, d: Dims, name: str) -> list[Piece]:
    """Megatron vocab_parallel_cross_entropy: fp32 upcast, max / exp / sum over the vocabulary shard and three small
    all-reduces over TP (max, target logit, sum of exp); the fused loss kernel reads the logits once. The ops carry
    the logits' dtype (the loss itself runs in fp32) and name the `cross_entropy` kernel over [tokens, vocab / tp]."""
    t, h, ab = d.tokens, d.h, d.act_bytes
    v = model.padded_vocab(d.tp) // d.tp
    e = t * v
    # (read, written) bytes of forward and backward
    (f_r, f_w), (b_r, b_w) = ((e * ab, 3 * t * 4), (e * ab, e * ab)) if training.fused_loss else \
        ((e * ab + 2 * e * 4, 2 * e * 4), (e * 4, e * ab))
    loss_f: tuple[Op, ...] = (mem(f"{name}.loss", "F", f_r, f_w, d.act, fn="cross_entropy", rows=t, width=v),)
    loss_b: tuple[Op, ...] = (mem(f"{name}.loss.bwd", "I", b_r, b_w, d.act, fn="cross_entropy", rows=t, width=v),)
    if d.torchtitan and not training.fused_loss and d.tp == 1:
        # TorchTitan's uncompiled cross_entropy(pred.float(), labels), aten call by call (ops_eager); under TP its
        # loss_parallel runs the vocabulary-parallel form priced above
        loss_f, loss_b = eager_cross_entropy(f"{name}.loss", d, t, v)
    reduce = (coll(f"{name}.loss.ar", "F", "all_reduce", t * 4, "tp", count=3),) if d.tp > 1 else ()
    # TorchTitan compiles the blocks only: its final norm runs eagerly either way (KernelSpec.rms_norm_kernel)
    final = replace(d, rms_composite=True) if training.kernels.eager_rms_norm else d
    return [norm(f"{name}.norm", final, d.tokens_sp, h, "layernorm"),
            column_linear(name, d, t, model.padded_vocab(d.tp) // d.tp, h, tag="output",
                          dtype="fp8" if training.fp8 is not None and training.fp8.converts("output") else d.act),
            Piece("loss", (*loss_f, *reduce), loss_b)]


def _fp8_mm(training: TrainingSpec) -> bool:
    """Whether fp8 GEMMs reach TorchTitan's per-op policy as aten.mm (Fp8Spec.mm_dispatched)."""
    return training.fp8 is None or training.fp8.mm_dispatched


def _recompute_mode(model: ModelSpec, plan: ParallelPlan, layer_index: int) -> str | frozenset[str]:
    """'none', 'full', 'op', or the set of op tags recomputed in decoder layer `layer_index`."""
    r = plan.recompute
    if r.granularity == "none":
        return "none"
    if r.granularity == "full":
        if r.layer_ids is not None:
            return "full" if layer_index in r.layer_ids else "none"
        if r.method == "block":
            slot = next(s for s in split_stages(model, plan) if layer_index in s.layers)
            return "full" if slot.layers.index(layer_index) < (r.num_layers or 0) else "none"
        return "full"
    tags: set[str] = set()
    for module in r.modules:
        if module == "op":
            return "op"
        if module.startswith("layer:"):
            if r.every_nth_checkpoints(layer_index):
                return "full"
            continue
        tags |= _MODULE_TAGS.get(module, set())
    return frozenset(tags) if tags else "none"


def _recomputed(fwd: Sequence[Op], mode: str | frozenset[str], model: ModelSpec, plan: ParallelPlan,
                fp8_mm: bool = True) -> tuple[Op, ...]:
    if mode == "none":
        return ()
    if mode == "op":
        return tuple(op_sac_recompute(fwd, model, plan, fp8_mm))
    chosen = list(fwd) if mode == "full" else [o for o in fwd if o.tag in mode]
    return tuple(replace(o, recompute=True) for o in chosen)
