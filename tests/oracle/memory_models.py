"""Plain-PyTorch decoders for the memory oracles (tests only), built from a `ModelSpec`.

The layers are written so that the tensors autograd saves are the tensors the fused kernels of Megatron-core /
Transformer Engine save, which is what `projection.memory.activations` inventories:

- RMSNorm / LayerNorm are custom autograd Functions saving their input and fp32 per-row statistics (TE's
  layernorm / rmsnorm kernels: input, rsigma (and mu)), and returning a fresh output that the next linear saves.
- Rotary embedding is a custom Function that saves only the cos/sin tables (buffers), like TE's fused RoPE, so
  only the rotated q and k survive. V is made contiguous before the attention kernel (TE does the same), so the
  fused QKV output is not kept alive by a view.
- Flash attention is `torch.nn.functional.scaled_dot_product_attention`; on the CPU it dispatches to
  `_scaled_dot_product_flash_attention_for_cpu`, which saves q, k, v (k and v at the KV-head width with
  `enable_gqa`), the output and an fp32 log-sum-exp of shape (b, heads, s) (checked by
  `test_memory_fake_layers.test_cpu_sdpa_saves_flash_tensors`). Its output is laid out (b, s, heads, d), so the
  reshape for the output projection is a view and the projection saves the same storage. Attention "flash_fn"
  is `_FlashAttnFn`, a custom Function saving the same five tensors (checked against the CPU kernel by
  `test_flash_fn_saves_what_cpu_sdpa_saves`), for MLA (V narrower than Q/K) and under FakeTensorMode.
- MLA (DeepSeek-V2/V3) follows Megatron's MLASelfAttention: down-projections, latent RMSNorms, up-projections,
  q/k assembled from their non-rotary and rotary parts.
- "Unfused" attention is the math path: QK^T, scale, additive causal mask, softmax (saves its output), dropout
  (1-byte mask + output, saved by the matmul with V), matmul with V.
- SwiGLU is a custom Function saving its input (the fc1 output, gate and up) once, like Megatron's
  bias_swiglu_impl; GELU is eager `F.gelu` (saves its input).
- Dropout is `torch.native_dropout` (1-byte bool mask, the CUDA fused path); CPU `F.dropout` would save a mask of
  the input dtype.
- The custom Functions compute row blocks into a preallocated result, so their transient memory is their result
  (plus one small row block), as for a fused GPU kernel.
- MoE: fp32 router softmax (saved), top-k (or, with `balanced_routing`, a data-independent balanced
  assignment), tokens permuted with `index_select` into one dispatched tensor
  (T*k rows), one weight per expert (TE GroupedLinear keeps weight0..weightN-1), a SwiGLU per expert weighted by the
  routed copies' probabilities inside it (Megatron-Core 0.13 on: weighted_bias_swiglu_impl, saving its input and the
  probabilities), the expert outputs concatenated and scattered back with `scatter_add` (saving only the index);
  optional shared expert on the same normed input.

Recompute: "full" checkpoints every decoder layer (`torch.utils.checkpoint`, use_reentrant=False); `selective`
names the regions checkpointed inside each layer: "core_attn" (the attention kernel, inputs q, k, v), "mlp" (the
dense MLP after its norm) and "moe" (the whole MoE block after its norm).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from projection.specs.model import ModelSpec

# Row block of the custom kernels below: elementwise work is done ROWS rows at a time, mostly in place, into a
# preallocated result, so a kernel allocates its full-size results plus about one ROWS-row temporary (a fused GPU
# kernel keeps its temporaries in registers); eager elementwise code would allocate several full-size temporaries.
ROWS = 32


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    """Per-row norm statistics are fp32 (or the input dtype if wider)."""
    return torch.promote_types(x.dtype, torch.float32)


def _blocks(n: int) -> list[slice]:
    return [slice(i, min(n, i + ROWS)) for i in range(0, n, ROWS)]


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out, rstd = torch.empty_like(x2), x2.new_empty((x2.shape[0], 1), dtype=_stat_dtype(x))  # fp32 row stats
        for sl in _blocks(x2.shape[0]):
            xs = x2[sl].to(rstd.dtype)
            rstd[sl] = xs.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
            out[sl] = xs.mul(rstd[sl]).to(x.dtype).mul_(w)
        ctx.save_for_backward(x, rstd, w)
        return out.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, rstd, w = ctx.saved_tensors
        x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, x.shape[-1])
        gx, gw = torch.empty_like(x2), torch.zeros_like(w)
        for sl in _blocks(x2.shape[0]):
            xhat = x2[sl] * rstd[sl]
            gw += (g2[sl] * xhat).sum(0)
            o = gx[sl]
            torch.mul(g2[sl], w, out=o)  # d xhat
            xhat.mul_((o * xhat).mean(-1, keepdim=True))
            o.sub_(xhat).mul_(rstd[sl])
        return gx.view_as(x), gw, None


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(x2)
        mu, rstd = (x2.new_empty((x2.shape[0], 1), dtype=_stat_dtype(x)) for _ in range(2))  # fp32 row stats
        for sl in _blocks(x2.shape[0]):
            xs = x2[sl]
            mu[sl] = xs.mean(-1, keepdim=True)
            rstd[sl] = xs.var(-1, unbiased=False, keepdim=True).add_(eps).rsqrt_()
            o = out[sl]
            torch.sub(xs, mu[sl], out=o)
            o.mul_(rstd[sl]).mul_(w).add_(b)
        ctx.save_for_backward(x, mu, rstd, w)
        return out.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, mu, rstd, w = ctx.saved_tensors
        x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, x.shape[-1])
        gx, gw, gb = torch.empty_like(x2), torch.zeros_like(w), torch.zeros_like(w)
        for sl in _blocks(x2.shape[0]):
            xhat = (x2[sl] - mu[sl]).mul_(rstd[sl])
            gw += (g2[sl] * xhat).sum(0)
            gb += g2[sl].sum(0)
            o = gx[sl]
            torch.mul(g2[sl], w, out=o)  # d xhat
            xhat.mul_((o * xhat).mean(-1, keepdim=True))
            o.sub_(o.mean(-1, keepdim=True)).sub_(xhat).mul_(rstd[sl])
        return gx.view_as(x), gw, gb, None


class Norm(nn.Module):
    def __init__(self, spec: ModelSpec, width: int) -> None:
        super().__init__()
        self.kind = spec.norm
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width)) if spec.norm == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            out: torch.Tensor = _RMSNormFn.apply(x, self.weight, 1e-6)
        else:
            out = _LayerNormFn.apply(x, self.weight, self.bias, 1e-5)
        return out


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_half_t(x: torch.Tensor) -> torch.Tensor:
    """Transpose of _rotate_half (its inverse)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


