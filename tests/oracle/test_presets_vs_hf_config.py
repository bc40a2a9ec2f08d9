"""The bundled model presets (`models/*.yaml`) against the models' own HF `config.json` files and published numbers.

Reads the preset YAML and the HF JSON directly (no project loader), reduces both to the same canonical fields and
compares them field by field, so a wrong preset value shows up with the preset name and the field.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "models"
FIXTURES = REPO.parent / "shared" / "fixtures"
HF_DIR = FIXTURES / "hf"

EXPECTED_PRESETS = {
    "llama2_7B", "llama2_13B", "llama2_70B",
    "llama3_8B", "llama3_70B",
    "llama3.1_8B", "llama3.1_70B", "llama3.1_405B",
    "mixtral_8x7B_v0.1", "mixtral_8x22B_v0.1",
    "deepseek_v2_lite", "deepseek_v2", "deepseek_v3",
    "qwen2.5_7B", "qwen2.5_72B",
    "qwen3_30B_A3B", "qwen3_235B_A22B",
    "gpt3_175B",
}

# preset name -> vendored HF config (file name under shared/fixtures/hf, without ".config.json")
PRESET_TO_HF = {
    "llama2_7B": "Llama-2-7b-hf",
    "llama3.1_8B": "Meta-Llama-3.1-8B",
    "mixtral_8x7B_v0.1": "Mixtral-8x7B-v0.1",
    "qwen2.5_7B": "Qwen2.5-7B-Instruct",  # same dimensions as the base Qwen2.5-7B
    "qwen3_30B_A3B": "Qwen3-30B-A3B",
    "deepseek_v3": "DeepSeek-V3",
}

# Fields where the vendored config legitimately differs from the preset: the Instruct config of Qwen2.5-7B says
# 32768 positions, the base model (which the preset describes) 131072.
KNOWN_DIFFERENCES = {("qwen2.5_7B", "max_positions")}

COMMON_KEYS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "group_query_attention",
    "num_query_groups", "kv_channels", "swiglu", "normalization", "add_bias_linear", "add_qkv_bias",
    "qk_layernorm", "position_embedding_type", "max_position_embeddings", "rotary_base",
    "untie_embeddings_and_output_weights", "norm_epsilon", "tokenizer_type", "tokenizer_model", "vocab_size",
    "num_experts", "multi_latent_attention", "mtp_num_layers",
)
MOE_KEYS = (
    "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_layer_freq",
)
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


# ---------------------------------------------------------------- readers


def _preset_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))


def _load_preset(name: str) -> dict[str, Any]:
    data = yaml.safe_load((MODELS_DIR / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{name}.yaml is not a YAML mapping"
    return data


def _load_hf(stem: str) -> dict[str, Any]:
    if not FIXTURES.is_dir():
        pytest.skip(f"shared fixtures not present at {FIXTURES}")
    path = HF_DIR / f"{stem}.config.json"
    if not path.is_file():
        pytest.skip(f"HF config fixture {path.name} not present in {HF_DIR}")
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def _eval_layer_list(text: str) -> list[int]:
    """Evaluate a Megatron moe_layer_freq list expression such as "([0]*3+[1]*58)" without eval()."""

    def ev(node: ast.AST) -> int | list[int]:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            items = [ev(e) for e in node.elts]
            if not all(isinstance(i, int) for i in items):
                raise ValueError(f"nested list in {text!r}")
            return items  # type: ignore[return-value]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = ev(node.left), ev(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right  # type: ignore[operator]
        raise ValueError(f"unsupported element {ast.dump(node)} in {text!r}")

    out = ev(ast.parse(text.strip(), mode="eval").body)
    if not isinstance(out, list):
        raise ValueError(f"{text!r} does not evaluate to a list")
    return out


def _preset_moe_pattern(p: dict[str, Any]) -> list[int]:
    n = p["num_layers"]
    if not p.get("num_experts"):
        return [0] * n
    freq = p["moe_layer_freq"]
    if isinstance(freq, str) and "[" in freq:
        return _eval_layer_list(freq)
    return [1 if i % int(freq) == 0 else 0 for i in range(n)]


def _hf_moe_pattern(c: dict[str, Any]) -> list[int]:
    n = c["num_hidden_layers"]
    mt = c["model_type"]
    if mt == "mixtral":
        return [1] * n
    if mt.startswith("deepseek"):
        k, step = c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
        return [1 if i >= k and i % step == 0 else 0 for i in range(n)]
    if c.get("num_experts"):  # Qwen-MoE family
        step, dense = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers", []))
        return [1 if i not in dense and (i + 1) % step == 0 else 0 for i in range(n)]
    return [0] * n


def _leading_dense(pattern: list[int]) -> int:
    return next((i for i, moe in enumerate(pattern) if moe), len(pattern)) if any(pattern) else 0


# ---------------------------------------------------------------- canonical views


def _canon_preset(p: dict[str, Any]) -> dict[str, Any]:
    mla = bool(p["multi_latent_attention"])
    moe = bool(p["num_experts"])
    pattern = _preset_moe_pattern(p)
    out: dict[str, Any] = {
        "layers": p["num_layers"],
        "hidden": p["hidden_size"],
        "ffn": p["ffn_hidden_size"],
        "heads": p["num_attention_heads"],
        "kv_heads": p["num_query_groups"] if p["group_query_attention"] else p["num_attention_heads"],
        "head_dim": None if mla else p["kv_channels"],
        "experts": p["num_experts"] or 0,
        "topk": p["moe_router_topk"] if moe else 0,
        "expert_ffn": p["moe_ffn_hidden_size"] if moe else 0,
        "shared_ffn": (p["moe_shared_expert_intermediate_size"] or 0) if moe else 0,
        "moe_pattern": pattern,
        "first_k_dense": _leading_dense(pattern),
        "mla": mla,
        "mtp": p["mtp_num_layers"] or 0,
        "rope_theta": float(p["rotary_base"]),
        "tied": not p["untie_embeddings_and_output_weights"],
        "norm_eps": float(p["norm_epsilon"]),
        "max_positions": p["max_position_embeddings"],
        "gated_silu": bool(p["swiglu"]),
        "rmsnorm": p["normalization"] == "RMSNorm",
        "rope": p["position_embedding_type"] == "rope",
        "linear_bias": bool(p["add_bias_linear"]),
        "qkv_bias": bool(p["add_qkv_bias"]) or bool(p["add_bias_linear"]),
        "qk_norm": bool(p["qk_layernorm"]),
        "rope_scaling_factor": None,
    }
    if mla:
        out |= {k: p[k] for k in MLA_KEYS}
        out["rope_scaling_factor"] = float(p["rotary_scaling_factor"])
        out["rope_original_max_positions"] = p["original_max_position_embeddings"]
    elif p.get("use_rope_scaling"):
        out["rope_scaling_factor"] = float(p["rope_scaling_factor"])
    return out


def _canon_hf(c: dict[str, Any]) -> dict[str, Any]:
    mt = c["model_type"]
    mla = "kv_lora_rank" in c
    heads = c["num_attention_heads"]
    experts = c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts") or 0
    # Mixtral's intermediate_size is the per-expert size; the others name it moe_intermediate_size.
    expert_ffn = c.get("moe_intermediate_size", c["intermediate_size"] if mt == "mixtral" else 0) if experts else 0
    if c.get("n_shared_experts"):
        shared = c["n_shared_experts"] * c["moe_intermediate_size"]
    else:
        shared = c.get("shared_expert_intermediate_size") or 0
    rope = c.get("rope_parameters") or {}
    theta = c.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = c.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default") else None)
    pattern = _hf_moe_pattern(c)
    out: dict[str, Any] = {
        "layers": c["num_hidden_layers"],
        "hidden": c["hidden_size"],
        "ffn": c["intermediate_size"],
        "heads": heads,
        "kv_heads": c.get("num_key_value_heads") or heads,
        "head_dim": None if mla else (c.get("head_dim") or c["hidden_size"] // heads),
        "experts": experts,
        "topk": c.get("num_experts_per_tok", 0) if experts else 0,
        "expert_ffn": expert_ffn,
        "shared_ffn": shared,
        "moe_pattern": pattern,
        "first_k_dense": _leading_dense(pattern),
        "mla": mla,
        "mtp": c.get("num_nextn_predict_layers", 0),
        "rope_theta": float(theta),
        "tied": bool(c.get("tie_word_embeddings", False)),
        "norm_eps": float(c["rms_norm_eps"]),
        "max_positions": c["max_position_embeddings"],
        "gated_silu": c.get("hidden_act", "silu") == "silu",
        "rmsnorm": True,  # every architecture in the fixtures uses RMSNorm
        "rope": True,
        "linear_bias": bool(c.get("mlp_bias", False)),
        # Qwen2 has Q/K/V biases with no config key saying so; the others follow attention_bias.
        "qkv_bias": mt == "qwen2" or bool(c.get("attention_bias", False)),
        # Qwen3 normalises Q and K per head; DeepSeek MLA normalises the compressed Q/KV latents (Megatron builds
        # those norms from qk_layernorm). Neither shows in a config key.
        "qk_norm": mt in ("qwen3", "qwen3_moe") or mla,
        "rope_scaling_factor": float(scaling["factor"]) if scaling else None,
    }
    if mla:
        out |= {
            "q_lora_rank": c.get("q_lora_rank"),
            "kv_lora_rank": c["kv_lora_rank"],
            "qk_head_dim": c["qk_nope_head_dim"],
            "qk_pos_emb_head_dim": c["qk_rope_head_dim"],
            "v_head_dim": c["v_head_dim"],
            "rope_original_max_positions": scaling["original_max_position_embeddings"] if scaling else None,
        }
    return out


def _diff(name: str, got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    return [
        f"{name}: {key} preset={got.get(key)!r} expected={want[key]!r}"
        for key in want
        if (name, key) not in KNOWN_DIFFERENCES and got.get(key) != want[key]
    ]


# ---------------------------------------------------------------- tests


def test_preset_set_is_complete() -> None:
    assert set(_preset_names()) == EXPECTED_PRESETS


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_parses_and_states_every_architecture_key(name: str) -> None:
    path = MODELS_DIR / f"{name}.yaml"
    assert path.is_file(), f"missing preset {path}"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), f"{name}.yaml must start with a comment header (model, sources, Primus differences)"
    p = _load_preset(name)
    assert "extends" not in p, f"{name}.yaml must be self-contained (no extends)"

    required = list(COMMON_KEYS)
    if p.get("num_experts"):
        required += MOE_KEYS
    if p.get("multi_latent_attention"):
        required += MLA_KEYS
    missing = [k for k in required if k not in p]
    assert not missing, f"{name}.yaml does not state {missing}"

    # Internal consistency of what was stated.
    assert p["num_attention_heads"] % (p["num_query_groups"] or 1) == 0, name
    assert p["normalization"] in ("RMSNorm", "LayerNorm"), name
    assert p["position_embedding_type"] in ("rope", "learned_absolute"), name
    assert isinstance(p["vocab_size"], int) and p["vocab_size"] > 0, name
    assert isinstance(p["tokenizer_model"], str) and "/" in p["tokenizer_model"], name
    if p["group_query_attention"]:
        assert p["num_query_groups"] < p["num_attention_heads"], name
    else:  # MHA (and MLA): stated as equal to the head count, so loaders that skip the GQA flag read it right
        assert p["num_query_groups"] == p["num_attention_heads"], name
    if p["multi_latent_attention"]:
        assert not p["group_query_attention"], f"{name}: MLA cannot be combined with GQA"
        assert p["kv_channels"] == p["v_head_dim"], name
    if p.get("num_experts"):
        pattern = _preset_moe_pattern(p)
        assert len(pattern) == p["num_layers"], f"{name}: moe_layer_freq covers {len(pattern)} layers"
        assert set(pattern) <= {0, 1} and any(pattern), name
        assert p["moe_router_topk"] <= p["num_experts"], name


def test_layer_list_parser() -> None:
    assert _eval_layer_list("([0]*3+[1]*58)") == [0] * 3 + [1] * 58
    assert _eval_layer_list("[0]+[1]*2") == [0, 1, 1]
    with pytest.raises(ValueError):
        _eval_layer_list("__import__('os')")


@pytest.mark.parametrize("name", sorted(PRESET_TO_HF))
def test_preset_matches_hf_config(name: str) -> None:
    hf = _load_hf(PRESET_TO_HF[name])
    p = _load_preset(name)
    problems = _diff(name, _canon_preset(p), _canon_hf(hf))
    # vocab_size is len(tokenizer); the HF vocab_size is the embedding rows, padded up by the model authors.
    if not hf["vocab_size"] - 1024 < p["vocab_size"] <= hf["vocab_size"]:
        problems.append(f"{name}: vocab_size {p['vocab_size']} not within 1024 below HF vocab_size {hf['vocab_size']}")
    assert not problems, "\n".join(problems)


# Published dimensions (HF config.json / model card / paper, as cited in each preset's header) for the presets
# with no vendored HF config.
PUBLISHED: dict[str, dict[str, Any]] = {
    "llama2_13B": dict(layers=40, hidden=5120, ffn=13824, heads=40, kv_heads=40, head_dim=128, rope_theta=1e4,
                       tied=False, max_positions=4096),
    "llama2_70B": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, head_dim=128, rope_theta=1e4,
                       tied=False, max_positions=4096),
    "llama3_8B": dict(layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, rope_theta=5e5,
                      tied=False, max_positions=8192, rope_scaling_factor=None),
    "llama3_70B": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, head_dim=128, rope_theta=5e5,
                       tied=False, max_positions=8192, rope_scaling_factor=None),
    "llama3.1_70B": dict(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, head_dim=128, rope_theta=5e5,
                         tied=False, max_positions=131072, rope_scaling_factor=8.0),
    "llama3.1_405B": dict(layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8, head_dim=128, rope_theta=5e5,
                          tied=False, max_positions=131072, rope_scaling_factor=8.0),
    "mixtral_8x22B_v0.1": dict(layers=56, hidden=6144, heads=48, kv_heads=8, head_dim=128, experts=8, topk=2,
                               expert_ffn=16384, shared_ffn=0, first_k_dense=0, rope_theta=1e6, tied=False),
    "deepseek_v2_lite": dict(layers=27, hidden=2048, ffn=10944, heads=16, experts=64, topk=6, expert_ffn=1408,
                             shared_ffn=2 * 1408, first_k_dense=1, q_lora_rank=None, kv_lora_rank=512,
                             qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, mtp=0, tied=False),
    "deepseek_v2": dict(layers=60, hidden=5120, ffn=12288, heads=128, experts=160, topk=6, expert_ffn=1536,
                        shared_ffn=2 * 1536, first_k_dense=1, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
                        qk_pos_emb_head_dim=64, v_head_dim=128, mtp=0, tied=False),
    "qwen2.5_72B": dict(layers=80, hidden=8192, ffn=29568, heads=64, kv_heads=8, head_dim=128, qkv_bias=True,
                        qk_norm=False, rope_theta=1e6, tied=False),
    "qwen3_235B_A22B": dict(layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, experts=128, topk=8,
                            expert_ffn=1536, shared_ffn=0, first_k_dense=0, qkv_bias=False, qk_norm=True,
                            rope_theta=1e6, tied=False),
    "gpt3_175B": dict(layers=96, hidden=12288, ffn=4 * 12288, heads=96, kv_heads=96, head_dim=128, gated_silu=False,
                      rmsnorm=False, rope=False, linear_bias=True, tied=True, max_positions=2048),
}
PUBLISHED_VOCAB = {
    "llama2_13B": 32000, "llama2_70B": 32000, "llama3_8B": 128256, "llama3_70B": 128256, "llama3.1_70B": 128256,
    "llama3.1_405B": 128256, "mixtral_8x22B_v0.1": 32768, "deepseek_v2_lite": 102400, "deepseek_v2": 102400,
    "qwen2.5_72B": 151665, "qwen3_235B_A22B": 151669, "gpt3_175B": 50257,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_matches_published_dimensions(name: str) -> None:
    p = _load_preset(name)
    problems = _diff(name, _canon_preset(p), PUBLISHED[name])
    if p["vocab_size"] != PUBLISHED_VOCAB[name]:
        problems.append(f"{name}: vocab_size {p['vocab_size']} expected {PUBLISHED_VOCAB[name]}")
    assert not problems, "\n".join(problems)


def test_every_preset_is_checked_against_a_source() -> None:
    assert set(PRESET_TO_HF) | set(PUBLISHED) == EXPECTED_PRESETS
