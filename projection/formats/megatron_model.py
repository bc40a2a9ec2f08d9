"""Megatron args -> the canonical `model.*` keys, with Megatron's derived defaults (config-formats.md §1.2-1.9), and
`MegatronArgs`, the typed, default-filling view of an args mapping that collects problems instead of raising."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from projection.errors import Problem
from projection.formats.megatron_args import DESTS, ArgValueError, canonical_dest, coerce, int_list, merged
from projection.formats.tokenizers import tokenizer_vocab_size
from projection.specs.scenario import Origin, RawScenario

DEFAULT_FILE = "default (Megatron-LM argparse)"


class MegatronArgs:
    """Typed access to Megatron args: `get` coerces a given value or returns the argparse default; `origin` says
    where a value came from; bad values become Problems (collected in `problems`) and fall back to the default."""

    def __init__(self, args: Mapping[str, Any], origins: Mapping[str, Origin], *, source: str, flags: bool,
                 bridge: bool = False):
        self.args = merged(args)
        self.bridge = bridge  # Megatron-Bridge fields: problems are respelt from Megatron-LM's flags (bridge_spelling)
        self.origins = {canonical_dest(k): o for k, o in origins.items()}
        self.source = source
        self.flags = flags  # name keys as flags (--num-layers) rather than dests (num_layers) in messages
        self.problems: list[Problem] = []
        # canonical key -> the problem of a value stood in for (an unknown vocabulary): the rest is still checked
        # and the problem reported with the layout's own (RawScenario.placeholders)
        self.unknown: dict[str, Problem] = {}
        self._cache: dict[str, tuple[bool, Any]] = {}

    def _lookup(self, dest: str) -> tuple[bool, Any]:
        if dest not in self._cache:
            default = DESTS[dest][1]
            given, value = False, default
            if dest in self.args:
                try:
                    coerced = coerce(dest, self.args[dest])
                except ArgValueError as e:
                    self.problem(dest, str(e), f"give {self.key(dest)} a valid value")
                    coerced = None
                if coerced is not None:
                    given, value = True, coerced
            self._cache[dest] = (given, value)
        return self._cache[dest]

    def given(self, dest: str) -> bool:
        return self._lookup(dest)[0]

    def get(self, dest: str) -> Any:
        return self._lookup(dest)[1]

    def int_list(self, dest: str) -> list[int]:
        try:
            return int_list(self.args[dest])
        except ArgValueError as e:
            self.problem(dest, str(e), f"give {self.key(dest)} as a list of integers")
            return []

    def key(self, dest: str) -> str:
        o = self.origins.get(dest)
        if o is not None and o.key and dest in self.args:
            return o.key
        return "--" + dest.replace("_", "-") if self.flags else dest

    def origin(self, dest: str) -> Origin:
        if self.given(dest):
            return self.origins.get(dest) or Origin(self.source, None, self.key(dest))
        if dest not in self.args and dest in self.origins:  # a file that wrote the field as null (Megatron-Bridge)
            return self.origins[dest]
        return Origin(DEFAULT_FILE, None, self.key(dest))

    def problem(self, dest: str, message: str, fix: str, *, stands_in_for: str = "") -> None:
        """Record a problem with `dest`; `stands_in_for` names the canonical key the loader set a placeholder for."""
        o = self.origins.get(dest) if dest in self.args else None
        p = Problem(message, key=o.key if o and o.key else self.key(dest), file=o.file if o else self.source,
                    line=o.line if o else None, fix=fix)
        if stands_in_for:
            self.unknown[stands_in_for] = p
        else:
            self.problems.append(p)


def model_section(a: MegatronArgs, raw: RawScenario, *, null_tokenizer_adds_eod: bool) -> None:
    """Set every `model.*` key from the args (shape, FFN, attention, block, positions, MoE, MTP, vocabulary)."""
    for dest in ("num_layers", "hidden_size", "num_attention_heads"):
        if a.given(dest):
            raw.set(f"model.{dest}", a.get(dest), a.origin(dest))
        elif dest not in a.args:  # given but unreadable: its own problem says so
            a.problem(dest, f"{a.key(dest)} is required (Megatron has no default)",
                      f"add {a.key(dest)} N, or --set {dest}=N")
    _ffn(a, raw)
    _attention(a, raw)
    _block(a, raw)
    _positions(a, raw)
    _window(a, raw)
    if a.given("mtp_num_layers"):
        raw.set("model.mtp_num_layers", a.get("mtp_num_layers"), a.origin("mtp_num_layers"))
    _moe(a, raw)
    _vocab(a, raw, null_tokenizer_adds_eod)


def _ffn(a: MegatronArgs, raw: RawScenario) -> None:
    h = a.get("hidden_size")
    if a.given("ffn_hidden_size"):
        raw.set("model.ffn_hidden_size", a.get("ffn_hidden_size"), a.origin("ffn_hidden_size"))
    elif h:
        # Megatron validate_args: with --swiglu, int((4h * 2/3) / 64) * 64 (8h/3 rounded down to 64); else 4h.
        ffn = int((4 * h * 2 / 3) / 64) * 64 if a.get("swiglu") else 4 * h
        raw.set("model.ffn_hidden_size", ffn, a.origin("hidden_size"))
    # core_transformer_config_from_args: swiglu = gated SiLU; quick_geglu = gated quick-GELU; squared_relu not gated;
    # the default activation is GELU, not gated (§1.2).
    kinds = (("swiglu", True, "silu"), ("quick_geglu", True, "quick_gelu"), ("squared_relu", False, "squared_relu"))
    dest, gated, act = next((k for k in kinds if a.get(k[0])), ("swiglu", False, "gelu"))
    raw.set("model.gated_mlp", gated, a.origin(dest))
    raw.set("model.activation", act, a.origin(dest))


def _attention(a: MegatronArgs, raw: RawScenario) -> None:
    if a.get("multi_latent_attention"):
        if a.get("group_query_attention"):
            a.problem("group_query_attention", "multi-latent attention cannot be combined with group-query "
                      "attention (§1.2)", "drop --group-query-attention")
        mla = "model.mla"
        # §1.8: CLI defaults (q_lora_rank None = no Q compression -> 0, kv_lora_rank 32), not the dataclass's.
        raw.set(f"{mla}.q_lora_rank", a.get("q_lora_rank") or 0, a.origin("q_lora_rank"))
        for dest, key in (("kv_lora_rank", "kv_lora_rank"), ("qk_head_dim", "qk_head_dim"),
                          ("qk_pos_emb_head_dim", "qk_rope_head_dim"), ("v_head_dim", "v_head_dim")):
            raw.set(f"{mla}.{key}", a.get(dest), a.origin(dest))
        return  # with MLA, num_query_groups / kv_channels do not set the Q/K/V widths (§1.8)
    if a.get("group_query_attention"):
        # §1.3: groups count only with --group-query-attention; the CLI default 1 makes the flag alone MQA.
        src = "num_query_groups" if a.given("num_query_groups") else "group_query_attention"
        raw.set("model.num_kv_heads", a.get("num_query_groups"), a.origin(src))
    h, heads, kv = a.get("hidden_size"), a.get("num_attention_heads"), a.get("kv_channels")
    # §1.3: kv_channels defaults to h / heads, which is what head_dim None means; only a different value is kept,
    # so an explicit kv_channels = h / heads gives the same canonical model as an omitted one.
    if kv is not None and not (h and heads and h % heads == 0 and kv == h // heads):
        raw.set("model.head_dim", kv, a.origin("kv_channels"))


def _window(a: MegatronArgs, raw: RawScenario) -> None:
    """--window-size left right: each query attends to the `left` keys before it and itself (right 0, causal), the
    canonical sliding window of left + 1 keys (TransformerConfig.window_size)."""
    if not a.given("window_size"):
        return
    raw_size = a.args["window_size"]  # Megatron's tuple_type: "4096,0" or "(4096,0)"
    text = " ".join(map(str, raw_size)) if isinstance(raw_size, list | tuple) else str(raw_size)
    try:
        size = [int(v) for v in text.replace("(", " ").replace(")", " ").replace(",", " ").split()]
    except ValueError:
        size = []
    if size[:1] == [-1]:  # Transformer Engine's (-1, 0): no window
        return
    if len(size) != 2 or size[0] < 0 or size[1] != 0:
        a.problem("window_size", f"--window-size {size}: only a causal window (left, 0) is modelled",
                  "give --window-size LEFT 0, or drop it")
    elif a.given("window_attn_skip_freq"):
        a.problem("window_attn_skip_freq", "full-attention layers among sliding-window ones are not modelled",
                  "drop --window-attn-skip-freq (every layer windowed) or --window-size (none)")
    else:
        raw.set("model.sliding_window", size[0] + 1, a.origin("window_size"))


def _block(a: MegatronArgs, raw: RawScenario) -> None:
    norms = {"layernorm": "layernorm", "rmsnorm": "rmsnorm"}
    norm = str(a.get("normalization")).lower()
    if norm in norms:
        raw.set("model.norm", norms[norm], a.origin("normalization"))
    else:
        a.problem("normalization", f"unsupported normalization {a.get('normalization')!r}",
                  "use LayerNorm or RMSNorm")
    bias = a.get("add_bias_linear")
    raw.set("model.add_bias_linear", bias, a.origin("add_bias_linear"))
    # validate_args: add_qkv_bias is forced on whenever add_bias_linear is on (§1.2).
    raw.set("model.add_qkv_bias", bool(bias or a.get("add_qkv_bias")),
            a.origin("add_qkv_bias" if a.given("add_qkv_bias") or not bias else "add_bias_linear"))
    raw.set("model.qk_norm", a.get("qk_layernorm"), a.origin("qk_layernorm"))
    raw.set("model.tie_embeddings", not a.get("untie_embeddings_and_output_weights"),
            a.origin("untie_embeddings_and_output_weights"))


def _positions(a: MegatronArgs, raw: RawScenario) -> None:
    kind, src = a.get("position_embedding_type"), "position_embedding_type"
    if a.get("use_rotary_position_embeddings"):  # deprecated spelling of rope (§1.2)
        kind, src = "rope", "use_rotary_position_embeddings"
    if kind != "rope" and not a.get("add_position_embedding"):
        # megatron/training/arguments.py validate_args: `if not args.add_position_embedding and
        # args.position_embedding_type != 'rope': raise RuntimeError('--no-position-embedding is deprecated, ...')`
        # (Megatron-Core's GPTModel builds its table from position_embedding_type alone)
        a.problem("add_position_embedding", "--no-position-embedding (add_position_embedding false) with position "
                  f"embedding type {kind!r}: Megatron refuses it unless the type is rope ('--no-position-embedding "
                  "is deprecated, use --position-embedding-type')", "choose position_embedding_type (rope, or none "
                  "for no position embedding) and leave add_position_embedding on")
        return
    kinds = {"learned_absolute": "learned", "rope": "rope", "yarn": "rope", "mrope": "rope", "none": "none"}
    if kind not in kinds:
        a.problem(src, f"position embedding type {kind!r} is not modelled", f"use one of {', '.join(kinds)}")
        return
    raw.set("model.position_embedding", kinds[kind], a.origin(src))
    if a.given("max_position_embeddings"):
        raw.set("model.max_position_embeddings", a.get("max_position_embeddings"), a.origin("max_position_embeddings"))
    if kinds[kind] == "rope":
        raw.set("model.rope_theta", float(a.get("rotary_base")), a.origin("rotary_base"))


def _moe(a: MegatronArgs, raw: RawScenario) -> None:
    experts = a.get("num_experts")
    if not experts:  # None or 0: dense (§1.3)
        return
    moe = "model.moe"
    raw.set(f"{moe}.num_experts", experts, a.origin("num_experts"))
    raw.set(f"{moe}.top_k", a.get("moe_router_topk"), a.origin("moe_router_topk"))
    # §1.3: a missing --moe-ffn-hidden-size falls back to ffn_hidden_size.
    if a.given("moe_ffn_hidden_size"):
        raw.set(f"{moe}.expert_ffn_hidden_size", a.get("moe_ffn_hidden_size"), a.origin("moe_ffn_hidden_size"))
    elif raw.get("model.ffn_hidden_size") is not None:
        raw.set(f"{moe}.expert_ffn_hidden_size", raw.get("model.ffn_hidden_size"),
                raw.origins["model.ffn_hidden_size"])
    if a.given("moe_shared_expert_intermediate_size"):  # §1.7: the total over all shared experts
        raw.set(f"{moe}.shared_expert_ffn_hidden_size", a.get("moe_shared_expert_intermediate_size"),
                a.origin("moe_shared_expert_intermediate_size"))
    raw.set(f"{moe}.shared_expert_gate", a.get("moe_shared_expert_gate"), a.origin("moe_shared_expert_gate"))
    if a.get("moe_expert_capacity_factor") is not None:  # §1.7 token dropping; None = dropless
        raw.set(f"{moe}.capacity_factor", a.get("moe_expert_capacity_factor"), a.origin("moe_expert_capacity_factor"))
        raw.set(f"{moe}.pad_to_capacity", a.get("moe_pad_expert_input_to_capacity"),
                a.origin("moe_pad_expert_input_to_capacity"))
    freq, origin = a.get("moe_layer_freq"), a.origin("moe_layer_freq")
    rule = _as_rule(freq) if isinstance(freq, list) and len(freq) == a.get("num_layers") else None
    if rule is not None:
        # A list that the (first_k_dense, layer_freq) rule describes exactly, e.g. DeepSeek's ([0]*3+[1]*58), is
        # stored in that form: the same model then gets the same canonical spec as from HF / TorchTitan.
        raw.set(f"{moe}.first_k_dense", rule[0], origin)
        freq = rule[1]
    if isinstance(freq, list):  # §1.7: one 0/1 entry per layer
        raw.set(f"{moe}.layer_pattern", tuple(freq), origin)
    elif freq < 1:
        a.problem("moe_layer_freq", f"moe layer frequency {freq} must be >= 1", "give a positive integer or a list")
    else:
        raw.set(f"{moe}.layer_freq", freq, origin)  # Megatron: layer i is MoE iff i % freq == 0
        raw.set(f"{moe}.freq_convention", "megatron", origin)


def _as_rule(pattern: list[int]) -> tuple[int, int] | None:
    """(first_k_dense, layer_freq) with layer i MoE iff i >= k and i % freq == 0 (ModelSpec.is_moe_layer), if one
    reproduces the 0/1 pattern; None otherwise."""
    n = len(pattern)
    k = next((i for i, v in enumerate(pattern) if v), n)
    if k == n:
        return None
    for freq in range(1, n + 1):
        if all(bool(v) == (i >= k and i % freq == 0) for i, v in enumerate(pattern)):
            return k, freq
    return None


def _vocab(a: MegatronArgs, raw: RawScenario, null_tokenizer_adds_eod: bool) -> None:
    # §1.3 padded vocab: ceil(V / (make_vocab_size_divisible_by * TP)) * divisor * TP.
    raw.set("model.vocab_divisible_by", a.get("make_vocab_size_divisible_by"), a.origin("make_vocab_size_divisible_by"))
    raw.set("model.vocab_pad_with_tp", True, a.origin("make_vocab_size_divisible_by"))
    ttype = a.get("tokenizer_type")
    if a.given("vocab_size"):
        size = a.get("vocab_size")
        if ttype == "NullTokenizer" and null_tokenizer_adds_eod:
            size += 1  # NullTokenizer before Megatron c9dfe34 reports vocab_size + 1 (EOD); see megatron.py
        raw.set("model.vocab_size", size, a.origin("vocab_size"))
        return
    if ttype == "NullTokenizer":
        a.problem("tokenizer_type", "NullTokenizer needs --vocab-size", "add --vocab-size N (or --set vocab_size=N)",
                  stands_in_for="model.vocab_size")
        _placeholder_vocab(a, raw)
        return
    for dest in ("tokenizer_model", "vocab_file", "tokenizer_type"):
        name = a.get(dest)
        size = tokenizer_vocab_size(_strip_vars(name)) if name else None
        if size:
            raw.set("model.vocab_size", size, a.origin(dest))
            return
    if ttype is None and a.given("merge_file"):  # only GPT2BPETokenizer takes a merge file
        raw.set("model.vocab_size", tokenizer_vocab_size("GPT2BPETokenizer"), a.origin("merge_file"))
        return
    named = next((d for d in ("tokenizer_model", "tokenizer_type", "vocab_file") if a.given(d)), "vocab_size")
    what = f"tokenizer {a.get(named)!r} is not in the table of known tokenizers" if named != "vocab_size" else \
        "neither --vocab-size nor a tokenizer is given"
    a.problem(named, f"cannot tell the vocabulary size: {what}",
              "--set vocab_size=N with N = len(tokenizer) before padding (Megatron pads it itself)",
              stands_in_for="model.vocab_size")
    _placeholder_vocab(a, raw)


def _placeholder_vocab(a: MegatronArgs, raw: RawScenario) -> None:
    """A stand-in vocabulary (one padding unit) so that the layout is still checked while the real one is unknown:
    the scenario is refused anyway, with the vocabulary's problem first (a.unknown, RawScenario.placeholders)."""
    raw.set("model.vocab_size", a.get("make_vocab_size_divisible_by"), a.origin("make_vocab_size_divisible_by"))


def _strip_vars(text: str) -> str:
    """Drop unresolved `${NAME}` / `$NAME` references: a tokenizer is recognised by its own name, not a variable's."""
    return re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", "", text)
