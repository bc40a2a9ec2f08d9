"""ModelSpec: the architecture of a decoder-only transformer, independent of any framework's config format.

Sizes are counts (not bytes). `ffn_hidden_size` is the inner size per branch (with a gated MLP the first linear
outputs 2 x ffn: gate and up), the same meaning as Megatron's `--ffn-hidden-size` and HF's `intermediate_size`.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, ValidationInfo, model_validator

from projection.specs.base import Spec


class MLASpec(Spec):
    """Multi-latent attention (DeepSeek-V2/V3). q_lora_rank 0 means a direct h -> heads*(qk+rope) Q projection."""

    q_lora_rank: int = Field(0, ge=0)
    kv_lora_rank: int = Field(512, gt=0)
    qk_head_dim: int = Field(128, gt=0, description="'nope' part of each Q/K head")
    qk_rope_head_dim: int = Field(64, ge=0, description="rotary part; the K rope part is shared by all heads")
    v_head_dim: int = Field(128, gt=0)


class MoESpec(Spec):
    """Mixture of experts. Which layers are MoE: `layer_pattern` if given (one 0/1 per layer), else layers with index
    >= first_k_dense whose index satisfies the `layer_freq` rule in `freq_convention` form."""

    num_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    expert_ffn_hidden_size: int = Field(gt=0, description="per routed expert, per branch")
    shared_expert_ffn_hidden_size: int = Field(0, ge=0, description="total over all shared experts (Megatron)")
    num_shared_experts: int = Field(0, ge=0, description="informative; the size above is the total")
    shared_expert_gate: bool = False
    first_k_dense: int = Field(0, ge=0)
    layer_freq: int = Field(1, gt=0)
    freq_convention: Literal["megatron", "plus_one"] = Field(
        "megatron", description="megatron: layer i is MoE iff i % freq == 0; plus_one (HF Qwen-MoE, Llama-4): "
        "iff (i + 1) % freq == 0")
    layer_pattern: tuple[int, ...] | None = None
    router_bias: bool = Field(False, description="a learned bias on the router linear (rare)")
    capacity_factor: float | None = Field(None, gt=0, description="Megatron --moe-expert-capacity-factor: an expert "
                                          "takes at most ceil(k T / E x factor) of the k T token copies a rank routes "
                                          "(T tokens); None = dropless")
    pad_to_capacity: bool = Field(False, description="--moe-pad-expert-input-to-capacity: every expert's input is "
                                  "padded to the capacity (needs capacity_factor)")

    def routed_copies(self, tokens: float) -> float:
        """Token copies one rank sends to the experts when it routes `tokens` tokens, with balanced routing: k T
        dropless; with a capacity factor, E times the capacity C = ceil(k T / E x factor) (Megatron
        moe_utils.get_capacity with num_tokens = T k) when padded, else E min(k T / E, C): balanced routing fills
        every expert alike, so only what exceeds C is dropped (factor < 1)."""
        copies = self.top_k * tokens
        if self.capacity_factor is None:
            return copies
        full = self.num_experts * math.ceil(copies / self.num_experts * self.capacity_factor)
        return full if self.pad_to_capacity else min(copies, full)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) is larger than num_experts ({self.num_experts})")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs capacity_factor (Megatron: --moe-pad-expert-input-to-capacity "
                             "with --moe-expert-capacity-factor)")
        if self.layer_pattern is not None and any(v not in (0, 1) for v in self.layer_pattern):
            raise ValueError("layer_pattern entries must be 0 (dense) or 1 (MoE)")
        return self


def keys_per_query(seq: int, window: int | None, causal: bool) -> float:
    """Keys a query attends to, averaged over a sequence of `seq`: causal, the lower triangle's s/2 (Megatron's
    halving), or with a window w the band's (w s - w (w-1)/2) / s; in the non-causal count of the published MFU
    tables, s, or min(s, w) with a window."""
    if window is None or window >= seq:
        return seq / 2 if causal else float(seq)
    return (window * seq - window * (window - 1) / 2) / seq if causal else float(window)


class ModelSpec(Spec):
    """A decoder-only transformer LM. Only architecture: no batch, precision or parallelism."""

    name: str = "model"
    num_layers: int = Field(gt=0, le=10_000, description="decoder layers, MTP layers not included (at most 10,000: "
                            "the deepest published models have under 200, and a projection's time grows with them)")
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int | None = Field(None, gt=0, description="None = MHA (kv heads = heads)")
    head_dim: int | None = Field(None, gt=0, description="None = hidden / heads")
    mla: MLASpec | None = None
    ffn_hidden_size: int = Field(gt=0)
    gated_mlp: bool = True
    activation: Literal["silu", "gelu", "relu", "squared_relu", "quick_gelu"] = "silu"
    moe: MoESpec | None = None
    mtp_num_layers: int = Field(0, ge=0)
    vocab_size: int = Field(gt=0, description="tokenizer vocabulary before padding")
    vocab_divisible_by: int = Field(1, gt=0, description="padded vocab is a multiple of this (times TP if "
                                    "vocab_pad_with_tp)")
    vocab_pad_with_tp: bool = Field(False, description="Megatron: pad to a multiple of divisor * TP")
    tie_embeddings: bool = False
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    qk_norm: bool = Field(False, description="per-head Q/K norms; with MLA the RMSNorms on the q and kv latents")
    position_embedding: Literal["rope", "learned", "none"] = "rope"
    sliding_window: int | None = Field(None, gt=0, description="keys a query attends to at most, itself included "
                                       "(HF sliding_window: Mistral; Qwen2/3 with use_sliding_window); None: all "
                                       "earlier keys")
    sliding_window_from_layer: int = Field(0, ge=0, description="first decoder layer (0-based) that uses the window "
                                           "(HF max_window_layers); earlier layers attend fully")
    max_position_embeddings: int | None = Field(None, gt=0)
    rope_theta: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> ModelSpec:
        if info.context and info.context.get("skip_cross_checks"):
            return self  # build_scenario: the layout checked against a model whose own checks already failed
        problems = []
        if self.mla is None and self.head_dim is None and self.hidden_size % self.num_attention_heads:
            problems.append(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                            f"{self.num_attention_heads}, and no head dimension is given (head_dim, Megatron's "
                            "--kv-channels)")
        kv = self.kv_heads
        if self.mla is None and self.num_attention_heads % kv:
            problems.append(f"num_attention_heads {self.num_attention_heads} is not a multiple of num_kv_heads {kv}")
        if self.position_embedding == "learned" and not self.max_position_embeddings:
            problems.append("learned position embeddings need max_position_embeddings")
        if self.moe and self.moe.layer_pattern is not None and len(self.moe.layer_pattern) != self.num_layers:
            problems.append(f"moe.layer_pattern has {len(self.moe.layer_pattern)} entries, expected num_layers "
                            f"= {self.num_layers}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ---- derived quantities (pure, cheap) ----
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim_(self) -> int:
        """Per-head Q/K/V width for MHA/GQA (Megatron kv_channels)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def attention_kind(self) -> Literal["mha", "gqa", "mqa", "mla"]:
        if self.mla is not None:
            return "mla"
        if self.kv_heads == self.num_attention_heads:
            return "mha"
        return "mqa" if self.kv_heads == 1 else "gqa"

    def padded_vocab(self, tp: int = 1) -> int:
        """Embedding rows. Megatron: ceil(V / (d * tp)) * d * tp (_vocab_size_with_padding in
        megatron/training/tokenizer)."""
        multiple = self.vocab_divisible_by * (tp if self.vocab_pad_with_tp else 1)
        return math.ceil(self.vocab_size / multiple) * multiple

    def window_of(self, i: int) -> int | None:
        """The sliding window of decoder layer i (None: it attends to every earlier key)."""
        return self.sliding_window if i >= self.sliding_window_from_layer else None

    def keys_per_query(self, i: int, seq: int, causal: bool) -> float:
        """Keys one query of decoder layer i attends to, averaged over a sequence of `seq` (keys_per_query)."""
        return keys_per_query(seq, self.window_of(i), causal)

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer i (0-based) has an MoE block instead of a dense MLP."""
        moe = self.moe
        if moe is None:
            return False
        if moe.layer_pattern is not None:
            return bool(moe.layer_pattern[i])
        if i < moe.first_k_dense:
            return False
        if moe.freq_convention == "plus_one":
            return (i + 1) % moe.layer_freq == 0
        return i % moe.layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))
