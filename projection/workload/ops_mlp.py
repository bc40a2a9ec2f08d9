"""Feed-forward ops on one rank: the dense (gated or plain) MLP and the mixture-of-experts block.

Dense MLP (Megatron MLP): fc1 column-parallel h -> branches*ffn/tp (branches = 2 for a gated MLP: gate and up),
activation, fc2 row-parallel ffn/tp -> h.

MoE (Megatron MoELayer with the all-to-all token dispatcher, balanced routing): the router linear h -> E runs on this
rank's sequence shard (t_l = tokens/tp under SP), top-k selection, permutation of the top_k * t_l token copies,
all-to-all over EP (dispatch), all-gather over the expert-TP group, grouped expert GEMMs over the E/ep local experts,
then the mirror image (reduce-scatter over ETP, all-to-all combine, unpermute). With balanced routing every EP rank
receives as many token copies as it sends, so the expert GEMMs process rows = top_k * t_l * etp rows in total,
rows / (E/ep) per local expert. Expert FLOPs depend on the total rows only, so they hold for any routing. Shared
experts (DeepSeek, Qwen-MoE) are a dense TP-sharded MLP over the same tokens, with an optional sigmoid gate h -> 1.
With Megatron's allgather dispatcher (its default) the tokens of the tensor-and-expert group are all-gathered
instead of exchanged all-to-all, and reduce-scattered back (`_allgather_dispatch`); the experts' rows are the same.
With a capacity factor (token dropping) the routed copies are capped at the experts' capacity, or padded to it
(`MoESpec.routed_copies`): every op after the top-k selection moves and multiplies that many rows.
"""

from __future__ import annotations

from dataclasses import replace

from projection.specs.model import ModelSpec
from projection.specs.training import DTYPE_BYTES
from projection.workload.ops_base import (
    CollKind,
    Dims,
    Op,
    Phase,
    Piece,
    coll,
    column_linear,
    join,
    linear,
    mem,
    residual,
    row_linear,
)
from projection.workload.ops_eager import activation, input_grad_adds, norm


def dense_mlp(model: ModelSpec, d: Dims, ffn: int, name: str = "mlp", tag: str = "mlp") -> Piece:
    branches = 2 if model.gated_mlp else 1
    f, t, h = ffn // d.tp, d.tokens, d.h
    # TorchTitan's w1 and w3 are linears of their own on one input (ops_eager.input_grad_adds)
    return join(tag, input_grad_adds(f"{name}.fc1", d, t * h, branches - 1 if d.torchtitan else 0, tag),
                column_linear(f"{name}.fc1", d, t, branches * f, h, tag=tag),
                activation(f"{name}.act", d, t, f, tag),
                row_linear(f"{name}.fc2", d, t, h, f, tag=tag))


def grouped_linear(name: str, d: Dims, groups: int, rows: int, n_out: int, k_in: int, tag: str) -> Piece:
    """Expert linears as one grouped GEMM: `groups` experts, `rows` token rows in total, rows/groups per expert
    (BLAS shapes as a linear's: forward (out, rows/groups, in) "TN", dgrad "NN", wgrad "NT"). FLOPs use the exact
    row total; the per-group row count is rounded for the shape."""
    dt, ab = d.expert_gemm, d.act_bytes
    b_in = DTYPE_BYTES.get(dt, 2)
    acc = d.main_grad_bytes if d.fused_wgrad else 0
    per = max(1, round(rows / groups))
    weights = groups * n_out * k_in * b_in
    flop = 2.0 * rows * n_out * k_in

    def op(suffix: str, phase: Phase, m: int, n: int, k: int, layout: str, read: float, written: float) -> Op:
        return Op(f"{name}{suffix}", "grouped_gemm", phase, dtype=dt, flop=flop, bytes_read=read,
                  bytes_written=written, m=m, n=n, k=k, batch=groups, layout=layout, tag=tag)

    fwd = [op("", "F", n_out, per, k_in, "TN", rows * k_in * b_in + weights, rows * n_out * ab)]
    bwd = [op(".dgrad", "I", k_in, per, n_out, "NN", rows * n_out * b_in + weights, rows * k_in * ab),
           op(".wgrad", "W", k_in, n_out, per, "NT", rows * (n_out + k_in) * b_in + groups * n_out * k_in * acc,
              groups * n_out * k_in * (acc or ab))]
    if dt == "fp8":
        fwd.insert(0, mem(f"{name}.cast", "F", rows * k_in * ab, 2 * rows * k_in, "fp8", tag))
        bwd.insert(0, mem(f"{name}.dgrad.cast", "I", rows * n_out * ab, 2 * rows * n_out, "fp8", tag))
    return Piece(tag, tuple(fwd), tuple(bwd))


