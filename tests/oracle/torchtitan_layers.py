"""Decoder blocks written the way TorchTitan writes them, for the memory oracles (tests only).

The structure follows pytorch/torchtitan's models (read 2026-11-29 through the public-code index; no code copied):

- llama3 `Attention`: separate `wq`, `wk`, `wv` linears, the heads as a view, optional per-head `q_norm` / `k_norm`
  (qwen3), rotary embedding by complex multiplication (`xq.float()` viewed as complex, times the `freqs_cis` table,
  viewed back as real and cast with `type_as`), `repeat_kv` (unsqueeze, expand, reshape) of K and V to every query
  head, SDPA on (b, heads, s, d), the output transposed back, made contiguous and viewed as (b, s, heads * d) for
  `wo`.
- `FeedForward`: `w2(F.silu(w1(x)) * w3(x))`.
- `TransformerBlock`: `h = x + attention(attention_norm(x))`, `out = h + feed_forward(ffn_norm(h))`.
- MoE (`moe.py`): a router gate linear, scores by a softmax in fp32 and a top-k, the routed token copies gathered in
  expert order and run through `torch._grouped_mm` experts with the same SwiGLU, combined back with their scores,
  then the shared expert (a `FeedForward`) on the block input.

Two stand-ins keep the saved tensors those of the GPU kernels a TorchTitan job runs: the norms are
`memory_models._RMSNormFn`, which saves what CUDA's `_fused_rms_norm` saves (its input and fp32 rstd;
derivatives.yaml `_fused_rms_norm`: input, weight, result1), where the CPU build of `F.rms_norm` is unfused; and
attention is `memory_models._FlashAttnFn` (what CUDA flash attention saves, with its (b, s, heads, d) output layout,
so `.transpose(1, 2).contiguous()` is no copy, as on a GPU) unless `sdpa=True` asks for the real
`F.scaled_dot_product_attention`, whose op a selective-checkpoint policy can see.

`op_sac_policy` is TorchTitan's per-op selective activation checkpointing policy as its source states it
(torchtitan/distributed/activation_checkpoint.py with the save list of each model's parallelize.py): save the
outputs of SDPA, reduce_scatter, all_to_all_single and max, and of every aten.mm except every second one counted in
the block (a per-block counter, one per forward and recompute pass); mm calls whose weight has the shape of a module
named in `per_op_sac_force_recompute_mm_shapes_by_fqns` (default: the MoE router gate) are recomputed and not
counted; everything else is recomputed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from projection.specs.model import ModelSpec
from tests.oracle.memory_models import _FlashAttnFn, _RMSNormFn


class RMSNorm(nn.Module):
    """The GPU kernel's saved set (`_RMSNormFn`), or with `composite` PyTorch's own F.rms_norm, whose CPU build is the
    composite chain CUDA ran before PyTorch 2.8 (KernelSpec.rms_norm_kernel 'composite')."""

    def __init__(self, width: int, composite: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.composite = composite

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.composite:
            return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-6)
        out: torch.Tensor = _RMSNormFn.apply(x, self.weight, 1e-6)
        return out


def _lin(n_in: int, n_out: int) -> nn.Linear:
    lin = nn.Linear(n_in, n_out, bias=False)
    nn.init.normal_(lin.weight, std=0.02)
    return lin


def _rope_table(d: int, seq: int) -> torch.Tensor:
    freqs = 1.0 / (10000.0 ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    ang = torch.outer(torch.arange(seq).float(), freqs)
    return torch.polar(torch.ones_like(ang), ang)  # complex64 (seq, d / 2)


def _rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """(b, s, heads, d) times the complex table, as TorchTitan's apply_rotary_emb does it."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * table[: x.shape[1]].view(1, x.shape[1], 1, -1)).flatten(3)
    return out.type_as(x)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    if n_rep == 1:
        return x
    b, s, g, d = x.shape
    return x.unsqueeze(3).expand(b, s, g, n_rep, d).reshape(b, s, g * n_rep, d)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, seq: int, sdpa: bool, composite: bool = False) -> None:
        super().__init__()
        h, self.heads, self.kv, self.d = spec.hidden_size, spec.num_attention_heads, spec.kv_heads, spec.head_dim_
        self.wq, self.wk, self.wv = _lin(h, self.heads * self.d), _lin(h, self.kv * self.d), _lin(h, self.kv * self.d)
        self.wo = _lin(self.heads * self.d, h)
        self.q_norm: nn.Module = RMSNorm(self.d, composite) if spec.qk_norm else nn.Identity()
        self.k_norm: nn.Module = RMSNorm(self.d, composite) if spec.qk_norm else nn.Identity()
        self.register_buffer("freqs_cis", _rope_table(self.d, seq), persistent=False)
        self.sdpa = sdpa

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, -1, self.d)
        xk = self.wk(x).view(b, s, -1, self.d)
        xv = self.wv(x).view(b, s, -1, self.d)
        xq, xk = _rotate(self.q_norm(xq), self.freqs_cis), _rotate(self.k_norm(xk), self.freqs_cis)
        rep = self.heads // self.kv
        q, k, v = xq.transpose(1, 2), _repeat_kv(xk, rep).transpose(1, 2), _repeat_kv(xv, rep).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True) if self.sdpa else _FlashAttnFn.apply(q, k, v)
        return self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, h: int, ffn: int) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = _lin(h, ffn), _lin(ffn, h), _lin(h, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return out


class MoE(nn.Module):
    """Token-choice top-k MoE with grouped-GEMM experts and one shared expert, balanced (each expert gets the same
    number of token copies: the scores still come from the gate, the choice is round-robin so the grouped GEMMs'
    group sizes are equal, as projection's balanced-routing inventory assumes)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        moe = spec.moe
        assert moe is not None
        h, f = spec.hidden_size, moe.expert_ffn_hidden_size
        self.experts, self.k = moe.num_experts, moe.top_k
        self.gate = _lin(h, self.experts)
        self.w1, self.w3 = (nn.Parameter(torch.randn(self.experts, h, f) * 0.02) for _ in range(2))
        self.w2 = nn.Parameter(torch.randn(self.experts, f, h) * 0.02)
        shared = moe.shared_expert_ffn_hidden_size
        self.shared = FeedForward(h, shared) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        x2 = x.view(-1, h)
        scores = F.softmax(self.gate(x2).float(), dim=-1)
        n = x2.shape[0]
        chosen = (torch.arange(n)[:, None] * self.k + torch.arange(self.k)[None, :]) % self.experts
        top = scores.gather(1, chosen)
        order = torch.argsort(chosen.view(-1), stable=True)
        routed = x2[order // self.k]
        offs = torch.cumsum(torch.bincount(chosen.view(-1), minlength=self.experts), 0).to(torch.int32)
        hid = F.silu(torch._grouped_mm(routed, self.w1, offs=offs)) * torch._grouped_mm(routed, self.w3, offs=offs)
        out_sorted = torch._grouped_mm(hid, self.w2, offs=offs)
        # TorchTitan's _unpermute: index_put into a new tensor (index_copy's backward would keep out_sorted alive)
        unsorted = out_sorted.new_empty(out_sorted.shape)
        unsorted[order] = out_sorted
        unsorted = unsorted.view(n, self.k, h)
        combined = torch.bmm(top.view(n, 1, self.k), unsorted.float()).to(x.dtype).view(n, h)
        if self.shared is not None:
            combined = combined + self.shared(x2)
        return combined.view(b, s, h)


class Block(nn.Module):
    """TorchTitan's TransformerBlock for decoder layer i of `spec` (dense FeedForward or MoE)."""

    def __init__(self, spec: ModelSpec, i: int, seq: int, sdpa: bool = False, composite: bool = False) -> None:
        super().__init__()
        h = spec.hidden_size
        self.attention_norm, self.ffn_norm = RMSNorm(h, composite), RMSNorm(h, composite)
        self.attention = Attention(spec, seq, sdpa, composite)
        self.feed_forward: nn.Module = MoE(spec) if spec.is_moe_layer(i) else FeedForward(h, spec.ffn_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        out: torch.Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


_SAVE_OPS = {
    torch.ops.aten.mm.default,
    # SDPA: TorchTitan lists the CUDA kernels (flash, efficient, cudnn, math, overrideable); the CPU flash kernel
    # stands in for them here
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.all_to_all_single.default,
    torch.ops.aten.max.default,
}


def op_sac_policy(force_recompute_shapes: set[tuple[int, ...]]) -> Callable[[], Any]:
    """A checkpoint `context_fn` applying TorchTitan's per-op policy (module docstring) with a fresh counter."""

    def context_fn() -> Any:
        count: dict[str, int] = defaultdict(int)

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            key = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                if tuple(args[1].shape) in force_recompute_shapes:
                    return CheckpointPolicy.PREFER_RECOMPUTE
                count[key] += 1
                if count[key] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE if func in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


class OpSacBlock(nn.Module):
    """`Block` under torch.utils.checkpoint with the per-op policy; the router gate's mm (weight (h, E) as the mm
    sees it) is force-recomputed, TorchTitan's default."""

    def __init__(self, spec: ModelSpec, i: int, seq: int) -> None:
        super().__init__()
        self.block = Block(spec, i, seq, sdpa=True)
        gate = getattr(self.block.feed_forward, "gate", None)
        shapes = {tuple(gate.weight.t().shape)} if gate is not None else set()
        self.context_fn = op_sac_policy(shapes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint(self.block, x, use_reentrant=False, context_fn=self.context_fn)
        return out