class _RopeFn(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin over (b, s, heads, d); saves only the (s, d) tables."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        out = torch.empty_like(x)
        for sl in _blocks(x.shape[1]):
            o = out[:, sl]
            torch.mul(x[:, sl], cos[sl, None, :], out=o)
            o.add_(_rotate_half(x[:, sl]).mul_(sin[sl, None, :]))
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors
        gx = torch.empty_like(g)
        for sl in _blocks(g.shape[1]):
            o = gx[:, sl]
            torch.mul(g[:, sl], cos[sl, None, :], out=o)
            o.add_(_rotate_half_t(g[:, sl] * sin[sl, None, :]))
        return gx, None, None


class _SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up over the last dim [gate | up]; saves its input only (Megatron bias_swiglu_impl)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return _swiglu(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor]:
        (x,) = ctx.saved_tensors
        return (_swiglu_grad(x, g),)


def _swiglu(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up over the last dim [gate | up], computed by row blocks into its result."""
    f = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * f)
    out = x2.new_empty((x2.shape[0], f))
    for sl in _blocks(x2.shape[0]):
        torch.mul(F.silu(x2[sl, :f]), x2[sl, f:], out=out[sl])
    return out.view(*x.shape[:-1], f)


def _swiglu_grad(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The gradient of _swiglu at x for the output gradient g, by row blocks."""
    f = x.shape[-1] // 2
    x2, g2 = x.reshape(-1, 2 * f), g.reshape(-1, f)
    gx = torch.empty_like(x2)
    for sl in _blocks(x2.shape[0]):
        gate, up, gs = x2[sl, :f], x2[sl, f:], g2[sl]
        d_gate, d_up = gx[sl, :f], gx[sl, f:]
        sig = torch.sigmoid(gate)
        torch.mul(gate, sig, out=d_up)
        d_up.mul_(gs)  # g * silu(gate)
        torch.mul(gs, up, out=d_gate)
        d_gate.mul_(sig)
        d_gate.mul_(sig.neg_().add_(1).mul_(gate).add_(1))  # g * up * sig * (1 + gate * (1 - sig))
        del sig
    return gx.view_as(x)




def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout with a 1-byte mask, as on GPUs: on the CPU `F.dropout` multiplies by a mask of the input dtype
    (ATen _dropout_impl) and saves that, while `native_dropout` (the fused CUDA path) saves a bool mask."""
    if not training or p == 0.0:
        return x
    out, _ = torch.native_dropout(x, p, True)
    return out


class _FlashAttnFn(torch.autograd.Function):
    """Causal attention that saves what FlashAttention-2 / TE fused attention save: q, k, v (k, v at the KV-head
    width), the output, laid out (b, s, heads, dv) so the output projection's reshape is a view, and the fp32
    log-sum-exp (b, heads, s). Unlike `F.scaled_dot_product_attention` it allows a V head width different from
    Q/K (MLA: 192 vs 128) and keeps that output layout under FakeTensorMode (whose meta kernel for the CPU flash
    op returns a (b, heads, s, d)-contiguous output). Forward in query-row blocks; backward recomputes."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, s, d = q.shape
        rep = h // k.shape[1]
        kk, vv = (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)) if rep > 1 else (k, v)
        acc = _stat_dtype(q)  # the kernel's accumulation type: fp32 for 16/32-bit inputs
        out = q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2)
        lse = q.new_empty((b, h, s), dtype=acc)
        cols = torch.arange(s)
        for sl in _blocks(s):
            sc = torch.matmul(q[:, :, sl], kk.transpose(-2, -1)).to(acc).mul_(1.0 / math.sqrt(d))
            sc.masked_fill_(cols[None, :] > cols[sl, None], float("-inf"))
            lse[:, :, sl] = torch.logsumexp(sc, dim=-1)
            out[:, :, sl] = torch.matmul(sc.sub_(lse[:, :, sl, None]).exp_().to(v.dtype), vv)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, _, _ = ctx.saved_tensors
        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            rep = q.shape[1] // k.shape[1]
            kr, vr = (kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1)) if rep > 1 else (kk, vv)
            sc = torch.matmul(qq, kr.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            s = q.shape[2]
            sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            out = torch.matmul(torch.softmax(sc.to(_stat_dtype(q)), dim=-1).to(v.dtype), vr)
            gq, gk, gv = torch.autograd.grad(out, (qq, kk, vv), g)
        return gq, gk, gv


def _linear(n_in: int, n_out: int, bias: bool) -> nn.Linear:
    lin = nn.Linear(n_in, n_out, bias=bias)
    nn.init.normal_(lin.weight, std=0.02)
    return lin


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, seq: int, attention: str, dropout: float, selective: frozenset[str]) -> None:
        super().__init__()
        h = spec.hidden_size
        self.heads, self.kv_heads, self.d = spec.num_attention_heads, spec.kv_heads, spec.head_dim_
        self.norm = Norm(spec, h)
        self.qkv = _linear(h, (self.heads + 2 * self.kv_heads) * self.d, spec.add_bias_linear or spec.add_qkv_bias)
        self.proj = _linear(self.heads * self.d, h, spec.add_bias_linear)
        self.attention, self.p, self.selective = attention, dropout, selective
        self.rope = spec.position_embedding == "rope"
        if self.rope:
            inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
            ang = torch.outer(torch.arange(seq).float(), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
        if attention == "unfused":
            self.register_buffer("causal_bias", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(b, heads, s, d) q and (b, kv_heads, s, d) k, v -> (b, s, heads * d)."""
        b, _, s, _ = q.shape
        if self.attention == "flash_fn":
            o = _FlashAttnFn.apply(q, k, v)
        elif self.attention == "flash":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0,
                                               enable_gqa=self.kv_heads != self.heads)
        else:
            if self.kv_heads != self.heads:
                rep = self.heads // self.kv_heads
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d)) + self.causal_bias
            probs = _dropout(torch.softmax(scores, dim=-1), self.p, self.training)
            o = torch.matmul(probs, v)
        return o.transpose(1, 2).reshape(b, s, self.heads * self.d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.norm(x))
        q, k, v = qkv.split([self.heads * self.d, self.kv_heads * self.d, self.kv_heads * self.d], dim=-1)
        del qkv
        q, k, v = q.view(b, s, self.heads, self.d), k.view(b, s, self.kv_heads, self.d), \
            v.view(b, s, self.kv_heads, self.d)
        if self.rope:
            q, k = _RopeFn.apply(q, self.cos, self.sin), _RopeFn.apply(k, self.cos, self.sin)
            v = v.contiguous()
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        ckpt = "core_attn" in self.selective
        o = checkpoint(self.core, q, k, v, use_reentrant=False) if ckpt else self.core(q, k, v)
        return _dropout(self.proj(o), self.p, self.training)


class MLAttention(nn.Module):
    """Multi-latent attention (DeepSeek-V2/V3, Megatron MLASelfAttention): q = up(norm(down(x))) (or one q_proj),
    kv latent = kv_down(x) = [latent | shared rotary key], k/v = kv_up(norm(latent)); the rotary parts of q and k
    go through the tables-only RoPE, q = [q_nope | q_rope], k = [k_nope | k_rope broadcast over heads], and the
    attention kernel is `_FlashAttnFn` (V narrower than Q/K)."""

    def __init__(self, spec: ModelSpec, seq: int, dropout: float) -> None:
        super().__init__()
        m = spec.mla
        assert m is not None
        h = spec.hidden_size
        self.m, self.heads, self.p = m, spec.num_attention_heads, dropout
        qd = m.qk_head_dim + m.qk_rope_head_dim
        self.norm = Norm(spec, h)
        if m.q_lora_rank:
            self.q_down = _linear(h, m.q_lora_rank, False)
            self.q_norm = Norm(spec, m.q_lora_rank) if spec.qk_norm else None
            self.q_up = _linear(m.q_lora_rank, self.heads * qd, False)
        else:
            self.q_proj = _linear(h, self.heads * qd, False)
        self.kv_down = _linear(h, m.kv_lora_rank + m.qk_rope_head_dim, False)
        self.kv_norm = Norm(spec, m.kv_lora_rank) if spec.qk_norm else None
        self.kv_up = _linear(m.kv_lora_rank, self.heads * (m.qk_head_dim + m.v_head_dim), False)
        self.proj = _linear(self.heads * m.v_head_dim, h, spec.add_bias_linear)
        r = m.qk_rope_head_dim
        inv = 1.0 / (10000 ** (torch.arange(0, r, 2).float() / r))
        ang = torch.outer(torch.arange(seq).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        m, a = self.m, self.heads
        y = self.norm(x)
        if m.q_lora_rank:
            ql = self.q_down(y)
            q = self.q_up(self.q_norm(ql) if self.q_norm is not None else ql)
        else:
            q = self.q_proj(y)
        q_nope, q_rope = q.view(b, s, a, -1).split([m.qk_head_dim, m.qk_rope_head_dim], dim=-1)
        q = torch.cat((q_nope, _RopeFn.apply(q_rope, self.cos, self.sin)), dim=-1)
        kv = self.kv_down(y)
        latent, k_rope = kv.split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kvu = self.kv_up(self.kv_norm(latent) if self.kv_norm is not None else latent)
        k_nope, v = kvu.view(b, s, a, -1).split([m.qk_head_dim, m.v_head_dim], dim=-1)
        k_rope = _RopeFn.apply(k_rope.view(b, s, 1, -1), self.cos, self.sin)
        k = torch.cat((k_nope, k_rope.expand(b, s, a, -1)), dim=-1)
        v = v.contiguous()
        del kv, kvu, q_nope, k_nope
        o = _FlashAttnFn.apply(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return _dropout(self.proj(o.transpose(1, 2).reshape(b, s, a * m.v_head_dim)), self.p, self.training)


class _WeightedSwiGLUFn(torch.autograd.Function):
    """silu(gate) * up * w per row, w the routed copy's probability: Megatron-Core's weighted_bias_swiglu_impl (the
    experts apply the routing probabilities from 0.13 on); saves its input and the probabilities only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return _swiglu(x).mul_(w.to(x.dtype)[:, None])

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        f = x.shape[-1] // 2
        x2, g2 = x.reshape(-1, 2 * f), g.reshape(-1, f)
        gw = torch.empty_like(w)
        for sl in _blocks(x2.shape[0]):  # d w = the row sum of g * silu(gate) * up
            gw[sl] = (g2[sl] * F.silu(x2[sl, :f]) * x2[sl, f:]).sum(-1).to(w.dtype)
        return _swiglu_grad(x, g * w.to(g.dtype)[:, None]), gw


class MLP(nn.Module):
    """h -> ffn (x2 when gated) -> h, without the norm."""

    def __init__(self, spec: ModelSpec, ffn: int) -> None:
        super().__init__()
        self.gated = spec.gated_mlp
        self.fc1 = _linear(spec.hidden_size, ffn * (2 if self.gated else 1), spec.add_bias_linear)
        self.fc2 = _linear(ffn, spec.hidden_size, spec.add_bias_linear)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        z = self.fc1(y)
        a = _SwiGLUFn.apply(z) if self.gated else F.gelu(z)
        out: torch.Tensor = self.fc2(a)
        return out


class DenseBlock(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float, selective: frozenset[str]) -> None:
        super().__init__()
        self.norm = Norm(spec, spec.hidden_size)
        self.mlp = MLP(spec, spec.ffn_hidden_size)
        self.p, self.ckpt = dropout, "mlp" in selective

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        out = checkpoint(self.mlp, y, use_reentrant=False) if self.ckpt else self.mlp(y)
        return _dropout(out, self.p, self.training)


class MoEBlock(nn.Module):
    def __init__(self, spec: ModelSpec, dropout: float, selective: frozenset[str], balanced: bool = False) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None and spec.gated_mlp and not spec.add_bias_linear and not moe.shared_expert_gate
        h, f = spec.hidden_size, moe.expert_ffn_hidden_size
        self.E, self.k = moe.num_experts, moe.top_k
        self.norm = Norm(spec, h)
        self.router = nn.Parameter(torch.randn(self.E, h) * 0.02)
        self.w1 = nn.ParameterList(nn.Parameter(torch.randn(2 * f, h) * 0.02) for _ in range(self.E))
        self.w2 = nn.ParameterList(nn.Parameter(torch.randn(h, f) * 0.02) for _ in range(self.E))
        self.shared = MLP(spec, moe.shared_expert_ffn_hidden_size) if moe.shared_expert_ffn_hidden_size else None
        self.p, self.ckpt = dropout, "moe" in selective or "mlp" in selective
        self.balanced = balanced

    def block(self, y: torch.Tensor) -> torch.Tensor:
        b, s, h = y.shape
        flat_y = y.view(b * s, h)
        probs = torch.softmax(F.linear(flat_y, self.router).float(), dim=-1)  # fp32 router probabilities
        if self.balanced:
            # Balanced routing fixed without looking at the data (usable under FakeTensorMode): copy j of token t
            # goes to expert (t * k + j) % E, every expert receiving T * k / E tokens.
            idx = (torch.arange(b * s)[:, None] * self.k + torch.arange(self.k)[None, :]) % self.E
            w = probs.gather(1, idx)
            counts = [b * s * self.k // self.E] * self.E
        else:
            w, idx = probs.topk(self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        flat_e = idx.view(-1)
        order = flat_e.argsort(stable=True)
        tokens = order // self.k
        dispatched = flat_y.index_select(0, tokens)  # T*k permuted token copies
        if not self.balanced:
            counts = torch.bincount(flat_e, minlength=self.E).tolist()
        # Megatron-Core (0.13 on) weights each routed copy inside its expert, in the fused weighted SwiGLU, so the
        # unpermute (scatter_add: it saves only the index) has no product to keep
        weights = w.view(-1)[order].split(counts)
        outs = []
        for e, chunk in enumerate(dispatched.split(counts)):
            outs.append(F.linear(_WeightedSwiGLUFn.apply(F.linear(chunk, self.w1[e]), weights[e]), self.w2[e]))
        expert_out = torch.cat(outs)
        out = torch.zeros_like(flat_y).scatter_add(0, tokens[:, None].expand(-1, h), expert_out)
        if self.shared is not None:
            out = out + self.shared(flat_y)
        return out.view(b, s, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        out = checkpoint(self.block, y, use_reentrant=False) if self.ckpt else self.block(y)
        return _dropout(out, self.p, self.training)


class Layer(nn.Module):
    """Decoder layer i of `spec`: pre-norm attention (MLA when spec.mla) and dense MLP or MoE block, residuals."""

    def __init__(self, spec: ModelSpec, i: int, seq: int, attention: str = "flash", dropout: float = 0.0,
                 selective: frozenset[str] = frozenset(), balanced_routing: bool = False) -> None:
        super().__init__()
        self.attn: nn.Module = MLAttention(spec, seq, dropout) if spec.mla is not None \
            else Attention(spec, seq, attention, dropout, selective)
        self.ffn: nn.Module = MoEBlock(spec, dropout, selective, balanced_routing) if spec.is_moe_layer(i) \
            else DenseBlock(spec, dropout, selective)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        out: torch.Tensor = x + self.ffn(x)
        return out


class Decoder(nn.Module):
    """A decoder LM built from `spec`; forward returns the mean cross-entropy loss of (ids, labels)."""

    def __init__(self, spec: ModelSpec, seq: int, *, attention: str = "flash", dropout: float = 0.0,
                 recompute: str = "none", selective: tuple[str, ...] = ()) -> None:
        super().__init__()
        assert attention in ("flash", "flash_fn", "unfused") and recompute in ("none", "full", "selective")
        h, v = spec.hidden_size, spec.padded_vocab()
        self.embed = nn.Embedding(v, h)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = nn.Embedding(spec.max_position_embeddings or seq, h) \
            if spec.position_embedding == "learned" else None
        sel = frozenset(selective if recompute == "selective" else ())
        self.layers = nn.ModuleList(Layer(spec, i, seq, attention, dropout, sel) for i in range(spec.num_layers))
        self.final_norm = Norm(spec, h)
        self.output = None if spec.tie_embeddings else _linear(h, v, False)
        self.p, self.full = dropout, recompute == "full"

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1]))
        x = _dropout(x, self.p, self.training)
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.full else layer(x)
        weight = self.embed.weight if self.output is None else self.output.weight
        logits = F.linear(self.final_norm(x), weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