# The router's top-k: the op whose token counts a MoE dispatcher reads on the host (perf/checks.token_count_syncs).
ROUTER_TOPK = "moe.router.topk"

def moe_pieces(model: ModelSpec, d: Dims) -> list[Piece]:
    """Router, dispatch, routed experts, combine and shared experts of one MoE layer (tags 'moe', 'moe_act',
    'shared_experts': the Megatron recompute module names)."""
    moe = model.moe
    assert moe is not None
    tl, h, ab, e = d.tokens_sp, d.h, d.act_bytes, moe.num_experts
    routed = int(moe.routed_copies(tl))  # k tl dropless; capped or padded by the capacity factor
    rows = routed * d.etp
    local = e // d.ep
    branches = 2 if model.gated_mlp else 1
    fe = moe.expert_ffn_hidden_size // d.etp
    router = [linear("moe.router", d, tl, e, h, dtype=d.act, tag="moe"),
              Piece("moe", (mem(ROUTER_TOPK, "F", tl * e * 4, tl * e * 4 + moe.top_k * tl * 8, "fp32", "moe"),),
                    (mem("moe.router.topk.bwd", "I", 2 * tl * e * 4, tl * e * 4, "fp32", "moe"),))]
    experts = [input_grad_adds("moe.fc1", d, rows * h, branches - 1 if d.torchtitan else 0, "moe"),
               grouped_linear("moe.fc1", d, local, rows, branches * fe, h, "moe"),
               activation("moe.act", d, rows, fe, "moe_act", experts=True),
               grouped_linear("moe.fc2", d, local, rows, h, fe, "moe")]
    if d.sequential_experts:
        experts = [_per_expert(p, local) for p in experts]
    if d.allgather_dispatch and d.ep * d.etp > 1:
        pieces = router + _allgather_dispatch(d, e, rows, experts)
    else:
        permute, unpermute = (_unfused_permute if d.unfused_permute else _fused_permute)(d, e, tl, routed)
        pieces = [*router, permute, *_dispatch_metadata(d, e, routed),
                  _exchange("moe.dispatch", d, routed * h * ab, rows * h * ab),
                  *experts,
                  _exchange("moe.combine", d, routed * h * ab, rows * h * ab, combine=True), unpermute]
    if moe.shared_expert_ffn_hidden_size:
        pieces.append(dense_mlp(model, d, moe.shared_expert_ffn_hidden_size, "moe.shared", "shared_experts"))
        if moe.shared_expert_gate:
            pieces.append(linear("moe.shared.gate", d, d.tokens, 1, h, dtype=d.act, tag="shared_experts"))
    return pieces


def _fused_permute(d: Dims, e: int, tl: int, routed: int) -> tuple[Piece, Piece]:
    """Transformer Engine's fused permute (token rows gathered into the routed copies by the sorted indices) and
    unpermute (the copies summed back into the token rows), and their backwards."""
    h, ab = d.h, d.act_bytes
    return (Piece("moe", (mem("moe.permute", "F", tl * h * ab + routed * 8, routed * h * ab, d.act, "moe"),),
                  (mem("moe.permute.bwd", "I", routed * h * ab, tl * h * ab, d.act, "moe"),)),
            Piece("moe", (mem("moe.unpermute", "F", routed * (h * ab + 4), tl * h * ab, d.act, "moe"),),
                  (mem("moe.unpermute.bwd", "I", tl * h * ab + routed * 4, routed * h * ab, d.act, "moe"),)))


