"""HuggingFace `config.json` -> canonical model fields (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE,
DeepSeek-V2/V3). The file describes only the architecture; training, plan and cluster come from flags (`--set`) or a
native scenario YAML that points at the file.

Key meanings: config-formats.md §5 (transformers configuration_*.py). Architectural implicits that no key states:
Qwen2 has Q/K/V biases; Qwen3 has per-head Q/K RMSNorm; DeepSeek MLA has RMSNorms on the q and kv latents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from projection.errors import COMMAND_LINE, ConfigError, Problem, shown
from projection.formats.common import load_json
from projection.specs.scenario import Origin, RawScenario

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3")


def is_hf_config(data: Any) -> bool:
    return isinstance(data, dict) and ("model_type" in data or "architectures" in data) and \
        ("hidden_size" in data or "text_config" in data)


def hf_model_fields(cfg: dict[str, Any], file: str, lines: dict[tuple[str, ...], int]) -> list[tuple[str, Any, Origin]]:
    """(canonical key, value, origin) for every model field the config determines."""
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        raise ConfigError(Problem(f"model_type {mt!r} is not supported", key="model_type", file=file,
                                  line=lines.get(("model_type",)),
                                  fix=f"use one of {', '.join(SUPPORTED)}, or describe the model inline in a "
                                      "scenario YAML"))
    typed = _type_problems(cfg, mt, file, lines)
    if typed:
        raise ConfigError(typed)
    out: list[tuple[str, Any, Origin]] = []
    missing: list[Problem] = []

    def o(key: str) -> Origin:
        return Origin(file, lines.get((key,)), key)

    def take(canon: str, key: str, default: Any = ..., conv: Any = None) -> Any:
        if key in cfg and cfg[key] is not None:
            v = cfg[key]
            origin = o(key)
        elif default is ...:
            missing.append(Problem("required key is missing", key=key, file=file, fix=f"add \"{key}\" to the file"))
            return None
        else:
            v, origin = default, Origin(f"default (transformers {mt} config)", None, key)
        v = conv(v) if conv else v
        out.append((canon, v, origin))
        return v

    take("model.name", "_name_or_path", mt)
    layers = take("model.num_layers", "num_hidden_layers")
    take("model.hidden_size", "hidden_size")
    heads = take("model.num_attention_heads", "num_attention_heads")
    take("model.ffn_hidden_size", "intermediate_size")
    take("model.vocab_size", "vocab_size")
    take("model.max_position_embeddings", "max_position_embeddings", None)
    rope = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta"))
    out.append(("model.rope_theta", float(rope) if rope is not None else 10000.0, o("rope_theta")))
    take("model.tie_embeddings", "tie_word_embeddings", False, bool)
    const = Origin(f"architecture of {mt} (transformers modeling_{mt}.py)")
    out += [("model.norm", "rmsnorm", const), ("model.gated_mlp", True, const), ("model.activation", "silu", const),
            ("model.position_embedding", "rope", const), ("model.vocab_divisible_by", 1, const)]
    bias = bool(cfg.get("attention_bias", False))
    out.append(("model.add_qkv_bias", bias or mt in ("qwen2", "qwen2_moe"), _where(o, cfg, "attention_bias", const)))
    out.append(("model.add_bias_linear", bool(cfg.get("mlp_bias", False)) and bias, _where(o, cfg, "mlp_bias", const)))
    out.append(("model.qk_norm", mt in ("qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"), const))
    if mt.startswith("deepseek"):
        mla = {"q_lora_rank": cfg.get("q_lora_rank") or 0, "kv_lora_rank": cfg["kv_lora_rank"],
               "qk_head_dim": cfg["qk_nope_head_dim"], "qk_rope_head_dim": cfg["qk_rope_head_dim"],
               "v_head_dim": cfg["v_head_dim"]}
        out.append(("model.mla", mla, o("kv_lora_rank")))
        out += [(f"model.mla.{k}", v, _where(o, cfg, _HF_KEY.get(k, k), const)) for k, v in mla.items()]
        take("model.mtp_num_layers", "num_nextn_predict_layers", 0)
    else:
        take("model.num_kv_heads", "num_key_value_heads", heads)
        if cfg.get("head_dim") is not None:
            take("model.head_dim", "head_dim")
    _window(cfg, mt, o, out)
    moe = _moe(cfg, mt, layers)
    if moe is not None:
        key = {"mixtral": "num_local_experts", "deepseek_v2": "n_routed_experts",
               "deepseek_v3": "n_routed_experts"}.get(mt, "num_experts")
        out.append(("model.moe", moe, o(key)))
        # each field at the key it came from (where the file has it; else the architecture's default)
        out += [(f"model.moe.{k}", v, _where(o, cfg, _MOE_KEY.get((mt[:8], k), _MOE_KEY.get(("", k), key)), const))
                for k, v in moe.items() if k != "num_experts"]
    if missing:
        raise ConfigError(missing)
    return out


# the config.json key a canonical MLA / MoE field is read from (for its origin), by family prefix where they differ
_HF_KEY = {"qk_head_dim": "qk_nope_head_dim"}
_MOE_KEY = {("", "top_k"): "num_experts_per_tok", ("", "expert_ffn_hidden_size"): "moe_intermediate_size",
            ("mixtral", "expert_ffn_hidden_size"): "intermediate_size", ("", "layer_pattern"): "decoder_sparse_step",
            ("", "shared_expert_ffn_hidden_size"): "shared_expert_intermediate_size",
            ("deepseek", "shared_expert_ffn_hidden_size"): "n_shared_experts",
            ("", "num_shared_experts"): "shared_expert_intermediate_size",
            ("deepseek", "num_shared_experts"): "n_shared_experts",
            ("", "shared_expert_gate"): "shared_expert_intermediate_size",
            ("", "first_k_dense"): "first_k_dense_replace", ("", "layer_freq"): "moe_layer_freq"}


def _where(o: Any, cfg: dict[str, Any], key: str, default: Origin) -> Origin:
    """The origin of a value read from `key`: its line where the file has the key, else `default` (the
    architecture's own value)."""
    return o(key) if key in cfg else default


# the value kinds of the keys read (transformers' config classes): counts, non-negative counts, numbers, flags, lists
_COUNTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
           "max_position_embeddings", "num_key_value_heads", "head_dim", "num_local_experts", "num_experts",
           "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "n_routed_experts", "moe_layer_freq",
           "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "sliding_window")
_ZERO_OK = ("shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace", "q_lora_rank",
            "num_nextn_predict_layers")
_FLAGS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
_FAMILY_KEYS = {"deepseek": ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
_MOE_KEYS = ("num_experts_per_tok", "moe_intermediate_size")
MAX_LAYERS = 10_000  # ModelSpec's bound, checked before a per-layer pattern is built


def _type_problems(cfg: dict[str, Any], mt: str, file: str, lines: dict[tuple[str, ...], int]) -> list[Problem]:
    """Every key read whose value is not of the kind transformers' config gives it, and every key the family needs
    that is absent, all at once (a wrong type used to crash the loader)."""
    problems: list[Problem] = []

    def bad(key: str, message: str, fix: str) -> None:
        problems.append(Problem(message, key=key, file=file, line=lines.get((key,)), fix=fix))

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for key in _COUNTS + _ZERO_OK:
        v = cfg.get(key)
        if v is not None and (not whole(v) or v < (0 if key in _ZERO_OK else 1)):
            bad(key, f"expected a whole number{'' if key in _ZERO_OK else ' >= 1'}, got {shown(v)}",
                f"give {key} as the model's config.json has it (a number without quotes)")
    if whole(cfg.get("num_hidden_layers")) and cfg["num_hidden_layers"] > MAX_LAYERS:
        bad("num_hidden_layers", f"{shown(cfg['num_hidden_layers'])} layers: at most {MAX_LAYERS}",
            "give the model's layer count")
    for key in _FLAGS:
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            bad(key, f"expected true or false, got {shown(cfg[key])}", f"write {key}: true or false (no quotes)")
    for key in ("torch_dtype", "dtype"):  # transformers' names of a checkpoint's floating-point dtype
        if cfg.get(key) is not None and cfg[key] not in ("bfloat16", "float16", "float32"):
            bad(key, f"expected bfloat16, float16 or float32, got {shown(cfg[key])}",
                f"give the checkpoint's dtype, or leave {key} out (training then defaults to bf16)")
    rope = cfg.get("rope_theta")
    if rope is not None and (isinstance(rope, bool) or not isinstance(rope, int | float) or not rope > 0):
        bad("rope_theta", f"expected a positive number, got {shown(rope)}", "give the rotary base, e.g. 500000")
    for key in ("rope_parameters", "text_config"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            bad(key, f"expected a mapping, got {shown(cfg[key])}", f"give {key} as an object, or leave it out")
    only = cfg.get("mlp_only_layers")
    if only is not None and not (isinstance(only, list) and all(whole(i) for i in only)):
        bad("mlp_only_layers", f"expected a list of layer numbers, got {shown(only)}", "e.g. [] or [0, 1]")
    needed = [k for fam, keys in _FAMILY_KEYS.items() if mt.startswith(fam) for k in keys]
    if (mt.startswith("deepseek") and cfg.get("n_routed_experts")) or (mt.endswith("_moe") and cfg.get("num_experts")):
        needed += list(_MOE_KEYS)
    if mt == "mixtral":
        needed.append("intermediate_size")
    for key in dict.fromkeys(needed):
        if cfg.get(key) is None and not any(p.key == key for p in problems):
            bad(key, "required key is missing", f"add \"{key}\" to the file (the model's config.json has it)")
    return problems


def _window(cfg: dict[str, Any], mt: str, o: Any, out: list[tuple[str, Any, Origin]]) -> None:
    """Sliding-window attention as transformers applies it: Mistral and Mixtral on every layer whenever
    `sliding_window` is set; Qwen2 / Qwen3 (and their MoE) only with `use_sliding_window`, on the layers from
    `max_window_layers` on (Qwen2Config: sliding_attention where i >= max_window_layers)."""
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return
    if mt in ("mistral", "mixtral"):
        out.append(("model.sliding_window", window, o("sliding_window")))
    elif mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window"):
        out.append(("model.sliding_window", window, o("sliding_window")))
        first = cfg.get("max_window_layers")
        if isinstance(first, int) and not isinstance(first, bool) and first > 0:
            out.append(("model.sliding_window_from_layer", first, o("max_window_layers")))


def _moe(cfg: dict[str, Any], mt: str, layers: int | None) -> dict[str, Any] | None:
    """MoE block from the family's keys; None for dense models."""
    if mt == "mixtral":
        # Every layer is MoE; intermediate_size is the per-expert size (MixtralSparseMoeBlock).
        return {"num_experts": cfg.get("num_local_experts", 8), "top_k": cfg.get("num_experts_per_tok", 2),
                "expert_ffn_hidden_size": cfg["intermediate_size"]}
    if mt in ("qwen2_moe", "qwen3_moe") and cfg.get("num_experts"):
        # Qwen*MoeDecoderLayer: MoE iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
        step = cfg.get("decoder_sparse_step", 1) or 1
        only = set(cfg.get("mlp_only_layers") or [])
        pattern = tuple(int(i not in only and (i + 1) % step == 0) for i in range(layers or 0))
        shared = cfg.get("shared_expert_intermediate_size") or 0
        return {"num_experts": cfg["num_experts"], "top_k": cfg["num_experts_per_tok"],
                "expert_ffn_hidden_size": cfg["moe_intermediate_size"], "layer_pattern": pattern,
                "shared_expert_ffn_hidden_size": shared, "num_shared_experts": 1 if shared else 0,
                "shared_expert_gate": bool(shared)}
    if mt.startswith("deepseek") and cfg.get("n_routed_experts"):
        # DeepseekV3DecoderLayer: MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0; the shared
        # experts form one MLP of n_shared_experts * moe_intermediate_size.
        n_shared = cfg.get("n_shared_experts") or 0
        return {"num_experts": cfg["n_routed_experts"], "top_k": cfg["num_experts_per_tok"],
                "expert_ffn_hidden_size": cfg["moe_intermediate_size"],
                "shared_expert_ffn_hidden_size": n_shared * cfg["moe_intermediate_size"],
                "num_shared_experts": n_shared, "first_k_dense": cfg.get("first_k_dense_replace", 0),
                "layer_freq": cfg.get("moe_layer_freq", 1)}
    return None


def load_hf(path: Path, overrides: dict[str, Any] | None = None) -> RawScenario:
    """Read an HF config.json into a RawScenario holding the model; training and plan come from `overrides`
    (canonical dotted keys such as `plan.tp` or `training.seq_length`) or take defaults."""
    data, lines = load_json(path)
    if isinstance(data, dict) and ("model_type" in data or "architectures" in data) and not is_hf_config(data):
        raise ConfigError(Problem("required key is missing (a HuggingFace config.json needs the model's hidden size)",
                                  key="hidden_size", file=str(path), line=None,
                                  fix="add hidden_size (or pass the model's complete config.json)"))
    if not is_hf_config(data):
        raise ConfigError(Problem("not a HuggingFace config.json (no model_type / hidden_size)", file=str(path),
                                  fix="pass a model's config.json, or a scenario YAML"))
    if "text_config" in data and "hidden_size" not in data:
        if not isinstance(data["text_config"], dict):
            raise ConfigError(Problem(f"expected a mapping, got {shown(data['text_config'])}", key="text_config",
                                      file=str(path), fix="give the model's text_config object"))
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type", data.get("model_type"))}
    raw = RawScenario(source=str(path), framework="hf")
    for key, value, origin in hf_model_fields(data, str(path), lines):
        raw.set(key, value, origin)
    default = Origin("default (config.json has no training settings; --set training.seq_length=N to change)")
    raw.set("training.seq_length", min(4096, data.get("max_position_embeddings") or 4096), default)  # checked above
    # The checkpoint's dtype: a 16-bit one is the mixed-precision dtype the model trains in; float32 is not taken as
    # fp32 training (checkpoints of bf16/fp16 mixed-precision runs are often stored in float32), so it keeps the
    # training default (bf16); --set training.params_dtype=fp32 for a true fp32 job.
    dtype = data.get("torch_dtype", data.get("dtype"))
    if dtype in ("bfloat16", "float16"):
        raw.set("training.params_dtype", {"bfloat16": "bf16", "float16": "fp16"}[dtype],
                Origin(str(path), lines.get(("torch_dtype",)), "torch_dtype"))
    apply_canonical_overrides(raw, overrides or {})
    return raw


def apply_canonical_overrides(raw: RawScenario, overrides: dict[str, Any]) -> None:
    """`--set section.key=value` in the canonical key space (model., training., plan., cluster.)."""
    bad = [k for k in overrides if k.split(".")[0] not in ("model", "training", "plan", "cluster")]
    if bad:
        raise ConfigError([Problem("--set key must start with model., training., plan. or cluster.", key=k,
                                   file=COMMAND_LINE, fix=_canonical_hint(k)) for k in bad])
    for k, v in overrides.items():
        raw.set(k, v, Origin("--set", None, k))


# Megatron / Primus names a user may type out of habit, and their canonical keys (config-formats.md §1)
_MEGATRON_NAMES = {"tensor_model_parallel_size": "plan.tp", "pipeline_model_parallel_size": "plan.pp",
                   "context_parallel_size": "plan.cp", "expert_model_parallel_size": "plan.ep",
                   "expert_tensor_parallel_size": "plan.etp", "sequence_parallel": "plan.sp",
                   "virtual_pipeline_model_parallel_size": "plan.vpp"}


def _canonical_hint(key: str) -> str:
    """The canonical key the user most likely meant by `key` (a Megatron name, or a bare field of one section)."""
    from projection.specs.model import ModelSpec
    from projection.specs.plan import ParallelPlan
    from projection.specs.training import TrainingSpec

    if not key:
        return "give a key before '=', e.g. --set plan.tp=8"
    if key in _MEGATRON_NAMES:
        return f"this file takes canonical keys: --set {_MEGATRON_NAMES[key]}=..."
    for section, spec in (("model", ModelSpec), ("training", TrainingSpec), ("plan", ParallelPlan)):
        if key.split(".")[0] in spec.model_fields:
            return f"--set {section}.{key}=..."
    return "prefix the key with its section, e.g. --set plan.tp=8 or --set training.seq_length=8192"

