"""The elementwise work of TorchTitan's modules run eagerly (no torch.compile), kernel by kernel.

Compiled, Inductor fuses each of these chains into one kernel a direction, which is how the rest of the op list
prices them (ops_base.pointwise). Eager, every aten call is a kernel of its own that reads and writes its tensors
whole. The chains below are TorchTitan's model code (pytorch/torchtitan models/llama3, read 2026-11-30 through the
public-code index) and the backward formulas of PyTorch's autograd (tools/autograd/derivatives.yaml); each op is one
aten call, with the bytes it reads and writes. tests/oracle/test_eager_kernels.py runs the same modules under a
TorchDispatchMode and checks every chain's kernels and bytes against the aten calls PyTorch makes.

- RMSNorm, `rms_kernel="composite"` (KernelSpec.rms_norm_kernel): PyTorch's composite `F.rms_norm` of releases before
  the fused `_fused_rms_norm` kernel (pytorch/pytorch#153666, May 2025, PyTorch 2.8) and TorchTitan's own RMSNorm of
  2024, the same aten calls: x upcast to fp32, pow(2), mean over the row, + eps, rsqrt, x * rstd, * weight, cast
  back: 8 forward kernels and 17 backward ones (the casts only where the activations are not fp32). With the fused
  kernel ("fused") a norm is one kernel a direction, as ops_base.pointwise prices it.
- RoPE (`apply_rotary_emb`): xq.float() viewed as complex, times the freqs_cis table, viewed back, `type_as(xq)`; the
  same for xk. Backward: the gradient upcast, the conjugated table copied (`clone`), the complex product, the cast.
- SwiGLU (`FeedForward`: w2(F.silu(w1(x)) * w3(x)), and the experts' grouped w1 / w3): silu, then the product;
  backward: the two products' gradients, then silu_backward.
- Separate linears on one input (wq, wk, wv; w1, w3): autograd sums their input gradients, one add per extra linear.
- Megatron-Core's RoPE with `--no-rope-fusion` (`KernelSpec.rope_fusion` False): `_apply_rotary_pos_emb_bshd`
  (megatron/core/models/common/embeddings/rope_utils.py, 0.16.1): the fp32 table's cos and sin, each scaled by
  mscale and cast to the activations' dtype; `t * cos + rotate_half(t) * sin` (rotate_half: the upper half negated,
  joined before the lower one); the result joined with the empty non-rotary rest. Backward: the two products'
  gradients, rotate_half's negation and join, their sum, the empty rest's slice_backward (a zero fill) and its sum.
  Multi-latent attention first joins the even and odd channels (one cat; in backward two strided slice_backwards,
  each a fill and a copy, and their sum), and its unfused branch (multi_latent_attention.py) joins the rotary parts
  to the query and key heads and copies V contiguous; backward sums the broadcast key part over the heads and joins
  the split gradients of q and kv. tests/oracle/test_eager_kernels.py runs Megatron-Core's own function.
- Megatron-Core's MLP activation without its fused bias-activation kernel (`KernelSpec.bias_activation_fusion`
  False; always for GeLU experts, which Megatron-Core cannot fuse): transformer/mlp.py MLP.forward and
  transformer/moe/experts.py bias_act_func, 0.16.1: the fc1 bias added (dense layers with biases), then GeLU, or
  for a gated unit silu of one half times (the other half + glu_linear_offset, an add even at 0); experts then
  scale by their routing probabilities (in the activations' dtype, the router's default). Backward: the product's
  two gradients and the probabilities' row sum, the activation's backward (for the gated unit the two products'
  gradients, silu_backward and the join of the halves' gradients), the bias gradient's row sum.
  tests/oracle/test_eager_kernels.py runs Megatron-Core's MLP.forward.
- The loss, `cross_entropy(pred.float(), labels)`: logits upcast, log_softmax, nll_loss; backward nll_loss_backward
  (the fp32 gradient zero-filled and scattered: it reads the targets, not the log-probabilities), log_softmax's
  backward and the cast back to the logits' dtype.
"""

from __future__ import annotations

from projection.workload.ops_base import Dims, Op, Piece, mem, pointwise

F32 = 4  # bytes of an fp32 element
TARGET = 8  # bytes of an int64 label


def _ops(name: str, phase: str, d: Dims, tag: str, kernels: list[tuple[str, float, float]]) -> tuple[Op, ...]:
    """One memory-bound op per (suffix, read bytes, written bytes)."""
    return tuple(mem(f"{name}.{suffix}", "F" if phase == "F" else "I", r, w, d.act, tag)
                 for suffix, r, w in kernels)


