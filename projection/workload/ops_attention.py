"""Self-attention ops on one rank: MHA/GQA/MQA and MLA projections as TP-sharded GEMMs, the core attention (flash
or unfused), and context-parallel ring exchange.

Core-attention FLOPs. Full (non-causal) forward: QK^T and PV, 2*b*h*sq*skv*(d_qk + d_v) (= 4*b*h*s^2*d for
d_qk = d_v; Narayanan et al. 2021 appendix counts 4*b*s^2*h per layer forward). Decoder LMs are causal and flash
kernels skip the masked blocks, so the `attention` op carries half of that; the backward op (phase I) carries twice
the forward (dQ, dK, dV and dP: four GEMMs of the forward's size), as PyTorch's FlopCounterMode counts it. Flash
backward also recomputes QK^T (Dao 2023, FlashAttention-2 §3.1.2: 5 GEMMs against 2 in the forward): that extra
0.5x of the forward is hardware work, left to the cost model (see projection/cost/roofline.py). Megatron's
model-FLOPs formula counts attention non-causally (validation-public.md §0.2); `model_flops.py` follows it there.
The unfused backend computes the full s x s scores: two batched GEMMs per direction and no causal halving.

Context parallelism (Megatron/TE ring attention with load-balanced causal chunks, Liu et al. 2023): a rank holds
s/cp queries and attends to all s keys over cp steps, so its core op is (sq = s/cp, skv = s, causal) and equals 1/cp
of the causal total; the cp - 1 ring steps each pass a K/V chunk (forward) and K/V plus dK/dV (backward). The
all-gather and all-to-all (Ulysses) exchanges are in `_cp_pieces`.
"""

from __future__ import annotations

from projection.specs.model import ModelSpec, keys_per_query
from projection.workload.ops_base import (
    Dims,
    GroupAxis,
    Op,
    Phase,
    Piece,
    coll,
    column_linear,
    gemm,
    join,
    linear,
    mem,
    pointwise,
    residual,
    row_linear,
    tp_enter,
)
from projection.workload.ops_eager import input_grad_adds, megatron_mla_joins, norm, rope


