"""TorchTitan model flavors: the raw model-args tables of each train spec and their translation to canonical ModelSpec
fields.

The tables hold TorchTitan's own argument names (dim, n_layers, n_heads, n_kv_heads, ffn_dim_multiplier, multiple_of,
inter_dim, moe_inter_dim, hidden_dim ...), as data, for pytorch/torchtitan @v0.2.2 (73a0e69), the last release with TOML
train configs (shared/reference/config-formats.md §0, §3.3):
  llama3       torchtitan/models/llama3/__init__.py       (args class TransformerModelArgs)
  llama4       torchtitan/models/llama4/__init__.py       (TransformerModelArgs + MoEArgs)
  deepseek_v3  torchtitan/models/deepseek_v3/__init__.py  (DeepSeekV3ModelArgs + MoEArgs)
  qwen3        torchtitan/models/qwen3/__init__.py        (Qwen3ModelArgs + MoEArgs)
All sizes are element counts (not bytes). Vocabularies are the flavor's, with no padding (config-formats.md §8.2 #5).
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------------------------------- defaults
# Dataclass defaults of each args class (config-formats.md §3.3). A flavor entry overrides only what it sets.
_MOE_DEFAULTS: dict[str, Any] = {  # torchtitan/models/moe.py MoEArgs
    "num_experts": 8, "num_shared_experts": 1, "top_k": 1, "score_func": "sigmoid", "route_norm": False,
    "route_scale": 1.0,
}
_LLAMA3_DEFAULTS: dict[str, Any] = {
    "dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": None, "vocab_size": 128256, "multiple_of": 256,
    "ffn_dim_multiplier": None, "norm_eps": 1e-5, "rope_theta": 10000.0,
}
_LLAMA4_DEFAULTS: dict[str, Any] = {
    **_LLAMA3_DEFAULTS, "vocab_size": 202048, "interleave_moe_layer_step": 2, "auto_scale_hidden_dim": True,
    "moe_args": _MOE_DEFAULTS,
}
_DEEPSEEK_DEFAULTS: dict[str, Any] = {
    "vocab_size": 102400, "dim": 2048, "inter_dim": 10944, "moe_inter_dim": 1408, "n_layers": 27,
    "n_dense_layers": 1, "n_heads": 16, "norm_eps": 1e-5, "q_lora_rank": 0, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 10000.0,
    "moe_args": _MOE_DEFAULTS,
}
_QWEN3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "norm_eps": 1e-6, "rope_theta": 1e6, "qk_norm": True, "enable_weight_tying": False,
    "moe_enabled": False, "moe_inter_dim": 768, "moe_args": _MOE_DEFAULTS,
}

# ---------------------------------------------------------------------------------------------------- flavors
_LLAMA3: dict[str, dict[str, Any]] = {
    "debugmodel": {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048, "rope_theta": 500000.0},
    "8B": {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
           "multiple_of": 1024, "rope_theta": 500000.0},
    "70B": {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "ffn_dim_multiplier": 1.3,
            "multiple_of": 4096, "rope_theta": 500000.0},
    "405B": {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
             "multiple_of": 4096, "rope_theta": 500000.0},
}
_LLAMA4: dict[str, dict[str, Any]] = {
    "debugmodel": {"dim": 256, "n_layers": 6, "n_heads": 16, "vocab_size": 2048, "rope_theta": 500000.0},
    "17bx16e": {"dim": 5120, "n_layers": 48, "n_heads": 40, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
                "multiple_of": 2048, "rope_theta": 500000.0, "interleave_moe_layer_step": 1,
                "moe_args": {**_MOE_DEFAULTS, "num_experts": 16}},
    "17bx128e": {"dim": 5120, "n_layers": 48, "n_heads": 40, "n_kv_heads": 8, "ffn_dim_multiplier": 1.2,
                 "multiple_of": 2048, "rope_theta": 500000.0, "moe_args": {**_MOE_DEFAULTS, "num_experts": 128}},
}
_DEEPSEEK_V3: dict[str, dict[str, Any]] = {
    "debugmodel": {"vocab_size": 2048, "dim": 256, "inter_dim": 1024, "moe_inter_dim": 256, "n_layers": 6,
                   "n_dense_layers": 1, "n_heads": 16,
                   "moe_args": {**_MOE_DEFAULTS, "num_experts": 8, "num_shared_experts": 2, "top_k": 3,
                                "score_func": "softmax"}},
    "16B": {"vocab_size": 102400, "dim": 2048, "inter_dim": 10944, "moe_inter_dim": 1408, "n_layers": 27,
            "n_dense_layers": 1, "n_heads": 16,
            "moe_args": {**_MOE_DEFAULTS, "num_experts": 64, "num_shared_experts": 2, "top_k": 6,
                         "score_func": "softmax"}},
    "236B": {"vocab_size": 102400, "dim": 5120, "inter_dim": 12288, "moe_inter_dim": 1536, "n_layers": 60,
             "n_dense_layers": 1, "n_heads": 128, "q_lora_rank": 1536,
             "moe_args": {**_MOE_DEFAULTS, "num_experts": 160, "num_shared_experts": 2, "top_k": 6,
                          "score_func": "softmax", "route_scale": 16.0}},
    "671B": {"vocab_size": 129280, "dim": 7168, "inter_dim": 18432, "moe_inter_dim": 2048, "n_layers": 61,
             "n_dense_layers": 3, "n_heads": 128, "q_lora_rank": 1536,
             "moe_args": {**_MOE_DEFAULTS, "num_experts": 256, "num_shared_experts": 1, "top_k": 8,
                          "score_func": "sigmoid", "route_norm": True, "route_scale": 2.5}},
}
_QWEN3_MOE = {**_MOE_DEFAULTS, "num_experts": 128, "num_shared_experts": 0, "top_k": 8, "score_func": "softmax",
              "route_norm": True}
_QWEN3: dict[str, dict[str, Any]] = {
    "debugmodel": {"vocab_size": 2048, "head_dim": 128, "dim": 256, "n_layers": 8, "n_heads": 16, "n_kv_heads": 8,
                   "hidden_dim": 3072, "enable_weight_tying": True},
    "debugmodel_moe": {"vocab_size": 2048, "head_dim": 128, "dim": 256, "n_layers": 8, "n_heads": 16,
                       "n_kv_heads": 8, "hidden_dim": 3072, "moe_enabled": True, "moe_inter_dim": 768,
                       "moe_args": {**_QWEN3_MOE, "num_experts": 64}},
    "0.6B": {"head_dim": 128, "dim": 1024, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8, "hidden_dim": 3072,
             "enable_weight_tying": True},
    "1.7B": {"head_dim": 128, "dim": 2048, "n_layers": 28, "n_heads": 16, "n_kv_heads": 8, "hidden_dim": 6144,
             "enable_weight_tying": True},
    "4B": {"head_dim": 128, "dim": 2560, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8, "hidden_dim": 9728,
           "enable_weight_tying": True},
    "8B": {"head_dim": 128, "dim": 4096, "n_layers": 36, "n_heads": 32, "n_kv_heads": 8, "hidden_dim": 12288},
    "14B": {"head_dim": 128, "dim": 5120, "n_layers": 40, "n_heads": 40, "n_kv_heads": 8, "hidden_dim": 17408},
    "32B": {"head_dim": 128, "dim": 5120, "n_layers": 64, "n_heads": 64, "n_kv_heads": 8, "hidden_dim": 25600},
    "30B-A3B": {"head_dim": 128, "dim": 2048, "n_layers": 48, "n_heads": 32, "n_kv_heads": 4, "hidden_dim": 6144,
                "moe_enabled": True, "moe_inter_dim": 768, "moe_args": _QWEN3_MOE},
    "235B-A22B": {"head_dim": 128, "dim": 4096, "n_layers": 94, "n_heads": 64, "n_kv_heads": 4, "hidden_dim": 12288,
                  "rope_theta": 5e6, "moe_enabled": True, "moe_inter_dim": 1536, "moe_args": _QWEN3_MOE},
}

_TABLES: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]]] = {
    "llama3": (_LLAMA3_DEFAULTS, _LLAMA3),
    "llama4": (_LLAMA4_DEFAULTS, _LLAMA4),
    "deepseek_v3": (_DEEPSEEK_DEFAULTS, _DEEPSEEK_V3),
    "qwen3": (_QWEN3_DEFAULTS, _QWEN3),
}
# Flavors that differ from a base flavor only in the attention kernel/mask (flex, varlen) or in iRoPE's NoPE layers
# and chunked attention, none of which changes parameter or activation shapes (config-formats.md §3.3).
_VARIANTS: dict[str, dict[str, str]] = {
    "llama3": {"debugmodel_flex_attn": "debugmodel", "debugmodel_varlen_attn": "debugmodel", "8B_flex": "8B",
               "8B_varlen": "8B"},
    "llama4": {"debugmodel_irope": "debugmodel", "17bx16e_irope": "17bx16e", "17bx128e_irope": "17bx128e"},
    "deepseek_v3": {"debugmodel_flex_attn": "debugmodel"},
    "qwen3": {},
}
# Train specs whose `pipelining_fn` is None in v0.2.2: PP is refused (config-formats.md §3.3, trap §8.2 #12).
NO_PIPELINE_MODELS = frozenset({"qwen3"})


class FlavorError(LookupError):
    """An unknown model name or flavor; `known` lists the valid choices."""

    def __init__(self, message: str, known: list[str]):
        super().__init__(message)
        self.known = known


def known_models() -> list[str]:
    """Train-spec names with a flavor table here."""
    return sorted(_TABLES)


def known_flavors(model: str) -> list[str]:
    """Flavor names of `model`, variants included, in table order. Raises FlavorError for an unknown model."""
    if model not in _TABLES:
        raise FlavorError(f"unknown TorchTitan model name {model!r}", known_models())
    return [*_TABLES[model][1], *_VARIANTS[model]]


def flavor_args(model: str, flavor: str) -> dict[str, Any]:
    """The raw TorchTitan model args of (model, flavor): class defaults updated with the flavor's entries."""
    if model not in _TABLES:
        raise FlavorError(f"unknown TorchTitan model name {model!r}", known_models())
    defaults, table = _TABLES[model]
    base = _VARIANTS[model].get(flavor, flavor)
    if base not in table:
        raise FlavorError(f"unknown flavor {flavor!r} for TorchTitan model {model!r}", known_flavors(model))
    args = {**defaults, **table[base]}
    args["moe_args"] = {**_MOE_DEFAULTS, **(args.get("moe_args") or {})}
    return args