def _casts(d: Dims) -> bool:
    """Whether upcasting to fp32 is a kernel: not when the activations are fp32 already (`x.float()` is x)."""
    return d.act_bytes != F32


def composite_rms_norm(name: str, d: Dims, rows: int, width: int, tag: str) -> Piece:
    """PyTorch's composite rms_norm (module docstring) over rows x width activations."""
    e, r, ab, w = float(rows) * width, float(rows), d.act_bytes, float(width)
    up = [("upcast", ab * e, F32 * e)] if _casts(d) else []
    down = [("cast", F32 * e, ab * e)] if _casts(d) else []
    fwd = [*up,
           ("pow", F32 * e, F32 * e), ("mean", F32 * e, F32 * r), ("add_eps", F32 * r, F32 * r),
           ("rsqrt", F32 * r, F32 * r), ("mul_rstd", F32 * (e + r), F32 * e),
           ("mul_weight", F32 * e + ab * w, F32 * e), *down]
    bwd = [*([("grad_upcast", ab * e, F32 * e)] if _casts(d) else []),
           # weight gradient: dy * x_hat summed over the rows, cast to the weight's dtype
           ("wgrad_mul", 2 * F32 * e, F32 * e), ("dgrad_mul_weight", F32 * e + ab * w, F32 * e),
           ("wgrad_sum", F32 * e, F32 * w), *([("wgrad_cast", F32 * w, ab * w)] if _casts(d) else []),
           # through x * rstd: to x, and to rstd (a row sum)
           ("rstd_grad_mul", 2 * F32 * e, F32 * e), ("dgrad_mul_rstd", F32 * (e + r), F32 * e),
           ("rstd_grad_sum", F32 * e, F32 * r),
           # rsqrt's backward, -0.5 * g * rstd^3 over the rows: pow, scale, product
           ("rsqrt_bwd_pow", F32 * r, F32 * r), ("rsqrt_bwd_scale", F32 * r, F32 * r),
           ("rsqrt_bwd_mul", 2 * F32 * r, F32 * r),
           # mean's backward (the row gradient expanded and divided), pow's (g * 2 * x^1)
           ("mean_bwd_div", F32 * r, F32 * e), ("pow_bwd_pow", F32 * e, F32 * e), ("pow_bwd_scale", F32 * e, F32 * e),
           ("pow_bwd_mul", 2 * F32 * e, F32 * e),
           # the two gradients of the fp32 input summed, then cast to the input's dtype
           ("dgrad_add", 2 * F32 * e, F32 * e), *([("dgrad_cast", F32 * e, ab * e)] if _casts(d) else [])]
    return Piece(tag, _ops(name, "F", d, tag, fwd), _ops(name + ".bwd", "I", d, tag, bwd))


def eager_rope(name: str, d: Dims, elems: tuple[int, ...], seq: int, head_dim: int, tag: str) -> Piece:
    """TorchTitan's complex-multiplication RoPE on each tensor of `elems` elements (q, then k): the table is seq x
    head_dim / 2 complex64 values (8 B each), broadcast over batch and heads."""
    ab, table = d.act_bytes, float(seq) * head_dim // 2 * 8
    fwd: list[tuple[str, float, float]] = []
    bwd: list[tuple[str, float, float]] = []
    for i, n in enumerate(elems):
        e = float(n)
        fwd += [*([(f"upcast{i}", ab * e, F32 * e)] if _casts(d) else []), (f"mul{i}", F32 * e + table, F32 * e),
                *([(f"cast{i}", F32 * e, ab * e)] if _casts(d) else [])]
    for i, n in reversed(list(enumerate(elems))):
        e = float(n)
        bwd += [*([(f"grad_upcast{i}", ab * e, F32 * e)] if _casts(d) else []), (f"conj{i}", table, table),
                (f"mul{i}", F32 * e + table, F32 * e), *([(f"cast{i}", F32 * e, ab * e)] if _casts(d) else [])]
    return Piece(tag, _ops(name, "F", d, tag, fwd), _ops(name + ".bwd", "I", d, tag, bwd))


