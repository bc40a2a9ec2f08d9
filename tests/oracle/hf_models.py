"""Test helpers: build HuggingFace `transformers` models on the meta device and count / shard their parameters
independently of projection's formulas (by parameter name and shape)."""

from __future__ import annotations

import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from projection.specs.model import ModelSpec  # noqa: E402


def hf_config_for(model: ModelSpec, vocab: int | None = None, num_layers: int | None = None) -> Any:
    """A transformers config describing the same architecture as `model` (test-side mapping)."""
    layers = num_layers or model.num_layers
    common: dict[str, Any] = dict(hidden_size=model.hidden_size, num_hidden_layers=layers,
                                  num_attention_heads=model.num_attention_heads, vocab_size=vocab or model.vocab_size,
                                  tie_word_embeddings=model.tie_embeddings, intermediate_size=model.ffn_hidden_size)
    if model.norm == "layernorm":  # GPT-style: LayerNorm, biases, learned positions, plain GELU MLP
        assert not model.gated_mlp and model.add_bias_linear and model.position_embedding == "learned"
        return transformers.GPT2Config(n_embd=model.hidden_size, n_layer=layers, n_head=model.num_attention_heads,
                                       n_positions=model.max_position_embeddings, vocab_size=vocab or model.vocab_size,
                                       n_inner=model.ffn_hidden_size, tie_word_embeddings=model.tie_embeddings)
    if model.mla is not None:
        m, moe = model.mla, model.moe
        assert moe is not None
        return transformers.DeepseekV3Config(
            **common, q_lora_rank=m.q_lora_rank or None, kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_head_dim,
            qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim, n_routed_experts=moe.num_experts,
            num_experts_per_tok=moe.top_k, moe_intermediate_size=moe.expert_ffn_hidden_size,
            n_shared_experts=moe.shared_expert_ffn_hidden_size // moe.expert_ffn_hidden_size,
            first_k_dense_replace=moe.first_k_dense, num_key_value_heads=model.num_attention_heads,
            n_group=1, topk_group=1)
    kv = dict(num_key_value_heads=model.kv_heads, head_dim=model.head_dim_)
    if model.moe is not None:
        moe = model.moe
        if model.qk_norm:
            return transformers.Qwen3MoeConfig(**common, **kv, num_experts=moe.num_experts,
                                               num_experts_per_tok=moe.top_k,
                                               moe_intermediate_size=moe.expert_ffn_hidden_size)
        assert moe.shared_expert_ffn_hidden_size == 0
        cfg = {**common, "intermediate_size": moe.expert_ffn_hidden_size}
        return transformers.MixtralConfig(**cfg, **kv, num_local_experts=moe.num_experts,
                                          num_experts_per_tok=moe.top_k)
    if model.qk_norm:
        return transformers.Qwen3Config(**common, **kv)
    if model.add_qkv_bias:
        assert model.head_dim_ * model.num_attention_heads == model.hidden_size
        return transformers.Qwen2Config(**common, num_key_value_heads=model.kv_heads)
    return transformers.LlamaConfig(**common, **kv)


def meta_model(config: Any) -> Any:
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def count(module: Any) -> int:
    """PyTorch's own count: parameters, shared ones (tied embeddings) once."""
    return sum(p.numel() for p in module.parameters())


# Tensor-parallel placement by HF parameter name (Megatron-core convention, re-derived here by name):
_COLUMN = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj|q_b_proj|kv_b_proj|w1|w3|c_attn|c_fc"
                     r"|gate_up_proj)\.(weight|bias)$|\.experts\.(gate_up_proj)$")
_ROW = re.compile(r"\.(o_proj|down_proj|w2|c_proj)\.weight$|\.experts\.down_proj$")
_LAYER = re.compile(r"\.(layers|h)\.(\d+)\.")


def sharded_count_by_layer(model: Any, tp: int, ep: int, etp: int) -> tuple[dict[int, int], int, int, int]:
    """(per-layer params on one rank, embedding, final norm, lm_head) after TP/EP/ETP sharding, by name.

    Vocabulary rows are split over tp (the caller pads the vocab); norms, routers, MLA down projections and
    position tables are replicated; expert tensors hold num_experts/ep experts split over etp.
    """
    per_layer: dict[int, int] = {}
    emb = norm = head = 0
    named = dict(model.named_parameters(remove_duplicate=False))
    for name, p in named.items():
        n = p.numel()
        is_expert = ".experts." in name
        shard = etp if is_expert else tp
        if is_expert:
            n //= ep  # experts are stacked (3-D) or one module per expert: either way 1/ep of them per rank
        if _COLUMN.search(name) or _ROW.search(name):
            n //= shard  # row-parallel biases (o_proj/down_proj/c_proj .bias) do not match: replicated
        m = _LAYER.search(name)
        if m:
            i = int(m.group(2))
            per_layer[i] = per_layer.get(i, 0) + n
        elif "embed_tokens" in name or name.endswith("wte.weight"):
            emb += n // tp
        elif name.endswith("wpe.weight"):
            emb += n
        elif "lm_head" in name:
            head += n // tp
        else:
            norm += n
    return per_layer, emb, norm, head