# ---------------------------------------------------------------------------------------------------- FFN sizes
def llama_ffn_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None) -> int:
    """Dense SwiGLU inner size of llama3/llama4 FeedForward, per branch (elements).

    From hidden = 4*dim: truncate 2*hidden/3, truncate ffn_dim_multiplier*hidden, round UP to multiple_of
    (torchtitan llama3/model/model.py FeedForward; config-formats.md §3.3 and trap §8.2 #2).
    Worked: 8B 16384 -> 10922 -> 14198 -> 14336."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


def llama4_expert_hidden_dim(dim: int, multiple_of: int, ffn_dim_multiplier: float | None, top_k: int,
                             num_shared_experts: int, auto_scale: bool = True) -> int:
    """Llama-4 routed (and shared) expert inner size, per branch (elements).

    Same truncations as the dense FFN, then (auto_scale_hidden_dim) truncate hidden / (top_k + num_shared_experts)
    BEFORE rounding up to multiple_of (torchtitan llama4 MoE; config-formats.md §3.3). Scout: 8191 -> 8192."""
    hidden = int(2 * (4 * dim) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    if auto_scale:
        hidden = int(hidden / (top_k + num_shared_experts))
    return multiple_of * -(-hidden // multiple_of)


# ---------------------------------------------------------------------------------------------------- canonical
def model_fields(model: str, flavor: str) -> dict[str, Any]:
    """Canonical ModelSpec fields (nested dict, `moe`/`mla` as sub-dicts) of a TorchTitan (model, flavor).

    Common to all: RMSNorm, SwiGLU (silu, gated), RoPE, no biases, vocab = flavor vocab_size unpadded
    (vocab_divisible_by 1), untied embeddings except qwen3 enable_weight_tying (config-formats.md §3.3, §7)."""
    a = flavor_args(model, flavor)
    out: dict[str, Any] = {
        "name": f"{model}/{flavor}", "num_layers": a["n_layers"], "hidden_size": a["dim"],
        "num_attention_heads": a["n_heads"], "gated_mlp": True, "activation": "silu", "vocab_size": a["vocab_size"],
        "vocab_divisible_by": 1, "vocab_pad_with_tp": False, "tie_embeddings": bool(a.get("enable_weight_tying")),
        "norm": "rmsnorm", "add_bias_linear": False, "add_qkv_bias": False, "qk_norm": bool(a.get("qk_norm")),
        "position_embedding": "rope", "rope_theta": float(a["rope_theta"]), "mtp_num_layers": 0,
    }
    moe = a["moe_args"]
    if model in ("llama3", "llama4"):
        # n_kv_heads None -> n_heads (MHA); head dim = dim / n_heads.
        out["num_kv_heads"] = a["n_kv_heads"] or a["n_heads"]
        out["ffn_hidden_size"] = llama_ffn_hidden_dim(a["dim"], a["multiple_of"], a["ffn_dim_multiplier"])
        if model == "llama4":
            expert = llama4_expert_hidden_dim(a["dim"], a["multiple_of"], a["ffn_dim_multiplier"], moe["top_k"],
                                              moe["num_shared_experts"], a["auto_scale_hidden_dim"])
            # Layer i is MoE iff (i + 1) % interleave_moe_layer_step == 0; the shared expert has the expert size.
            out["moe"] = _moe(moe, expert, layer_freq=a["interleave_moe_layer_step"], convention="plus_one")
    elif model == "deepseek_v3":
        out["ffn_hidden_size"] = a["inter_dim"]
        out["qk_norm"] = True  # deepseek_v3/model.py Attention: q_norm (with q_lora) and kv_norm RMSNorms always
        out["mla"] = {"q_lora_rank": a["q_lora_rank"], "kv_lora_rank": a["kv_lora_rank"],
                      "qk_head_dim": a["qk_nope_head_dim"], "qk_rope_head_dim": a["qk_rope_head_dim"],
                      "v_head_dim": a["v_head_dim"]}
        # Layers with index < n_dense_layers are dense (inter_dim); the rest MoE with moe_inter_dim experts.
        out["moe"] = _moe(moe, a["moe_inter_dim"], first_k_dense=a["n_dense_layers"])
    else:  # qwen3: explicit head_dim and hidden_dim, taken verbatim (no multiple_of rounding).
        out["num_kv_heads"] = a["n_kv_heads"]
        out["head_dim"] = a["head_dim"]
        out["ffn_hidden_size"] = a["hidden_dim"]
        if a["moe_enabled"]:  # every layer is MoE (no decoder_sparse_step in torchtitan qwen3)
            out["moe"] = _moe(moe, a["moe_inter_dim"])
    return out


def _moe(moe: dict[str, Any], expert_hidden: int, *, layer_freq: int = 1, convention: str = "megatron",
         first_k_dense: int = 0) -> dict[str, Any]:
    """Canonical MoESpec fields. The shared-expert size is the total over all shared experts (Megatron meaning):
    torchtitan builds one shared FFN of expert_hidden * num_shared_experts."""
    shared = moe["num_shared_experts"]
    return {"num_experts": moe["num_experts"], "top_k": moe["top_k"], "expert_ffn_hidden_size": expert_hidden,
            "shared_expert_ffn_hidden_size": expert_hidden * shared, "num_shared_experts": shared,
            "first_k_dense": first_k_dense, "layer_freq": layer_freq, "freq_convention": convention}