def megatron_rope(name: str, d: Dims, elems: tuple[int, ...], seq: int, rot_dim: int, tag: str,
                  mla: bool = False) -> Piece:
    """Megatron-Core's unfused RoPE (module docstring) on each tensor of `elems` elements (q, then k); the table is
    seq x rot_dim fp32 angles, broadcast over batch and heads."""
    ab, t4 = d.act_bytes, float(seq) * rot_dim * F32
    tab = float(seq) * rot_dim * ab  # the cast table, as the products read it
    fwd: list[tuple[str, float, float]] = []
    bwd: list[tuple[str, float, float]] = []
    for i, n in enumerate(elems):
        e = float(n) * ab
        table = [(f"{fn}{i}", t4, t4) for fn in ("cos", "cos_scale")] + \
            ([(f"cos_cast{i}", t4, tab)] if _casts(d) else []) + \
            [(f"{fn}{i}", t4, t4) for fn in ("sin", "sin_scale")] + ([(f"sin_cast{i}", t4, tab)] if _casts(d) else [])
        fwd += [*([(f"mla_join{i}", e, e)] if mla else []), *table,
                (f"mul_cos{i}", e + tab, e), (f"neg{i}", e / 2, e / 2), (f"rotate_join{i}", e, e),
                (f"mul_sin{i}", e + tab, e), (f"add{i}", 2 * e, e), (f"pass_join{i}", e, e)]
    for i, n in reversed(list(enumerate(elems))):
        e = float(n) * ab
        # mla: each strided half's slice_backward is a zero fill and a copy of the half, then their sum
        halves = [kernel for j in (0, 1) for kernel in ((f"mla_half{i}{j}_fill", 0.0, e),
                                                        (f"mla_half{i}{j}_copy", e / 2, e / 2))]
        bwd += [(f"mul_sin{i}", e + tab, e), (f"neg{i}", e / 2, e / 2), (f"rotate_join{i}", e, e),
                (f"mul_cos{i}", e + tab, e), (f"add{i}", 2 * e, e),
                *([*halves, (f"mla_add{i}", 2 * e, e)] if mla else []),
                (f"pass_fill{i}", 0.0, e), (f"pass_add{i}", 2 * e, e)]
    return Piece(tag, _ops(name, "F", d, tag, fwd), _ops(name + ".bwd", "I", d, tag, bwd))


def megatron_mla_joins(name: str, d: Dims, rows: int, heads: int, qk: int, rd: int, dv: int, tag: str) -> Piece:
    """The unfused MLA branch's joins (module docstring): query = [q_nope, q_rope], key = [k_nope, k_rope broadcast
    over the heads], V copied contiguous; backward: the key part summed over the heads, the kv and q gradients
    joined."""
    ab, r = d.act_bytes, float(rows)
    q, k_rope = r * heads * (qk + rd) * ab, r * rd * ab
    fwd = [("query_join", q, q), ("key_join", r * heads * qk * ab + k_rope, q),
           ("value_copy", r * heads * dv * ab, r * heads * dv * ab)]
    kv = r * heads * (qk + dv) * ab
    bwd = [("key_rope_sum", r * heads * rd * ab, k_rope), ("kv_grad_join", kv, kv), ("q_grad_join", q, q)]
    return Piece(tag, _ops(name, "F", d, tag, fwd), _ops(name + ".bwd", "I", d, tag, bwd))


def eager_swiglu(name: str, d: Dims, out_elems: float, tag: str) -> Piece:
    """silu(a) * b over `out_elems` elements a direction (a and b the two halves of the gated input)."""
    ab, f = d.act_bytes, float(out_elems)
    fwd = [("silu", ab * f, ab * f), ("mul", 2 * ab * f, ab * f)]
    bwd = [("mul_grad_b", 2 * ab * f, ab * f), ("mul_grad_a", 2 * ab * f, ab * f), ("silu_bwd", 2 * ab * f, ab * f)]
    return Piece(tag, _ops(name, "F", d, tag, fwd), _ops(name + ".bwd", "I", d, tag, bwd))


