"""Model FLOPs of one training step, Megatron-LM's convention, for MFU.

Megatron-LM `num_floating_point_operations` (megatron/training/training.py), after Narayanan et al. 2021, appendix
"Floating-point operations": every GEMM runs three times (forward, input gradient, weight gradient) at 2 FLOP per
multiply-accumulate, so model FLOPs = 6 * B * s * (forward multiply-accumulates per token), summed over
- attention: Q/O projections h * a*d each, K/V projections h * g*d each (g KV heads), and the scores and the
  weighted values, s * a*d each (MLA: the down/up projections of Megatron's MLA branch);
- MLP: (branches + 1) * h * ffn (branches = 2 for a gated MLP, Megatron's 3/2 multiplier); MoE layers count top_k
  routed experts plus the shared experts (the router GEMM is not counted);
- logits: V_padded * h; each MTP depth adds one more layer, its eh_proj (2h * h) and logits.
Recompute is never counted (that would be hardware FLOPs). For GPT (MHA, plain FFN = 4h) this is exactly
F72 = 72 * B * s * l * h^2 * (1 + s/(6h) + V/(12 l h)) of validation-public.md §0.2 (Korthikanti et al. 2022).

`causal=False` (default) counts attention over the full s x s matrix, as the published MFU tables of Narayanan 2021,
Korthikanti 2022 and the Megatron-LM README do; `causal=True` halves the two attention-score terms, as Megatron-LM
does since 2025 ("only half of the attention matrix is non-zero").
"""

from __future__ import annotations

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec


def model_flops_per_step(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, *,
                         causal: bool = False) -> float:
    """Model FLOPs of one optimizer step over the global batch (all ranks together). `plan.dp` must be resolved."""
    s = training.seq_length
    tokens = training.resolved_global_batch(plan.dp_()) * s
    h = model.hidden_size
    logits = model.padded_vocab(plan.tp) * h
    macs = sum(layer_macs_per_token(model, i, s, causal) for i in range(model.num_layers)) + logits
    macs += model.mtp_num_layers * (layer_macs_per_token(model, model.num_layers - 1, s, causal) + 2 * h * h + logits)
    return 6.0 * tokens * macs


def layer_macs_per_token(model: ModelSpec, layer_index: int, seq_length: int, causal: bool = False) -> float:
    """Forward multiply-accumulates per token of decoder layer `layer_index` (attention + MLP or MoE)."""
    h, a = model.hidden_size, model.num_attention_heads
    s = model.keys_per_query(layer_index, seq_length, causal)  # keys per query (a sliding window bounds it)
    mla = model.mla
    if mla is not None:
        dq = mla.qk_head_dim + mla.qk_rope_head_dim
        q = mla.q_lora_rank * (h + a * dq) if mla.q_lora_rank else h * a * dq
        kv = mla.kv_lora_rank * (h + a * (mla.qk_head_dim + mla.v_head_dim)) + h * mla.qk_rope_head_dim
        attn = q + kv + a * mla.v_head_dim * h + s * a * (dq + mla.v_head_dim)
    else:
        d, g = model.head_dim_, model.kv_heads
        attn = 2 * h * a * d + 2 * h * g * d + 2 * s * a * d
    per_branch = 3 if model.gated_mlp else 2
    moe = model.moe
    if moe is not None and model.is_moe_layer(layer_index):
        mlp = per_branch * h * (moe.top_k * moe.expert_ffn_hidden_size + moe.shared_expert_ffn_hidden_size)
    else:
        mlp = per_branch * h * model.ffn_hidden_size
    return attn + mlp
