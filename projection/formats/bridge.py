"""Megatron-Bridge `ConfigContainer` YAML -> RawScenario, through Megatron's own mapping (`args_to_raw`).

The file is the one Megatron-Bridge writes and prints: `run_config.yaml` in each checkpoint, the "Task Configuration"
block logged at start-up (`ConfigContainer.to_yaml`), or a hand-written YAML of the same sections (`model:`, `train:`,
`dataset:`, `ddp:`, `optimizer:`, `mixed_precision:`, `comm_overlap:`, `dist:`, `tokenizer:`; config-formats.md §4).
`model:` is a GPTModelProvider, i.e. a Megatron-Core TransformerConfig, so its fields are Megatron-Core's; each read
field is mapped to the Megatron-LM argparse dest of the same meaning and the rest of the conversion is Megatron's.

Where the dataclass path differs from the argparse path, Megatron-Bridge's rule is applied and its origin says so:
* ffn_hidden_size absent -> 4 x hidden even for gated units (TransformerConfig.__post_init__; no 8h/3 rule);
* the vocabulary is padded (make_vocab_size_divisible_by x tp) only with `model.should_pad_vocab`, or when
  model.vocab_size is null and the tokenizer's size is taken (training setup), or with
  `tokenizer.use_tokenizer_vocab_size`;
* gradient_accumulation_fusion defaults to False (ModelParallelConfig), cross_entropy_loss_fusion to True
  (GPTModelProvider);
* main gradients are fp32 only with `ddp.grad_reduce_in_fp32` (DistributedDataParallelConfig; default False), not
  forced on by bf16 as Megatron-LM's validate_args does;
* the tokens per sample are `dataset.sequence_length` (older: `dataset.seq_length`), what the data loader feeds;
  `model.seq_length` (the rotary table's length) only stands in when the dataset gives none;
* mixed_precision (a MixedPrecisionConfig or a recipe name) and comm_overlap are applied over model / ddp /
  optimizer, and the distributed-optimizer and Megatron-FSDP flags synchronised, as Megatron-Bridge does before
  training (formats/bridge_setup.py).
Values serialised as `{_target_: torch.bfloat16}` (dtypes, the activation function, AttnBackend) are read back.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem
from projection.formats.bridge_fields import (
    ACTIVATIONS,
    BRIDGE_DEFAULTS,
    FIELDS,
    IGNORED_SECTIONS,
    SECTIONS,
    is_bridge,
    read_target,
)
from projection.formats.bridge_setup import MP_DEFAULTS, apply_setup
from projection.formats.common import coerce_scalar, load_yaml, set_nested
from projection.formats.megatron import SET_ORIGIN, args_to_raw
from projection.formats.megatron_model import DEFAULT_FILE
from projection.specs.scenario import Origin, RawScenario

CANONICAL_SECTIONS = ("training", "plan")  # --set keys of projection's own space (cluster.* is api.load's)
FRAMEWORK = "megatron-bridge"
BRIDGE_DEFAULT_FILE = "default (Megatron-Core / Megatron-Bridge dataclasses)"
BRIDGE_NAMES: dict[str, str] = {}  # Megatron dest -> the Bridge field that gives it (the first of FIELDS)
for (_section, _field), _dest in FIELDS.items():
    BRIDGE_NAMES.setdefault(_dest, f"{_section}.{_field}")


def load_bridge(path: Path, overrides: Mapping[str, Any] | None = None) -> RawScenario:
    """Read a Megatron-Bridge ConfigContainer YAML. `overrides` (--set) use Bridge's Hydra spelling
    (`model.tensor_model_parallel_size=4`, `train.global_batch_size=512`), or projection's `training.*` / `plan.*`."""
    path = Path(path)
    file = str(path)
    data, lines = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(Problem("a Megatron-Bridge config is a mapping of sections", file=file,
                                  fix="give the run_config.yaml Megatron-Bridge writes (model:, train:, ...)"))
    origins = {k: Origin(file, line, ".".join(k)) for k, line in lines.items()}
    problems: list[Problem] = []
    canonical: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        dotted = key.lstrip("-")
        section = dotted.split(".", 1)[0]
        if section in CANONICAL_SECTIONS and "." in dotted:
            canonical[dotted] = value
            continue
        if not _known_override(dotted, data):
            problems.append(_unknown_override(key, dotted))
            continue
        set_nested(data, dotted, coerce_scalar(value) if isinstance(value, str) else value)
        origins[tuple(dotted.split("."))] = Origin(SET_ORIGIN, None, dotted)
    for section in data:
        if section != "_target_" and section not in SECTIONS and section not in IGNORED_SECTIONS:
            close = difflib.get_close_matches(str(section), [*SECTIONS, *IGNORED_SECTIONS], n=1)
            problems.append(Problem(f"unknown Megatron-Bridge section {section!r}", file=file,
                                    line=lines.get((str(section),)), key=str(section),
                                    fix=f"did you mean {close[0]}?" if close else
                                    f"use ConfigContainer's sections: {', '.join(SECTIONS)}"))
    if not isinstance(data.get("model"), dict) or "num_layers" not in data["model"]:
        problems.append(Problem(
            "the model's shape is not in this file (no model.num_layers): a Megatron-Bridge recipe builds it in "
            "Python, which projection does not run", file=file, key="model",
            fix="give the run_config.yaml Megatron-Bridge saves in each checkpoint (or the 'Task Configuration' it "
                "logs at start-up), or add the model's fields (model.num_layers, hidden_size, num_attention_heads, "
                "ffn_hidden_size, vocab_size, ...)"))
    if not problems:
        problems += apply_setup(data, origins, file)
    if problems:
        raise ConfigError(problems)
    args, arg_origins = _args(data, origins, file)
    raw = args_to_raw(args, arg_origins, source=file, framework=FRAMEWORK, null_tokenizer_adds_eod=False)
    _after(data, origins, raw, file)
    for key, value in canonical.items():
        raw.set(key, coerce_scalar(value) if isinstance(value, str) else value, Origin(SET_ORIGIN, None, key))
    return raw