def core_attention(d: Dims, heads: int, kv_heads: int, d_qk: int, d_v: int, name: str = "attn.core",
                   window: int | None = None) -> Piece:
    """The attention kernel(s) for one microbatch: q [b, heads, s/cp, d_qk], k/v [b, kv_heads, s, d]. A flash
    kernel with a sliding `window` skips the blocks outside the band, so its FLOPs follow the band's keys per query
    (specs.model.keys_per_query); the unfused path computes the whole matrix."""
    b, sq, skv, ab = d.b, d.tokens // d.b, d.s, d.act_bytes
    if not d.flash:
        return _unfused(d, heads, kv_heads, d_qk, d_v, name)
    exchange = _cp_pieces(d, heads, kv_heads, d_qk, d_v)
    if d.cp_exchange == "a2a":
        # Ulysses: after the all-to-all a rank holds heads/cp heads of the whole sequence (the same FLOPs as 1/cp
        # of the queries against every key)
        sq, heads, kv_heads = skv, max(1, heads // d.cp), max(1, kv_heads // d.cp)
    elif d.cp_exchange == "a2a+p2p":
        # after the all-to-all over cp_a2a ranks: heads / cp_a2a heads of cp_a2a times the local queries, whose
        # keys then come round the ring (TE cp_per_step_configs: heads / a, lengths max_seqlen / b)
        sq, heads, kv_heads = sq * d.cp_a2a, heads // d.cp_a2a, max(1, kv_heads // d.cp_a2a)
    # fwd: QK^T and PV over the attended keys, 2 FLOP per multiply-accumulate; bwd twice that (dQ, dK, dV, dP)
    full = 4.0 * b * heads * sq * keys_per_query(skv, window, causal=True) * (d_qk + d_v)
    q, o = b * heads * sq * d_qk * ab, b * heads * sq * d_v * ab
    kv = b * kv_heads * skv * (d_qk + d_v) * ab
    lse = b * heads * sq * 4
    def op(name_: str, phase: Phase, flop: float, read: float, written: float) -> Op:
        return Op(name_, "attention", phase, dtype=d.act, flop=flop, bytes_read=read, bytes_written=written, m=sq,
                  n=skv, k=d_qk, batch=b, heads=heads, kv_heads=kv_heads, head_dim_v=d_v, causal=True,
                  window=window or 0, tag="core_attn")

    fwd = op(name, "F", full / 2, q + kv, o + lse)
    bwd = op(f"{name}.bwd", "I", full, q + kv + 2 * o + lse, q + kv)
    return join("core_attn", exchange[0], Piece("core_attn", (fwd,), (bwd,)), exchange[1])


def _unfused(d: Dims, heads: int, kv_heads: int, d_qk: int, d_v: int, name: str) -> Piece:
    """Scores = Q K^T (batched over b*heads), softmax (+ dropout) kept in memory, out = P V; backward dQ, dK, dP, dV.

    Softmax (Megatron's FusedScaleMaskSoftmax: scale, mask and softmax in one kernel) reads the scores and writes the
    probabilities; attention dropout is a separate kernel (Megatron's `attention_dropout`, torch native_dropout):
    reads the probabilities, writes the dropped ones and a 1-byte mask. Backward: dropout reads the gradient and the
    mask and writes a gradient; softmax reads the gradient and the probabilities and writes the score gradient."""
    bh, sq, skv, ab, dt = d.b * heads, d.tokens // d.b, d.s, d.act_bytes, d.act
    scores = bh * sq * skv
    softmax_f = mem(f"{name}.softmax", "F", scores * ab, scores * ab, dt, fn="softmax", rows=bh * sq, width=skv)
    softmax_b = mem(f"{name}.softmax.bwd", "I", 2 * scores * ab, scores * ab, dt, fn="softmax", rows=bh * sq,
                    width=skv)
    dropout_f = (mem(f"{name}.dropout", "F", scores * ab, scores * (ab + 1), dt),) if d.attn_dropout else ()
    dropout_b = (mem(f"{name}.dropout.bwd", "I", scores * (ab + 1), scores * ab, dt),) if d.attn_dropout else ()
    # BLAS shapes of the row-major products: S = Q K^T, O = P V; dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q
    fwd = (gemm(f"{name}.qk", "F", skv, sq, d_qk, dt, ab, layout="TN", batch=bh), softmax_f, *dropout_f,
           gemm(f"{name}.pv", "F", d_v, sq, skv, dt, ab, layout="NN", batch=bh))
    bwd = (gemm(f"{name}.pv.dgrad_p", "I", skv, sq, d_v, dt, ab, layout="TN", batch=bh),
           gemm(f"{name}.pv.dgrad_v", "I", d_v, skv, sq, dt, ab, layout="NT", batch=bh), *dropout_b, softmax_b,
           gemm(f"{name}.qk.dgrad_q", "I", d_qk, sq, skv, dt, ab, layout="NN", batch=bh),
           gemm(f"{name}.qk.dgrad_k", "I", d_qk, skv, sq, dt, ab, layout="NT", batch=bh))
    exchange = _cp_pieces(d, heads, kv_heads, d_qk, d_v)
    return join("core_attn", exchange[0], Piece("core_attn", fwd, bwd), exchange[1])


def _cp_pieces(d: Dims, heads: int, kv_heads: int, d_qk: int, d_v: int) -> tuple[Piece, Piece]:
    """The context-parallel exchange around the core attention, as (before, after) pieces (join runs the backward
    of `after` first). Collective sizes follow ops_base's convention (an all-gather's output, a reduce-scatter's
    input, an all-to-all's send buffer). The ring's steps overlap a chunk of attention each, torch's all-gather the
    local chunk's (perf/items.py, ".overlap"); the rest is exposed.
    - p2p (Megatron/TE ring, torch's alltoall rotater): cp - 1 steps of this rank's K/V forward, K/V and dK/dV
      backward;
    - all_gather (Transformer Engine AttnFuncWithCPAndKVAllGather, "KV all-gather between CP ranks is exposed"):
      K/V gathered before the forward and again before the backward, dK/dV reduce-scattered after it;
    - p2p_torch and all_gather_torch (torch.distributed.tensor.experimental context parallel,
      _templated_ring_attention[_backward]): K/V pass round the ring (_AllToAllRotater, cp - 1 steps) or are
      all-gathered once (_AllGatherRotater), waited for after the local chunk, in the forward and again in the
      backward; the backward's dK/dV always pass round the ring in fp32 (_ContextParallelOptions.convert_to_f32), cp
      sends of which the last is waited for after the loop, with no attention left to hide it (".exposed");
    - a2a (TE AttnFuncWithCPAndQKVOA2A, Ulysses): Q, K, V all-to-all before, the output after; backward the output
      gradient before, dQ, dK, dV after;
    - a2a+p2p (TE AttnFuncWithCPAndKVP2P with cp_group = [a2a group, p2p group], Megatron's
      --hierarchical-context-parallel-sizes A B): the a2a's all-to-alls over groups of A consecutive cp ranks
      (`cp_a2a`, exposed: TE waits for them before the attention), between them the ring over the B ranks of stride
      A (`cp_ring`): B - 1 steps of the K/V a rank holds after the all-to-all, as many elements as its own K/V
      (heads / A of A x the local sequence), forward, and K/V with dK/dV backward, each behind a chunk of
      attention."""
    none = Piece("core_attn", (), ())
    if d.cp == 1:
        return none, none
    ab, cp = d.act_bytes, d.cp
    chunk = d.tokens * kv_heads * (d_qk + d_v) * ab  # this rank's K and V: b * s/cp rows
    if d.cp_exchange == "all_gather":
        return (Piece("core_attn", (coll("attn.cp_ag", "F", "all_gather", cp * chunk, "cp"),),
                      (coll("attn.cp_rs.bwd", "I", "reduce_scatter", cp * chunk, "cp"),)),
                Piece("core_attn", (), (coll("attn.cp_ag.bwd", "I", "all_gather", cp * chunk, "cp"),)))
    if d.cp_exchange in ("all_gather_torch", "p2p_torch"):
        dkv = chunk * 4 // ab
        dkv_ring = (coll("attn.cp_ring.dkv", "I", "send_recv", dkv, "cp", count=cp - 1),
                    coll("attn.cp_ring.dkv.exposed", "I", "send_recv", dkv, "cp"))
        if d.cp_exchange == "p2p_torch":
            return (Piece("core_attn", (coll("attn.cp_ring", "F", "send_recv", chunk, "cp", count=cp - 1),),
                          (coll("attn.cp_ring.bwd", "I", "send_recv", chunk, "cp", count=cp - 1), *dkv_ring)), none)
        return (Piece("core_attn", (coll("attn.cp_ag.overlap", "F", "all_gather", cp * chunk, "cp"),), dkv_ring),
                Piece("core_attn", (), (coll("attn.cp_ag.bwd.overlap", "I", "all_gather", cp * chunk, "cp"),)))
    if d.cp_exchange in ("a2a", "a2a+p2p"):
        group: GroupAxis = "cp" if d.cp_exchange == "a2a" else "cp_a2a"
        qkv = d.tokens * (heads * d_qk + kv_heads * (d_qk + d_v)) * ab
        out = d.tokens * heads * d_v * ab
        before = Piece("core_attn", (coll("attn.cp_a2a.qkv", "F", "all_to_all", qkv, group),),
                       (coll("attn.cp_a2a.dqkv", "I", "all_to_all", qkv, group),))
        after = Piece("core_attn", (coll("attn.cp_a2a.out", "F", "all_to_all", out, group),),
                      (coll("attn.cp_a2a.dout", "I", "all_to_all", out, group),))
        if d.cp_exchange == "a2a":
            return before, after
        # the ring's K/V: heads / A of A x s / cp rows, the same elements as this rank's own K/V (`chunk`)
        steps = cp // d.cp_a2a - 1
        ring = Piece("core_attn", (coll("attn.cp_ring", "F", "send_recv", chunk, "cp_ring", count=steps),),
                     (coll("attn.cp_ring.bwd", "I", "send_recv", 2 * chunk, "cp_ring", count=steps),))
        return join("core_attn", before, ring), after
    return (Piece("core_attn", (coll("attn.cp_ring", "F", "send_recv", chunk, "cp", count=cp - 1),),
                  (coll("attn.cp_ring.bwd", "I", "send_recv", 2 * chunk, "cp", count=cp - 1),)), none)


def _qkv(model: ModelSpec, d: Dims) -> list[Piece]:
    """The fused QKV column-parallel linear of MHA / GQA / MQA. With fewer query groups g than TP ranks,
    Megatron-Core (transformer/attention.py SelfAttention.get_query_key_value_tensors, num_query_groups < tp) keeps
    linear_qkv column-parallel over all (heads + 2 g) heads, (heads + 2 g) * hd / tp columns per rank, all-gathers
    its output over TP along the last dim (all_gather_last_dim_from_tensor_parallel_region; its backward
    reduce-scatters the gradient along that dim) and keeps heads / tp query heads of its group and the group's one
    K and one V head (core attention: 1 KV head per rank)."""
    hd, t, groups = model.head_dim_, d.tokens, model.kv_heads
    if groups >= d.tp:
        heads, kv = model.num_attention_heads // d.tp, groups // d.tp
        return [column_linear("attn.qkv", d, t, (heads + 2 * kv) * hd, d.h, tag="attn")]
    width = (model.num_attention_heads + 2 * groups) * hd
    size = t * width * d.act_bytes  # the gathered output (all-gather), and its gradient (reduce-scatter input)
    return [column_linear("attn.qkv", d, t, width // d.tp, d.h, tag="attn"),
            Piece("attn", (coll("attn.qkv_out.ag", "F", "all_gather", size, "tp", tag="attn"),),
                  (coll("attn.qkv_out.rs", "I", "reduce_scatter", size, "tp", tag="attn"),))]


def gqa_attention(model: ModelSpec, d: Dims, window: int | None = None) -> list[Piece]:
    """MHA / GQA / MQA: fused QKV column-parallel linear, rotary embedding, optional per-head Q/K norms, core,
    row-parallel output projection. KV heads are split over TP, or replicated when fewer than TP (Megatron)."""
    hd, h, t = model.head_dim_, d.h, d.tokens
    heads, kv = model.num_attention_heads // d.tp, max(1, model.kv_heads // d.tp)
    # TorchTitan's wq, wk and wv are linears of their own on one input (ops_eager.input_grad_adds)
    pieces = [input_grad_adds("attn.qkv", d, t * h, 2 if d.torchtitan else 0, "attn"),
              *_qkv(model, d)]
    if model.position_embedding == "rope":
        pieces.append(rope("attn.rope", d, t * heads * hd, t * kv * hd, hd, "attn"))
    if model.qk_norm and d.rms_composite:  # TorchTitan's q_norm and k_norm, each its own chain of kernels
        pieces += [norm("attn.q_norm", d, t * heads, hd, "attn"), norm("attn.k_norm", d, t * kv, hd, "attn")]
    elif model.qk_norm:
        pieces.append(norm("attn.qk_norm", d, t * (heads + kv), hd, "attn"))
    if d.repeat_kv and kv < heads:
        # repeat_kv: K and V copied to every local query head (a copy forward; backward sums the copies' gradients),
        # so the attention kernel and torch's context-parallel exchanges move the query heads' K/V
        small, big = t * kv * 2 * hd * d.act_bytes, t * heads * 2 * hd * d.act_bytes
        pieces.append(Piece("attn", (mem("attn.repeat_kv", "F", small, big, d.act, "attn"),),
                            (mem("attn.repeat_kv.bwd", "I", big, small, d.act, "attn"),)))
        kv = heads
    pieces += [core_attention(d, heads, kv, hd, hd, window=window),
               row_linear("attn.proj", d, t, h, heads * hd, tag="attn")]
    return pieces


def mla_attention(model: ModelSpec, d: Dims) -> list[Piece]:
    """Multi-latent attention (DeepSeek-V2/V3). Megatron (MLASelfAttention): the down projections are replicated on
    every TP rank and run on this rank's sequence shard (SP) or on all tokens; under SP the latents, not the hidden
    state, are gathered over TP. Up projections and the output projection are TP-sharded.
    TorchTitan's DTensor TP (deepseek_v3 parallelize: PrepareModuleInput Shard(1) -> Replicate on the attention input,
    wq / wq_a / wkv_a NoParallel, wq_b / wkv_b ColwiseParallel, wo RowwiseParallel): the hidden state is gathered once,
    the down projections run on every token, and no latent is gathered. Under Megatron SP the q and kv latents enter
    their column-parallel up projections sequence-sharded (gathered there, re-gathered for the weight gradient)."""
    mla = model.mla
    assert mla is not None
    h, t = d.h, d.tokens
    heads = model.num_attention_heads // d.tp
    dq, rd, dv = mla.qk_head_dim + mla.qk_rope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim  # rd: rotary dim
    dtensor = d.sp and not d.tp_regather
    tl = t if dtensor else d.tokens_sp  # rows of the down projections
    pieces: list[Piece] = [tp_enter("attn.in", d, h, "attn")] if dtensor else []

    def up(name: str, n_out: int, k_in: int, tag: str) -> Piece:  # input already gathered under dtensor TP
        return (linear if dtensor else column_linear)(name, d, t, n_out, k_in, tag=tag)

    if mla.q_lora_rank:
        pieces.append(linear("attn.q_down", d, tl, mla.q_lora_rank, h, tag="attn"))
        if model.qk_norm:
            pieces.append(pointwise("attn.q_norm", d, tl * mla.q_lora_rank, tl * mla.q_lora_rank, "attn", fn=d.norm,
                                    width=mla.q_lora_rank))
        pieces.append(up("attn.q_up", heads * dq, mla.q_lora_rank, "mla_up_proj"))
    else:
        pieces.append(up("attn.q_proj", heads * dq, h, "attn"))
    latent = mla.kv_lora_rank + rd
    pieces.append(linear("attn.kv_down", d, tl, latent, h, tag="attn"))
    if model.qk_norm:
        pieces.append(pointwise("attn.kv_norm", d, tl * mla.kv_lora_rank, tl * mla.kv_lora_rank, "attn", fn=d.norm,
                                width=mla.kv_lora_rank))
    kv_up_out = heads * (mla.qk_head_dim + dv)
    if dtensor:
        pieces.append(linear("attn.kv_up", d, t, kv_up_out, mla.kv_lora_rank, tag="mla_up_proj"))
    elif d.sp:
        # Megatron-Core (get_query_key_value_tensors): the sequence-sharded kv latent enters the column-parallel
        # linear_kv_up_proj, which gathers it (and re-gathers it for its weight gradient); the rope key part is
        # gathered on its own (gather_from_sequence_parallel_region)
        pieces += [_latent_gather(d, rd),
                   column_linear("attn.kv_up", d, t, kv_up_out, mla.kv_lora_rank, tag="mla_up_proj")]
    else:
        pieces += [_latent_gather(d, latent),
                   linear("attn.kv_up", d, t, kv_up_out, mla.kv_lora_rank, tag="mla_up_proj")]
    # rope on the query heads' and the one shared key's rotary parts (TorchTitan's DeepSeek-V3 apply_rotary_emb is the
    # same complex chain as Llama's: ops_eager.rope)
    pieces.append(rope("attn.rope", d, t * heads * rd, t * rd, rd, "mla_up_proj", mla=True))
    if d.rope_unfused:  # Megatron-Core's unfused branch joins the rotary parts itself (ops_eager.megatron_mla_joins)
        pieces.append(megatron_mla_joins("attn.mla_join", d, t, heads, mla.qk_head_dim, rd, dv, "mla_up_proj"))
    pieces += [core_attention(d, heads, heads, dq, dv), row_linear("attn.proj", d, t, h, heads * dv, tag="attn")]
    return pieces


def _latent_gather(d: Dims, width: int) -> Piece:
    """A `width`-wide part of the kv latent: all-gathered over TP under SP (Megatron
    gather_from_sequence_parallel_region; its gradient reduce-scattered); without SP every rank already has all
    tokens and the input gradient of the TP-sharded up projection is all-reduced."""
    if d.tp == 1:
        return Piece("attn", (), ())
    size = d.tokens * width * d.act_bytes
    if d.sp:
        return Piece("attn", (coll("attn.kv_latent.ag", "F", "all_gather", size, "tp"),),
                     (coll("attn.kv_latent.rs", "I", "reduce_scatter", size, "tp"),))
    return Piece("attn", (), (coll("attn.kv_latent.ar", "I", "all_reduce", size, "tp"),))


def attention_pieces(model: ModelSpec, d: Dims, layer_index: int = 0) -> list[Piece]:
    """Input norm, self-attention and the residual add of decoder layer `layer_index`."""
    body = mla_attention(model, d) if model.mla is not None else gqa_attention(model, d, model.window_of(layer_index))
    return [norm("attn.norm", d, d.tokens_sp, d.h, "layernorm"), *body, residual("attn.residual", d)]
