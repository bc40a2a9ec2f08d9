"""Activation bytes saved for backward, per microbatch, as an inventory of named tensors per layer.

The inventory follows what Megatron-core with Transformer Engine saves (Korthikanti et al. 2022 §4 give the
16-bit GPT breakdown 34·s·b·h + 5·a·s²·b per layer with unfused attention and dropout; that case is reproduced
exactly by this module, see tests): every norm saves its input, every linear its input (fp8 copies with FP8), the
activation function its input, flash attention q, k, v, its output and the fp32 log-sum-exp, unfused attention the
s x s softmax (plus dropout mask and output), dropout a 1-byte mask; per-head Q/K norms (Megatron q_layernorm /
k_layernorm, TorchTitan q_norm / k_norm) save their inputs, the projected q and k. Tensors along the hidden dimension
that are replicated across TP are divided by TP only with sequence parallelism (Korthikanti §4.2.2).

TorchTitan's eager modules (`KernelSpec.transformer_impl == "torchtitan"`, pytorch/torchtitan models/llama3 and
moe): `repeat_kv` copies K and V to every query head before SDPA, which saves the copies (unless a rank holds one
KV head: then the repeat is a stride-0 view of it); the SwiGLU is
`w2(F.silu(w1(x)) * w3(x))`, whose multiply also saves the SiLU output. Its per-op selective checkpointing ('op',
torchtitan/distributed/activation_checkpoint.py) keeps a different set altogether: `op_sac_tensors`. Compiled
(KernelSpec.compiled) a dense block saves the same tensors but the SiLU output, which the partitioner recomputes;
with Primus-Turbo's attention (KernelSpec.gqa_native_attention) K and V are saved with their own heads.

Symbols: b micro batch, s local sequence (seq / cp), T = b·s tokens, h hidden, t tp, r = 1/t with SP else 1,
e activation bytes (2 for bf16/fp16), a heads, g KV heads, d head dim, f FFN, E experts, k top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec
from projection.workload.params import Sharding, layer_params


@dataclass(frozen=True)
class Dims:
    """Per-rank sizes for one microbatch."""

    b: int
    s: int  # local sequence length (after CP)
    seq: int  # full sequence length (keys seen by each query)
    T: int  # tokens on the rank before SP sharding
    h: int
    t: int
    r: float  # 1/t with sequence parallelism, else 1
    e: int  # bytes per activation element
    e_lin: int  # bytes of a saved linear input (1 with FP8 GEMMs that save fp8 inputs)
    e_blk: int  # ... of the attention and dense-MLP linears (also 1 under TorchTitan's float8 TP plan, tp > 1)
    r_lin: float  # share of the sequence a column-parallel linear's saved input holds (r, or 1 with dtensor TP)
    e_exp: int  # bytes of a saved routed-expert GEMM input (e_lin where the experts are FP8 GEMMs, else e)
    dropout: bool  # hidden dropout: residual and embedding masks
    unfused: bool
    attn_dropout: bool = False  # dropout of the attention probabilities (saved only without flash attention)
    eager: bool = False  # TorchTitan's eager modules (module docstring)
    compiled: bool = False  # ... compiled (KernelSpec.compiled): the SiLU output is recomputed, not saved
    repeat_kv: bool = True  # ... whose attention needs K and V copied to every query head (KernelSpec)
    local_attn: bool = False  # Megatron-Core's own DotProductAttention (local spec), which repeats K and V
    # bytes a norm saves per element: its input, or with PyTorch's composite RMSNorm run eagerly (KernelSpec
    # .rms_norm_kernel) the fp32 input and fp32 normalised value, 8 B (tests/oracle/test_memory_torchtitan_layers.py);
    # TorchTitan compiles the blocks only, so its final norm stays eager under compile (e_final_norm)
    e_norm: int = 2
    e_final_norm: int = 2


def dims(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> Dims:
    f8 = training.fp8
    # TorchTitan v0.2.2 gathers TP inputs in bf16 under torchao too: its models pick Float8ColwiseParallel only for
    # the legacy converter name "float8" (`"float8" in job_config.model.converters`), which v0.2.2 no longer registers;
    # where they do (Fp8Spec.tp_float8, tp > 1) the inputs are cast before the gather and saved in fp8
    dtensor = plan.tp_style == "dtensor" and plan.sp_
    s = training.seq_length // plan.cp
    b = training.micro_batch_size
    e = 4 if training.params_dtype == "fp32" else 2
    e_lin = 1 if f8 is not None and f8.saves_fp8_inputs else e
    # the float8 TP plan covers attention and dense feed-forward blocks only (not MoE blocks, not the output layer)
    e_blk = 1 if f8 is not None and (f8.saves_fp8_inputs or (f8.tp_float8 and plan.tp > 1)) else e
    k = training.kernels
    composite = k.eager_rms_norm and model.norm == "rmsnorm"
    return Dims(b=b, s=s, seq=training.seq_length, T=b * s, h=model.hidden_size, t=plan.tp,
                r=1 / plan.tp if plan.sp_ else 1.0, e=e,
                e_lin=e_lin, e_blk=e_blk, e_exp=e_lin if f8 is not None and f8.experts_in_fp8 else e,
                # TorchTitan's TP saves the gathered, full-sequence input of its column-parallel linears
                r_lin=1.0 if dtensor else 1 / plan.tp if plan.sp_ else 1.0,
                dropout=training.dropout > 0, unfused=training.attention_backend == "unfused",
                attn_dropout=training.attention_dropout_ > 0,
                eager=training.kernels.transformer_impl == "torchtitan", compiled=training.kernels.compiled,
                repeat_kv=not training.kernels.gqa_native_attention,
                local_attn=training.kernels.transformer_impl == "local",
                e_norm=8 if composite and not k.compiled else e, e_final_norm=8 if composite else e)


def attention_tensors(model: ModelSpec, D: Dims) -> dict[str, float]:
    """Saved tensors of the attention block (input norm .. output dropout)."""
    T, h, t, r, e = D.T, D.h, D.t, D.r, D.e
    out: dict[str, float] = {"attn.norm_in": D.e_norm * T * h * r, "attn.linear_in": D.e_blk * T * h * D.r_lin}
    heads = model.num_attention_heads // t
    if model.mla is not None:
        m = model.mla
        # the latents' norm inputs and the up projections' inputs (the normed latents): under Megatron's sequence
        # parallelism the down projections run on the rank's sequence shard and the column-parallel up projections
        # save their sharded input, gathering it again in backward (MLASelfAttention: q_compressed and
        # kv_compressed are [s/TP, b, .]); TorchTitan's DTensor plan and no SP keep every token (D.r_lin). The rope
        # key part is gathered over TP before its rotation (full sequence).
        rows = T * D.r_lin
        if m.q_lora_rank:
            out["attn.q_latent"] = e * rows * m.q_lora_rank + D.e_lin * rows * m.q_lora_rank
        out["attn.kv_latent"] = e * rows * m.kv_lora_rank + e * T * m.qk_rope_head_dim + D.e_lin * rows * m.kv_lora_rank
        q_w, k_w, v_w = heads * (m.qk_head_dim + m.qk_rope_head_dim), heads * (m.qk_head_dim + m.qk_rope_head_dim), \
            heads * m.v_head_dim
    else:
        d = model.head_dim_
        kv = max(1, model.kv_heads // t)
        q_w, k_w, v_w = heads * d, kv * d, kv * d
        if model.qk_norm:
            out["attn.qk_norm_in"] = D.e_norm * T * (q_w + k_w)  # the Q and K norms' inputs: the projected q, k
        if D.eager and kv > 1 and D.repeat_kv:
            # repeat_kv: SDPA saves K and V copied to every local query head. With one local KV head its
            # expand + reshape merges a size-1 dim into the stride-0 one: a view of that head, nothing copied
            # (tests/oracle/test_memory_torchtitan_tp.py measures both at tp 2)
            k_w = v_w = heads * d
        elif D.local_attn and kv < heads:
            # Megatron-Core's DotProductAttention: key/value.repeat_interleave(np / ng, dim=2) copies K and V to
            # every local query head, and baddbmm / bmm save the copies (the query is a copy too, the fused qkv
            # output, all-gathered when num_query_groups < tp, is freed): measured at tp 1, 2 and 4 in
            # tests/oracle/test_memory_megatron_core_layers.py
            k_w = v_w = heads * d
    out["attn.qkv"] = e * T * (q_w + k_w + v_w)
    v_total = heads * (model.mla.v_head_dim if model.mla else model.head_dim_)
    # Attention output: saved by flash attention (16-bit) and, being the same tensor, by the output projection;
    # with FP8 the projection keeps its own fp8 copy as well.
    out["attn.core_out"] = e * T * v_total + (T * v_total if D.e_blk == 1 else 0)
    if D.unfused:
        probs = D.b * heads * D.s * D.seq
        out["attn.softmax"] = e * probs
        if D.attn_dropout:
            # Two tensors, kept as two entries: the 1-byte mask (native_dropout's bool mask) and the dropped
            # probabilities (input of the V matmul). Only the latter gets a gradient in backward, of e bytes per
            # element (native_dropout_backward returns the gradient's dtype), so the backward working set, sized
            # from the largest single entry, must not see them as one (1 + e)-byte tensor.
            out["attn.dropout_mask"] = 1 * probs
            out["attn.dropout"] = e * probs
    else:
        out["attn.lse"] = 4 * D.b * heads * D.s  # fp32 log-sum-exp per query row
    if D.dropout:
        out["attn.out_dropout_mask"] = 1 * T * h * r
    return out


def mlp_tensors(model: ModelSpec, D: Dims, ffn: int, prefix: str = "mlp", tokens: float | None = None,
                shard: int | None = None, with_norm: bool = True) -> dict[str, float]:
    """A (gated) MLP: norm input, fc1 input, activation input (fc1 output) and fc2 input."""
    T = D.T if tokens is None else tokens
    shard = D.t if shard is None else shard
    out: dict[str, float] = {}
    if with_norm:
        out[f"{prefix}.norm_in"] = D.e_norm * D.T * D.h * D.r
        out[f"{prefix}.linear_in"] = (D.e_blk if prefix == "mlp" else D.e_lin) * D.T * D.h * D.r_lin
    branches = 2 if model.gated_mlp else 1
    out[f"{prefix}.act_in"] = D.e * T * branches * ffn / shard
    # silu(w1 x), saved by the multiply with w3 x in eager mode; a compiled dense block recomputes it in backward
    # (tests/oracle/test_memory_torchtitan_compile.py; a compiled MoE block saved other tensors of about the same
    # total there, so MoE experts keep the eager inventory)
    if D.eager and model.gated_mlp and not (D.compiled and prefix == "mlp"):
        out[f"{prefix}.act_out"] = D.e * T * ffn / shard
    out[f"{prefix}.fc2_in"] = (D.e_exp if prefix == "moe.experts" else D.e_blk if prefix == "mlp" else D.e_lin) \
        * T * ffn / shard
    if with_norm and D.dropout:
        out[f"{prefix}.dropout_mask"] = 1 * D.T * D.h * D.r
    return out


def moe_tensors(model: ModelSpec, plan: ParallelPlan, D: Dims) -> dict[str, float]:
    """MoE block (Megatron alltoall dispatcher, grouped GEMM), balanced routing.

    Each rank's experts receive N = T·k·etp/t token copies (T·k routed copies per TP group of tokens, spread over ep
    ranks holding E/ep experts, each replicated over the etp ranks of its expert-TP group)."""
    moe = model.moe
    assert moe is not None
    out: dict[str, float] = {"moe.norm_in": D.e_norm * D.T * D.h * D.r, "moe.linear_in": D.e_lin * D.T * D.h * D.r_lin,
                             # fp32 scores; TorchTitan's router (NoParallel) scores the gathered sequence
                             "moe.router_probs": 4 * D.T * D.r_lin * moe.num_experts}
    n = moe.routed_copies(D.T / D.t) * plan.etp_  # k T/t dropless; capped or padded by the capacity factor
    out["moe.dispatched"] = D.e_exp * n * D.h  # grouped-GEMM fc1 input (permuted token copies)
    out.update(mlp_tensors(model, D, moe.expert_ffn_hidden_size, "moe.experts", tokens=n, shard=plan.etp_,
                           with_norm=False))
    if D.eager:
        # TorchTitan scores after the experts: unpermute's multiply keeps the expert output for the gradient of the
        # routing probabilities (tests/oracle/test_memory_torchtitan_layers.py, _ep.py)
        out["moe.expert_out"] = D.e * n * D.h
    elif not _fused_expert_activation(model):
        # Megatron-Core (0.13 on) weights the routed copies inside the experts, act(fc1 x) * probs, so unpermute keeps
        # only indices; without a fused weighted kernel (SwiGLU, or GeLU with a bias) the multiply keeps the
        # activation's output (tests/oracle/test_memory_megatron_core_layers.py measures both)
        out["moe.experts.act_out"] = D.e * n * moe.expert_ffn_hidden_size / plan.etp_
    if moe.shared_expert_ffn_hidden_size:
        out.update(mlp_tensors(model, D, moe.shared_expert_ffn_hidden_size, "moe.shared", with_norm=False))
    if D.dropout:
        out["moe.dropout_mask"] = 1 * D.T * D.h * D.r
    return out


def _fused_expert_activation(model: ModelSpec) -> bool:
    """Whether Megatron-Core runs the routed experts' activation and probability weighting as one fused kernel
    (which keeps its input and the probabilities only): weighted_bias_swiglu for SwiGLU, bias_gelu for GeLU, which
    Megatron fuses only with a bias (validate_args turns bias_gelu_fusion off without one). Megatron's
    --no-bias-swiglu-fusion / --no-bias-gelu-fusion are not read: their default (fused) is assumed."""
    if model.gated_mlp:
        return model.activation == "silu"
    return model.activation == "gelu" and model.add_bias_linear


# Megatron --recompute-modules: which saved tensors each module's checkpoint drops (its input is kept).
_SELECTIVE_DROPS: dict[str, tuple[str, ...]] = {
    "core_attn": ("attn.softmax", "attn.dropout_mask", "attn.dropout", "attn.lse"),
    "mlp": ("mlp.act_in", "mlp.act_out", "mlp.fc2_in"),
    "moe": ("moe.dispatched", "moe.experts.act_in", "moe.experts.act_out", "moe.experts.fc2_in", "moe.expert_out",
            "moe.router_probs", "moe.shared.act_in", "moe.shared.act_out", "moe.shared.fc2_in"),
    "moe_act": ("moe.experts.act_out", "moe.experts.fc2_in"),
    "shared_experts": ("moe.shared.act_in", "moe.shared.act_out", "moe.shared.fc2_in"),
    "layernorm": ("attn.linear_in", "mlp.linear_in", "moe.linear_in"),
    "mla_up_proj": ("attn.qkv",),
}


def _mm_outputs(model: ModelSpec, training: TrainingSpec, D: Dims, i: int) -> list[tuple[str, float]]:
    """The `aten.mm` calls of TorchTitan decoder layer i in forward order, with their per-rank output bytes.

    Order: pytorch/torchtitan models (llama3 Attention: wq, wk, wv, then wo; deepseek_v3 MLA: wq or wq_a, wq_b, then
    wkv_a, wkv_b, wo; FeedForward: w1, w3, w2, as `w2(F.silu(w1(x)) * w3(x))` evaluates; MoE: the router gate,
    which the default `per_op_sac_force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]` recomputes without
    counting it, the routed experts, which are `torch._grouped_mm` (not mm), then the shared experts). Column-
    parallel outputs hold the full local sequence and a TP shard of the width; row-parallel ones (wo, w2) the full
    sequence and the full hidden width (partial sums before the reduce-scatter). A torchao float8 linear is one of
    them: it multiplies Float8Tensors with `torch.mm`, which the policy's dispatch mode sees as `aten.mm` (the
    subclass turns it into `_scaled_mm` below the mode), and its output is in the activation dtype
    (tests/oracle/test_memory_torchtitan_float8_sac.py); Primus-Turbo's fp8 linears call their own op, which the
    policy neither counts nor saves (Fp8Spec.mm_dispatched)."""
    T, t, h, e = D.T, D.t, D.h, D.e
    f8 = training.fp8
    heads = model.num_attention_heads // t

    def mm(component: str, name: str, width: float) -> list[tuple[str, float]]:
        hidden = f8 is not None and f8.converts(component) and not f8.mm_dispatched  # Primus-Turbo's own op
        return [] if hidden else [(name, e * T * width)]

    out: list[tuple[str, float]] = []
    if model.mla is not None:
        m = model.mla
        qk = m.qk_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            out += mm("attention", "wq_a", m.q_lora_rank) + mm("attention", "wq_b", heads * qk)
        else:
            out += mm("attention", "wq", heads * qk)
        out += mm("attention", "wkv_a", m.kv_lora_rank + m.qk_rope_head_dim)
        out += mm("attention", "wkv_b", heads * (m.qk_head_dim + m.v_head_dim))
    else:
        d, kv = model.head_dim_, max(1, model.kv_heads // t)
        out += mm("attention", "wq", heads * d) + mm("attention", "wk", kv * d) + mm("attention", "wv", kv * d)
    out += mm("attention", "wo", h)
    moe = model.moe if model.is_moe_layer(i) else None
    ffn = model.ffn_hidden_size if moe is None else moe.shared_expert_ffn_hidden_size
    if ffn:
        comp = "dense_mlp" if moe is None else "shared_experts"
        out += mm(comp, "w1", ffn / t) + mm(comp, "w3", ffn / t) + mm(comp, "w2", h)
    return out


def op_sac_tensors(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, i: int) -> dict[str, float]:
    """What decoder layer i keeps per microbatch under TorchTitan's per-op selective checkpointing ('op'):
    `create_selective_checkpoint_contexts` caches the outputs of the ops its policy marks MUST_SAVE and the
    checkpoint keeps the block's input; everything else is recomputed. The policy
    (torchtitan/distributed/activation_checkpoint.py, save list in each model's parallelize.py) saves SDPA's outputs
    (output and log-sum-exp), reduce_scatter outputs, all_to_all_single outputs (MoE models) and every aten.mm
    output except every second one counted in the block (`_mm_outputs`)."""
    D = dims(model, training, plan)
    out = {"sac.layer_input": D.e * D.T * D.h * D.r}
    # compiled, the partitioner keeps only what backward reads: the output projections' outputs (wo, w2) feed the
    # residual add alone, so a compiled dense block drops them (tests/oracle/test_memory_torchtitan_compile.py)
    unread = ("wo", "w2") if D.compiled and not model.is_moe_layer(i) else ()
    for n, (name, nbytes) in enumerate(_mm_outputs(model, training, D, i)):
        if n % 2 == 0 and name not in unread:  # the 1st, 3rd, ... mm (the policy skips those whose count is even)
            out[f"sac.{name}_out"] = nbytes
    att = attention_tensors(model, D)
    out["sac.sdpa_out"] = D.e * D.T * (model.num_attention_heads // D.t) * (
        model.mla.v_head_dim if model.mla else model.head_dim_)
    if "attn.lse" in att:
        out["sac.sdpa_lse"] = att["attn.lse"]
    if plan.tp > 1 and plan.sp_:
        # row-parallel outputs reduce-scattered to the sequence shard: wo and w2, or wo and the MoE block's output
        out["sac.reduce_scatter_out"] = 2 * D.e * D.T * D.h / D.t
    moe = model.moe
    if moe is not None and model.is_moe_layer(i) and plan.ep > 1:
        # token dispatch and combine all_to_all_single outputs: the routed copies this rank receives and returns
        out["sac.all_to_all_out"] = 2 * D.e * moe.routed_copies(D.T / D.t) * plan.etp_ * D.h
    return out


def selective_saved(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, i: int,
                    tensors: dict[str, float]) -> dict[str, float]:
    """Layer i's saved tensors under selective recompute, from its full inventory `tensors` (layer_tensors): the
    whole layer's input for a checkpointed 'layer:N' layer, TorchTitan's per-op set for 'op', else the inventory
    without what each Megatron --recompute-modules entry drops."""
    kept = dict(tensors)
    for mod in plan.recompute.modules or ("core_attn",):
        if mod == "op":
            return op_sac_tensors(model, training, plan, i)
        if mod.startswith("layer:"):
            if plan.recompute.every_nth_checkpoints(i):
                return {"layer.input": layer_input_bytes(model, training, plan)}
            continue
        for name in _SELECTIVE_DROPS.get(mod, ()):
            kept.pop(name, None)
    return kept


def layer_tensors(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, i: int) -> dict[str, float]:
    """All tensors decoder layer i saves for one microbatch with no recompute (a layer kept in bf16 under fp8 saves
    its linears' inputs in high precision: TrainingSpec.for_layer)."""
    training = training.for_layer(i, model.num_layers)
    D = dims(model, training, plan)
    out = attention_tensors(model, D)
    if model.is_moe_layer(i):
        out.update(moe_tensors(model, plan, D))
    else:
        out.update(mlp_tensors(model, D, model.ffn_hidden_size))
    f8 = training.fp8
    if f8 is not None and f8.saves_fp8_weights:
        # Primus-Turbo saves each forward's fp8 weight (1 B per converted GEMM weight after TP/EP sharding, whole:
        # FSDP gathers it for the GEMM) with the fp8 input, until that microbatch's backward
        parts = layer_params(model, i, Sharding(plan.tp, plan.ep, plan.etp_))
        out["fp8.weights"] = float(sum(v for k, v in parts.items() if f8.converts(k)))
    return out


def layer_input_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> float:
    """The checkpointed input of a fully recomputed layer (sequence-sharded with SP, or with
    --distribute-saved-activations across TP)."""
    D = dims(model, training, plan)
    shard = D.r if (plan.sp_ or not plan.recompute.distribute_saved_activations) else 1 / D.t
    return D.e * D.T * D.h * shard


def recomputed_layers(plan: ParallelPlan, stage_layers: tuple[int, ...]) -> set[int]:
    """Global ids of the layers of one virtual stage that full recompute checkpoints."""
    r = plan.recompute
    if r.granularity != "full":
        return set()
    if r.layer_ids is not None:
        return set(r.layer_ids) & set(stage_layers)
    if r.method == "block":
        return set(stage_layers[: r.num_layers or 0])
    return set(stage_layers)  # uniform: every layer, checkpointed in chunks of num_layers


def saved_layer_bytes(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, i: int,
                      full_recompute: bool, chunk_head: bool = True) -> float:
    """Bytes layer i keeps per in-flight microbatch after recompute choices. In a uniform chunk of several layers
    only the chunk's first layer keeps its input."""
    if full_recompute:
        return layer_input_bytes(model, training, plan) if chunk_head else 0.0
    tensors = layer_tensors(model, training, plan, i)
    if plan.recompute.granularity == "selective":
        tensors = selective_saved(model, training, plan, i, tensors)
    return sum(tensors.values())


def loss_tensors(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> dict[str, float]:
    """Last stage: final norm input, output-layer input, and the cross-entropy state: fp32 softmax of the
    vocab-parallel logits (Megatron vocab_parallel_cross_entropy upcasts and saves exp(logits)); a fused loss keeps
    the 16-bit logits gradient instead."""
    D = dims(model, training, plan)
    v = model.padded_vocab(plan.tp) / D.t
    ce = (D.e if training.fused_loss else 4) * D.T * v
    # The output layer is an FP8 GEMM only where Fp8Spec.output_layer says so (Megatron builds it as a plain
    # ColumnParallelLinear; TorchTitan converts it unless filter_fqns names it); otherwise its input is saved in the
    # activation dtype.
    f8 = training.fp8
    e_out = D.e_lin if f8 is not None and f8.converts("output") else D.e
    return {"loss.norm_in": D.e_final_norm * D.T * D.h * D.r, "loss.linear_in": e_out * D.T * D.h * D.r_lin,
            "loss.softmax": ce}


def loss_working_set(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> float:
    """Transient bytes while the loss runs on the last stage: the 16-bit logits and the fp32 copy (or, in backward,
    the fp32 gradient and its 16-bit cast) live at once besides the saved softmax. TorchTitan's uncompiled
    `cross_entropy(pred.float(), labels)` (the step deletes pred before backward) holds more in backward:
    nll_loss_backward's zero-filled fp32 gradient and log_softmax's backward output, both fp32 logits, beside the saved
    log-softmax (derivatives.yaml `_log_softmax_backward_data(grad, result)`; PyTorch's memory tracker measures 3 fp32
    logits at the peak, tests/oracle/test_memory_torchtitan_loss.py)."""
    D = dims(model, training, plan)
    v = model.padded_vocab(plan.tp) / D.t
    if training.kernels.transformer_impl == "torchtitan" and not training.fused_loss:
        # under TP, TorchTitan's loss_parallel (DTensor's vocabulary-parallel log_softmax and nll_loss) peaks at 4
        # fp32 logits of the rank's shard (measured on 2 gloo ranks, tests/oracle/test_memory_torchtitan_loss.py)
        return (8 if plan.tp == 1 else 12) * D.T * v
    return (D.e + (0 if training.fused_loss else 4)) * D.T * v


def embedding_tensors(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan) -> dict[str, float]:
    """First stage: token ids (int64) and the embedding dropout mask."""
    D = dims(model, training, plan)
    out = {"embedding.ids": 8.0 * D.T}
    if D.dropout:
        out["embedding.dropout_mask"] = 1 * D.T * D.h * D.r
    return out