def _known_override(dotted: str, data: Mapping[str, Any]) -> bool:
    parts = dotted.split(".")
    if len(parts) != 2 or parts[0] not in SECTIONS:
        return False
    section = data.get(parts[0])
    return (parts[0], parts[1]) in FIELDS or (isinstance(section, dict) and parts[1] in section) or \
        (parts[0] == "mixed_precision" and parts[1] in MP_DEFAULTS)


def _unknown_override(key: str, dotted: str) -> Problem:
    names = [f"{s}.{f}" for s, f in FIELDS]
    close = difflib.get_close_matches(dotted, names, n=3)
    return Problem(f"--set {key}: not a Megatron-Bridge field this projection reads, nor one the file sets",
                   key=key, file=SET_ORIGIN, fix=f"did you mean {', '.join(close)}?" if close else
                   "use Bridge's spelling (model.tensor_model_parallel_size=4, train.global_batch_size=512) or a "
                   "projection key (plan.tp=4, training.seq_length=4096)")


def _args(data: Mapping[str, Any], origins: Mapping[tuple[str, ...], Origin],
          file: str) -> tuple[dict[str, Any], dict[str, Origin]]:
    """Megatron dest -> value and origin, from the read fields (the first present of two that give one dest, the
    dataset's sequence over the model's), then Bridge's own defaults for what is still missing."""
    args: dict[str, Any] = {}
    where: dict[str, Origin] = {}
    problems: list[Problem] = []

    def put(dest: str, value: Any, origin: Origin) -> None:
        args[dest], where[dest] = value, origin

    for (section, field), dest in FIELDS.items():
        table = data.get(section)
        if not isinstance(table, dict) or table.get(field) is None:
            continue
        origin = origins.get((section, field), Origin(file, None, f"{section}.{field}"))
        try:
            value = read_target(table[field])
        except ValueError as e:
            problems.append(Problem(str(e), file=origin.file, line=origin.line, key=origin.key,
                                    fix="give the value as Megatron-Bridge writes it (a string, number or bool)"))
            continue
        if dest not in args or section == "dataset":
            put(dest, value, origin)
    _activation(data, origins, file, put, problems)
    model = data["model"]
    if model.get("num_query_groups") is not None:  # TransformerConfig: num_query_groups alone is GQA
        put("group_query_attention", True, origins.get(("model", "num_query_groups"), Origin(file)))
    if model.get("share_embeddings_and_output_weights") is not None:
        put("untie_embeddings_and_output_weights", not model["share_embeddings_and_output_weights"],
            origins[("model", "share_embeddings_and_output_weights")])
    if model.get("ffn_hidden_size") is None and isinstance(model.get("hidden_size"), int):
        put("ffn_hidden_size", 4 * model["hidden_size"],
            Origin("default (Megatron-Core TransformerConfig: 4 x hidden_size, gated or not)", None,
                   "model.hidden_size"))
    ddp = data["ddp"]
    if ddp.get("use_megatron_fsdp") and ddp.get("keep_fp8_transpose_cache") is False:
        # DistributedDataParallelConfig.keep_fp8_transpose_cache: Megatron-FSDP's alone (default False): without it
        # the fp8 weights' transposes are made again in each backward
        put("fp8_weight_transpose_cache", False, origins[("ddp", "keep_fp8_transpose_cache")])
    fp32, o = _grad_reduce_in_fp32(data, origins)
    put("grad_reduce_in_bf16", not fp32, o)
    put("accumulate_allreduce_grads_in_fp32", fp32, o)
    for dest, (value, why) in BRIDGE_DEFAULTS.items():
        if dest not in args:
            put(dest, value, Origin(f"default ({why})", None, BRIDGE_NAMES.get(dest, dest)))
    if problems:
        raise ConfigError(problems)
    return args, where