def _unfused_permute(d: Dims, e: int, tl: int, routed: int) -> tuple[Piece, Piece]:
    """Megatron-Core moe_utils without --moe-permute-fusion (the kernels it dispatches, checked against the aten
    calls of its permute / unpermute on the CPU in tests/oracle/test_moe_permute_bytes.py). permute: the [tl, E]
    routing map and probabilities transposed (copies), an arange of the token ids, masked_select of the ids and of
    the probabilities (int64, probability dtype), index_select of the routed rows; unpermute: zeros of the token rows
    and scatter_add_ of the routed copies into them (reading the rows it adds to). Backward: unpermute's gather of
    the output gradient by the indices; the probabilities' masked_scatter into zeros and the transpose back;
    permute's zeros and index_add_. Probabilities in the activation dtype (the router's default)."""
    h, ab, p = d.h, d.act_bytes, d.act_bytes
    te, rows = tl * e, tl * h * ab
    fwd = (mem("moe.permute.map_t", "F", te, te, "bool", "moe"),
           mem("moe.permute.ids", "F", 0, tl * 8, "int64", "moe"),
           mem("moe.permute.select_ids", "F", te + tl * 8, routed * 8, "int64", "moe"),
           mem("moe.permute.probs_t", "F", te * p, te * p, d.act, "moe"),
           mem("moe.permute.select_probs", "F", te * p + te, routed * p, d.act, "moe"),
           mem("moe.permute", "F", rows + routed * 8, routed * h * ab, d.act, "moe"))
    bwd = (mem("moe.permute.probs.zeros", "I", 0, te * p, d.act, "moe"),
           mem("moe.permute.probs.bwd", "I", te * p + te + routed * p, te * p, d.act, "moe"),
           mem("moe.permute.probs_t.bwd", "I", te * p, te * p, d.act, "moe"),
           mem("moe.permute.zeros", "I", 0, rows, d.act, "moe"),
           mem("moe.permute.bwd", "I", rows + routed * (h * ab + 8), rows, d.act, "moe"))
    unfwd = (mem("moe.unpermute.zeros", "F", 0, rows, d.act, "moe"),
             mem("moe.unpermute", "F", rows + routed * (h * ab + 8), rows, d.act, "moe"))
    unbwd = (mem("moe.unpermute.bwd", "I", rows + routed * 8, routed * h * ab, d.act, "moe"),)
    return Piece("moe", fwd, bwd), Piece("moe", unfwd, unbwd)