def megatron_activation(name: str, d: Dims, rows: int, width: int, tag: str, *, bias: bool, probs: bool) -> Piece:
    """Megatron-Core's unfused bias + activation (+ routing-probability scale) over rows x width outputs (module
    docstring); a gated unit reads 2 x width a row."""
    ab, f, r = d.act_bytes, float(rows) * width * d.act_bytes, float(rows) * d.act_bytes
    gated = d.act_fn.endswith("_glu")
    fin, bias_w = (2 * f if gated else f), (2 if gated else 1) * width * ab
    fwd = [("bias", fin + bias_w, fin)] if bias else []
    bwd: list[tuple[str, float, float]] = []
    if gated:
        fwd += [("silu", f, f), ("offset", f, f), ("mul", 2 * f, f)]
    else:
        fwd += [(d.act_fn, f, f)]
    if probs:
        fwd += [("probs", f + r, f)]
        bwd += [("probs_grad", 2 * f, f), ("probs_dgrad", f + r, f), ("probs_sum", f, r)]
    if gated:
        bwd += [("mul_grad_a", 2 * f, f), ("mul_grad_b", 2 * f, f), ("silu_bwd", 2 * f, f), ("join", 2 * f, 2 * f)]
    else:
        bwd += [(f"{d.act_fn}_bwd", 2 * f, f)]
    if bias:
        bwd += [("bias_sum", fin, bias_w)]
    return Piece(tag, _ops(name, "F", d, tag, fwd), _ops(name + ".bwd", "I", d, tag, bwd))


def grad_adds(name: str, d: Dims, elems: float, extra_linears: int, tag: str) -> Piece:
    """Autograd's sum of the input gradients of `extra_linears` + 1 linears that read one input (backward only)."""
    e, ab = float(elems), d.act_bytes
    return Piece(tag, (), tuple(mem(f"{name}.dgrad_add{i}", "I", 2 * ab * e, ab * e, d.act, tag)
                                for i in range(extra_linears)))


def eager_cross_entropy(name: str, d: Dims, rows: int, vocab: int) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """(forward, backward) ops of cross_entropy(logits.float(), labels) over rows x vocab logits."""
    e, t, ab = float(rows) * vocab, float(rows), d.act_bytes
    fwd = [*([("upcast", ab * e, F32 * e)] if _casts(d) else []), ("log_softmax", F32 * e, F32 * e),
           ("nll", t * (TARGET + F32), 2 * F32)]
    bwd = [("nll_bwd", t * TARGET + 2 * F32, F32 * e), ("log_softmax_bwd", 2 * F32 * e, F32 * e),
           *([("cast", F32 * e, ab * e)] if _casts(d) else [])]
    return _ops(name, "F", d, "loss", fwd), _ops(name + ".bwd", "I", d, "loss", bwd)


# ---- which form a module's elementwise work takes (the call sites of ops_attention, ops_mlp and ops)

def norm(name: str, d: Dims, rows: int, width: int, tag: str) -> Piece:
    """A normalisation over rows x width: the composite chain where d.rms_composite, else one kernel a direction."""
    if d.rms_composite and d.norm == "rmsnorm":
        return composite_rms_norm(name, d, rows, width, tag)
    return pointwise(name, d, rows * width, rows * width, tag, fn=d.norm, width=width)


def rope(name: str, d: Dims, q_elems: int, k_elems: int, head_dim: int, tag: str, mla: bool = False) -> Piece:
    """Rotary embedding of q and k: TorchTitan's eager chain, Megatron-Core's unfused one, else one kernel a
    direction."""
    if d.eager:
        return eager_rope(name, d, (q_elems, k_elems), d.s // d.cp, head_dim, tag)
    if d.rope_unfused:
        return megatron_rope(name, d, (q_elems, k_elems), d.s // d.cp, head_dim, tag, mla)
    return pointwise(name, d, q_elems + k_elems, q_elems + k_elems, tag)


def activation(name: str, d: Dims, rows: int, width: int, tag: str, experts: bool = False) -> Piece:
    """The MLP activation over rows x width outputs (a gated one reads 2 x width a row): TorchTitan's eager SwiGLU,
    Megatron-Core's unfused chain (fusion off; GeLU experts, which it cannot fuse), else one kernel a direction."""
    if d.eager and d.act_fn == "silu_glu":
        return eager_swiglu(name, d, float(rows) * width, tag)
    if not d.torchtitan and (d.act_unfused or (experts and not d.act_fn.endswith("_glu"))):
        return megatron_activation(name, d, rows, width, tag, bias=d.linear_bias and not experts, probs=experts)
    branches = 2 if d.act_fn.endswith("_glu") else 1
    return pointwise(name, d, float(rows) * branches * width, float(rows) * width, tag, fn=d.act_fn, width=width)


def input_grad_adds(name: str, d: Dims, elems: float, extra_linears: int, tag: str) -> Piece:
    """The input-gradient sums of TorchTitan's separate linears, priced where they run as kernels (eager)."""
    return grad_adds(name, d, elems, extra_linears, tag) if d.eager and extra_linears else Piece(tag, (), ())