def _activation(data: Mapping[str, Any], origins: Mapping[tuple[str, ...], Origin], file: str, put: Any,
                problems: list[Problem]) -> None:
    """gated_linear_unit + activation_func -> Megatron's --swiglu / --quick-geglu / --squared-relu."""
    model = data["model"]
    gated = bool(model.get("gated_linear_unit"))
    try:
        act = read_target(model.get("activation_func")) or "gelu"
    except ValueError:
        act = "?"
    kind = ACTIVATIONS.get(str(act).rsplit(".", 1)[-1])
    origin = origins.get(("model", "activation_func"), origins.get(("model", "gated_linear_unit"), Origin(file)))
    if kind is None:
        problems.append(Problem(f"activation function {act!r} is not modelled", file=origin.file, line=origin.line,
                                key="model.activation_func", fix="use silu, gelu, quick_gelu or squared_relu"))
        return
    dest = {("silu", True): "swiglu", ("quick_gelu", True): "quick_geglu", ("squared_relu", False): "squared_relu"}
    if (kind, gated) in dest:
        put(dest[(kind, gated)], True, origin)


def _grad_reduce_in_fp32(data: Mapping[str, Any], origins: Mapping[tuple[str, ...], Origin]) -> tuple[bool, Origin]:
    """Megatron-Core's DDP keeps main grads in fp32 only with grad_reduce_in_fp32 (mixed_precision's is copied to
    ddp by bridge_setup)."""
    if data["ddp"].get("grad_reduce_in_fp32") is not None:
        return bool(data["ddp"]["grad_reduce_in_fp32"]), origins[("ddp", "grad_reduce_in_fp32")]
    return False, Origin("default (Megatron-Core DistributedDataParallelConfig grad_reduce_in_fp32 False)", None,
                         "ddp.grad_reduce_in_fp32")


def _after(data: Mapping[str, Any], origins: Mapping[tuple[str, ...], Origin], raw: RawScenario, file: str) -> None:
    """What the dataclass path sets differently from Megatron-LM's argparse, on the canonical keys."""
    model = data["model"]
    for key, o in list(raw.origins.items()):  # the dataclasses' defaults, which equal argparse's for these keys
        if o.file == DEFAULT_FILE:
            raw.origins[key] = Origin(BRIDGE_DEFAULT_FILE, o.line, BRIDGE_NAMES.get(o.key or "", o.key))
    if not raw.get("training.optimizer.precision_aware"):  # main grads: fp32 iff grad_reduce_in_fp32 (_grad_dtype)
        fp32 = _grad_reduce_in_fp32(data, origins)
        raw.set("training.optimizer.main_grads_dtype", "fp32" if fp32[0] else raw.get("training.params_dtype"),
                fp32[1])
    # GPTModelProvider.provide pads by make_vocab_size_divisible_by x tp only with should_pad_vocab; training setup
    # (_validate_and_set_vocab_size) turns it on when model.vocab_size is null (the tokenizer's size is taken) or
    # tokenizer.use_tokenizer_vocab_size, off otherwise. A checkpoint's run_config.yaml holds the value set then.
    tok = data.get("tokenizer")
    tokenizer: Mapping[str, Any] = tok if isinstance(tok, dict) else {}
    if model.get("vocab_size") is None or tokenizer.get("use_tokenizer_vocab_size"):
        if tokenizer.get("vocab_size") is not None:
            raw.set("model.vocab_size", tokenizer["vocab_size"], origins[("tokenizer", "vocab_size")])
    elif not model.get("should_pad_vocab"):
        o = origins.get(("model", "should_pad_vocab"),
                        Origin("default (Megatron-Bridge GPTModelProvider should_pad_vocab False)", None,
                               "model.should_pad_vocab"))
        raw.set("model.vocab_divisible_by", 1, o)
        raw.set("model.vocab_pad_with_tp", False, o)
    gated = bool(model.get("gated_linear_unit"))
    try:
        act = ACTIVATIONS.get(str(read_target(model.get("activation_func")) or "gelu").rsplit(".", 1)[-1])
    except ValueError:
        act = None
    if act is not None and (act, gated) not in (("silu", True), ("quick_gelu", True), ("squared_relu", False),
                                                 ("gelu", False)):
        o = origins.get(("model", "activation_func"), origins.get(("model", "gated_linear_unit"), Origin(file)))
        raw.set("model.gated_mlp", gated, o)  # GEGLU, or a plain SiLU MLP: no Megatron-LM flag says so
        raw.set("model.activation", act, o)
    target = str(model.get("_target_") or "")
    stem = Path(file).stem
    name = target.rsplit(".", 1)[-1].removesuffix("Provider") if stem in ("run_config", "config") and target else stem
    raw.set("model.name", name or stem, Origin(file, origins.get(("model", "_target_"), Origin(file)).line,
                                               "model._target_" if target else "the file name"))


__all__ = ["FRAMEWORK", "is_bridge", "load_bridge"]