def _per_expert(piece: Piece, groups: int) -> Piece:
    """Megatron's SequentialMLP (no --moe-grouped-gemm): a Python loop over the local experts, so every expert op
    runs `groups` times on its own rows (a GEMM or an elementwise kernel each); totals unchanged."""
    def split(op: Op) -> Op:
        return replace(op, kind="gemm" if op.kind == "grouped_gemm" else op.kind, batch=1, count=op.count * groups,
                       flop=op.flop / groups, bytes_read=op.bytes_read / groups,
                       bytes_written=op.bytes_written / groups, m=op.m if op.kind == "grouped_gemm" else op.m // groups)
    return Piece(piece.tag, tuple(split(o) for o in piece.fwd), tuple(split(o) for o in piece.bwd))


def _allgather_dispatch(d: Dims, e: int, rows: int, experts: list[Piece]) -> list[Piece]:
    """Megatron's MoEAllGatherTokenDispatcher: all-gather of the routing map (1 byte per token and expert, no
    gradient), the routing probabilities and the hidden states over the tensor-and-expert group (etp x ep ranks,
    T_g = t_l etp ep tokens); the local experts' rows selected from the gathered tokens (permute), the experts,
    their outputs scattered back into T_g rows (unpermute), and a reduce-scatter over the same group. Backward: the
    conjugate collectives (probabilities and hidden-state gradients reduce-scattered, output gradient gathered).
    Probabilities are counted in the activation dtype (Megatron's router dtype default)."""
    ab, h = d.act_bytes, d.h
    tg = d.tokens_sp * d.etp * d.ep
    gather = Piece("moe", (coll("moe.dispatch.map", "F", "all_gather", tg * e, "etp_ep", tag="moe"),
                           coll("moe.dispatch.probs", "F", "all_gather", tg * e * ab, "etp_ep", tag="moe"),
                           coll("moe.dispatch.tokens", "F", "all_gather", tg * h * ab, "etp_ep", tag="moe")),
                   (coll("moe.dispatch.tokens.bwd", "I", "reduce_scatter", tg * h * ab, "etp_ep", tag="moe"),
                    coll("moe.dispatch.probs.bwd", "I", "reduce_scatter", tg * e * ab, "etp_ep", tag="moe")))
    local = e // d.ep
    permute = Piece("moe", (mem("moe.permute", "F", tg * local + rows * h * ab, rows * h * ab, d.act, "moe"),),
                    (mem("moe.permute.bwd", "I", rows * h * ab, tg * h * ab, d.act, "moe"),))
    unpermute = Piece("moe", (mem("moe.unpermute", "F", rows * (h + 1) * ab, tg * h * ab, d.act, "moe"),),
                      (mem("moe.unpermute.bwd", "I", tg * h * ab, rows * (h + 1) * ab, d.act, "moe"),))
    combine = Piece("moe", (coll("moe.combine.tokens", "F", "reduce_scatter", tg * h * ab, "etp_ep", tag="moe"),),
                    (coll("moe.combine.tokens.bwd", "I", "all_gather", tg * h * ab, "etp_ep", tag="moe"),))
    return [gather, permute, *experts, unpermute, combine]


def _dispatch_metadata(d: Dims, e: int, routed: int) -> list[Piece]:
    """What Megatron's all-to-all dispatcher exchanges beside the tokens (megatron/core/transformer/moe/
    token_dispatcher.py, MoEAlltoAllTokenDispatcher): `preprocess` all-gathers each rank's tokens per expert (e int64
    counts, no gradient) over the expert-tensor-and-expert group when ep or etp > 1; `token_dispatch` sends the
    permuted routing probabilities with the tokens (a second all-to-all), and `dispatch_postprocess` gathers them
    over etp like the tokens. The probabilities carry a gradient (they weight the expert activation), so their
    exchange runs again in backward. Probabilities in the activation dtype, the router's default (a
    `moe_router_dtype` of fp32 would double them; it is not read). Neither TorchTitan's own token exchange nor DeepEP
    (flex) runs these (Dims.alltoall_metadata)."""
    if d.ep * d.etp == 1 or not d.alltoall_metadata:
        return []
    counts = Piece("moe", (coll("moe.dispatch.counts", "F", "all_gather", d.ep * d.etp * e * 8, "etp_ep",
                                tag="moe"),), ())
    probs = routed * d.act_bytes
    return [counts, _exchange("moe.dispatch.probs", d, probs, probs * d.etp)]


def _exchange(name: str, d: Dims, a2a_bytes: float, etp_bytes: float, combine: bool = False) -> Piece:
    """Dispatch: all-to-all over EP, then all-gather over ETP; combine: reduce-scatter over ETP, then all-to-all.
    Each backward runs the conjugate collectives in reverse order."""
    a2a = [(coll(name + ".a2a", "F", "all_to_all", a2a_bytes, "ep", tag="moe"),
            coll(name + ".a2a.bwd", "I", "all_to_all", a2a_bytes, "ep", tag="moe"))] if d.ep > 1 else []
    etp_f: CollKind = "reduce_scatter" if combine else "all_gather"
    etp_b: CollKind = "all_gather" if combine else "reduce_scatter"
    etp = [(coll(name + ".etp", "F", etp_f, etp_bytes, "etp", tag="moe"),
            coll(name + ".etp.bwd", "I", etp_b, etp_bytes, "etp", tag="moe"))] if d.etp > 1 else []
    steps = etp + a2a if combine else a2a + etp
    return Piece("moe", tuple(f for f, _ in steps), tuple(b for _, b in reversed(steps)))


def ffn_pieces(model: ModelSpec, d: Dims, layer_index: int) -> list[Piece]:
    """Pre-MLP norm, the dense MLP or MoE block of decoder layer `layer_index`, and the residual add."""
    body = moe_pieces(model, d) if model.is_moe_layer(layer_index) else [dense_mlp(model, d, model.ffn_hidden_size)]
    return [norm("mlp.norm", d, d.tokens_sp, d.h, "layernorm"), *body, residual("mlp.residual", d)]
