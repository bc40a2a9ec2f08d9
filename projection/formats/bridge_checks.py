"""A Megatron-Bridge ConfigContainer YAML before it is read (formats/bridge.py): `--set` in Bridge's spelling applied
to its tables, and the file's structure checked, every problem at once, each at its key as written there.

Bridge builds each section as a dataclass, so an unknown field stops it; here a field one slip (a letter inserted,
dropped or two swapped) from a field projection reads is refused with the name it was probably meant to be, where it
would otherwise be dropped and its default priced. Other fields of the dataclasses (hundreds: initialisers,
logging, kernels) are not read and not listed."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from projection.errors import Problem, shown
from projection.formats.bridge_fields import BRIDGE_NAMES, FIELDS, IGNORED_SECTIONS, SECTIONS, section
from projection.formats.bridge_setup import MP_DEFAULTS, recipe_name, recipe_table
from projection.formats.common import coerce_scalar, one_slip, set_nested
from projection.formats.megatron import SET_ORIGIN
from projection.formats.megatron_args import flag_to_dest
from projection.specs.scenario import Origin

Origins = MutableMapping[tuple[str, ...], Origin]
CANONICAL_SECTIONS = ("training", "plan")  # --set keys of projection's own space (cluster.* is api.load's)
SEQUENCE = ("seq_length", "sequence_length")  # GPTDatasetConfig: sequence_length up to 0.5, seq_length from 0.6
REQUIRED = ("num_layers", "hidden_size", "num_attention_heads")
# fields read beside FIELDS (formats/bridge.py, bridge_setup.py), for the near-miss check
_ALSO_READ = {"model": {"gated_linear_unit", "activation_func", "share_embeddings_and_output_weights",
                        "should_pad_vocab", "cpu_offloading", "pipeline_model_parallel_layout",
                        "position_embedding_type", "num_layers"},
              "tokenizer": {"use_tokenizer_vocab_size"}, "dataset": set(SEQUENCE),
              "mixed_precision": set(MP_DEFAULTS) | {"fp8_param", "fp4"},
              "rerun_state_machine": {"check_for_nan_in_loss"},
              "comm_overlap": {"tp_comm_overlap", "overlap_p2p_comm", "overlap_grad_reduce", "overlap_param_gather",
                               "defer_embedding_wgrad_compute", "overlap_moe_expert_parallel_comm",
                               "wgrad_deferral_limit"}}


def apply_overrides(data: dict[str, Any], origins: Origins,
                    overrides: Mapping[str, Any]) -> tuple[dict[str, Any], list[Problem]]:
    """Apply `--set` keys in Bridge's spelling to `data` (origins follow); return projection's own keys
    (training.*, plan.*) to set after loading, and the keys refused."""
    canonical: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in overrides.items():
        dotted = key.lstrip("-")
        parts = dotted.split(".")
        v = coerce_scalar(value) if isinstance(value, str) else value
        if parts[0] in CANONICAL_SECTIONS and len(parts) > 1:
            canonical[dotted] = value
            continue
        if dotted in ("mixed_precision", "comm_overlap"):  # a recipe name, or null
            data[dotted] = v
            origins[(dotted,)] = Origin(SET_ORIGIN, None, dotted)
            continue
        if not _known_override(parts, data):
            problems.append(_unknown_override(key, dotted))
            continue
        if parts[0] == "mixed_precision" and recipe_name(data.get("mixed_precision")) is not None:
            _resolve_recipe(data, origins)  # a field over a recipe: the recipe's table, then the field
        if parts[0] == "dataset" and parts[1] in SEQUENCE:
            dataset = section(data, "dataset")
            held = [k for k in SEQUENCE if k in dataset]
            for other in held:
                dataset.pop(other)
            parts = ["dataset", held[0] if held else parts[1]]
            data["dataset"] = dataset
        set_nested(data, ".".join(parts), v)
        origins[tuple(parts)] = Origin(SET_ORIGIN, None, dotted)
    return canonical, problems


def _resolve_recipe(data: dict[str, Any], origins: Origins) -> None:
    name = recipe_name(data["mixed_precision"])
    table = recipe_table(name) if name else None
    if table is None:
        return  # an unknown recipe: bridge_setup says so
    here = origins.get(("mixed_precision",), Origin(SET_ORIGIN, None, "mixed_precision"))
    data["mixed_precision"] = dict(table)
    for f in table:
        origins[("mixed_precision", f)] = here


def _known_override(parts: list[str], data: Mapping[str, Any]) -> bool:
    if len(parts) != 2 or parts[0] not in SECTIONS:
        return False
    section = data.get(parts[0])
    return (parts[0], parts[1]) in FIELDS or parts[1] in _ALSO_READ.get(parts[0], ()) or \
        (isinstance(section, dict) and parts[1] in section)


def _unknown_override(key: str, dotted: str) -> Problem:
    names = [f"{s}.{f}" for s, f in FIELDS] + [f"{s}.{f}" for s, fs in _ALSO_READ.items() for f in fs]
    close = difflib.get_close_matches(dotted, names, n=3)
    return Problem(f"--set {key}: not a Megatron-Bridge field this projection reads, nor one the file sets",
                   key=key, file=SET_ORIGIN, fix=f"did you mean {', '.join(close)}?" if close else
                   "use Bridge's spelling (model.tensor_model_parallel_size=4, train.global_batch_size=512, "
                   "mixed_precision=bf16_mixed) or a projection key (plan.tp=4, training.seq_length=4096)")


def structure_problems(data: Mapping[str, Any], lines: Mapping[tuple[str, ...], int], file: str,
                       by_target: bool) -> tuple[list[Problem], list[Problem]]:
    """Sections, required fields, near misses and the dataset's sequence length (module docstring), as (what is
    dropped: unknown sections and misspelt fields, which leave the rest readable; the other problems). by_target: the
    file names itself a ConfigContainer (`_target_`), rather than being recognised by its sections."""
    def at(*path: str) -> int | None:
        return lines.get(tuple(path))

    known = (*SECTIONS, *IGNORED_SECTIONS)
    unknown = [str(s) for s in data if not str(s).startswith("_") and s not in known]
    if unknown and not by_target and len(unknown) >= len([s for s in data if s in known]):
        return [], [Problem(f"read as a Megatron-Bridge ConfigContainer (model: beside train:/ddp:/dataset:/"
                        f"mixed_precision:), but most of its sections are not Bridge's: {', '.join(unknown)}",
                        file=file, fix="projection reads Megatron-Bridge's run_config.yaml, Megatron-LM, Primus, "
                                       "TorchTitan, HF config.json and its own scenario YAML; other tools' configs "
                                       "are not supported")]
    dropped, problems = [], []
    for s in unknown:
        close = difflib.get_close_matches(s, known, n=1)
        dropped.append(Problem(f"unknown Megatron-Bridge section {s!r}", file=file, line=at(s), key=s,
                                fix=f"did you mean {close[0]}?" if close else
                                f"use ConfigContainer's sections: {', '.join(SECTIONS)}"))
    for s in SECTIONS:
        value = data.get(s)
        if value is not None and not isinstance(value, dict) and not (s == "mixed_precision" and isinstance(value,
                                                                                                           str)):
            problems.append(Problem(f"section {s} must be a table of fields, not {value!r}", file=file, line=at(s),
                                    key=s, fix=f"write {s}: with its fields indented below it"))
    model = section(data, "model")
    dropped += _near_misses(data, at, file)
    if "num_layers" not in model:
        problems.append(Problem(
            "the model's shape is not in this file (no model.num_layers): a Megatron-Bridge recipe builds it in "
            "Python, which projection does not run", file=file, key="model", line=at("model"),
            fix="give the run_config.yaml Megatron-Bridge saves in each checkpoint (or the 'Task Configuration' it "
                "logs at start-up), or add the model's fields (model.num_layers, hidden_size, num_attention_heads, "
                "ffn_hidden_size, vocab_size, ...)"))
    for f in REQUIRED if "num_layers" in model else ():
        if model.get(f) is None:
            problems.append(Problem(f"model.{f} is {'null' if f in model else 'not given'}: the model has no shape "
                                    "without it", file=file, line=at("model", f), key=f"model.{f}",
                                    fix=f"give model.{f} (or --set model.{f}=N)"))
    dataset = section(data, "dataset")
    given = {k: dataset[k] for k in SEQUENCE if dataset.get(k) is not None}
    for k, v in list(given.items()):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            problems.append(Problem(f"dataset.{k} must be a whole number of tokens, got {shown(v)}", file=file,
                                    line=at("dataset", k), key=f"dataset.{k}", fix=f"give dataset.{k} as a number"))
            del given[k]
    if len(set(given.values())) > 1:
        problems.append(Problem(f"dataset.seq_length {given['seq_length']} and dataset.sequence_length "
                                f"{given['sequence_length']} disagree (one field: seq_length from Megatron-Bridge "
                                "0.6, sequence_length before)", file=file, line=at("dataset", "seq_length"),
                                key="dataset.seq_length", fix="keep one of them"))
    rows = model.get("seq_length") or 1024  # GPTModelProvider: the position table has seq_length rows
    if model.get("position_embedding_type", "learned_absolute") == "learned_absolute" and given and \
            isinstance(rows, int) and all(isinstance(v, int) and v > rows for v in given.values()):
        tokens = next(iter(given.values()))
        problems.append(Problem(f"learned positions: the table has model.seq_length = {rows} rows, fewer than the "
                                f"dataset's {tokens} tokens per sample (Megatron-Bridge asserts model.seq_length "
                                "equals the dataset's)", file=file, line=at("model", "seq_length") or at("model"),
                                key="model.seq_length", fix=f"set model.seq_length: {tokens}"))
    if not given and model.get("seq_length") is None:
        problems.append(Problem("no sequence length: neither dataset.seq_length (Megatron-Bridge 0.6; "
                                "dataset.sequence_length before) nor model.seq_length is given", file=file,
                                line=at("dataset"), key="dataset.seq_length",
                                fix="give the tokens per sample as dataset.seq_length (or --set dataset.seq_length=N)"))
    return dropped, problems


def _one_letter(a: str, b: str) -> bool:
    """One character replaced by another, not a digit by a digit (fp4_param / fp8_param are both real fields)."""
    diff = [(x, y) for x, y in zip(a, b, strict=False) if x != y] if len(a) == len(b) else []
    return len(diff) == 1 and not (diff[0][0].isdecimal() and diff[0][1].isdecimal())


def _near_misses(data: Mapping[str, Any], at: Any, file: str) -> list[Problem]:
    read: dict[str, set[str]] = {}
    for (s, f) in FIELDS:
        read.setdefault(s, set()).add(f)
    for s, fs in _ALSO_READ.items():
        read.setdefault(s, set()).update(fs)
    problems = []
    for s, names in read.items():
        table = data.get(s)
        for f in table if isinstance(table, dict) else ():
            meant = sorted(n for n in names if one_slip(str(f), n) or _one_letter(str(f), n))
            if str(f) not in names and meant:
                problems.append(Problem(f"unknown field {s}.{f} (Megatron-Bridge would refuse it)", file=file,
                                        line=at(s, str(f)), key=f"{s}.{f}", fix=f"did you mean {s}.{meant[0]}?"))
    return problems


# a Megatron-LM flag in a message or fix, with the "Megatron's " that may name it
_FLAG = re.compile(r"(?:Megatron(?:-LM)?'s )?--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
_SET = re.compile(r"--set ([a-z][a-z0-9_]*)=")  # a fix's `--set <argparse dest>=N`
# what Megatron-LM does that Megatron-Bridge does not, as a fix says it
_PHRASES = {"(Megatron pads it itself)": "(Megatron-Bridge pads it only with model.should_pad_vocab or a size "
                                         "taken from the tokenizer)"}
# Megatron-LM flags that no one Bridge field mirrors, as the fields that say the same (formats/bridge_args.py derives
# the first five from them; TransformerConfig / DistributedDataParallelConfig hold the rest)
_DERIVED = {
    "group_query_attention": "model.num_query_groups",
    "untie_embeddings_and_output_weights": "model.share_embeddings_and_output_weights false",
    "swiglu": "model.gated_linear_unit true with activation_func silu",
    "add_position_embedding": "model.position_embedding_type",
    "max_position_embeddings": "model.seq_length",
    "recompute_activations": "model.recompute_granularity selective",
    "accumulate_allreduce_grads_in_fp32": "ddp.grad_reduce_in_fp32",
    "grad_reduce_in_bf16": "ddp.grad_reduce_in_fp32 false",
    "cpu_offloading": "model.cpu_offloading",
    "window_size": "model.window_size",
    "window_attn_skip_freq": "model.window_attn_skip_freq",
}


def bridge_spelling(problems: Sequence[Problem]) -> list[Problem]:
    """Problems found by Megatron-LM's rules (shared with the Megatron loader and specs/validate.py) with each
    Megatron-LM flag in their message and fix written as the Megatron-Bridge field that sets it
    (`--pipeline-model-parallel-size` -> `model.pipeline_model_parallel_size`; an inverted flag as the field with
    `false`). Flags Bridge has no field for, and projection's own options (--set, --nodes), are left as they are."""

    def name_of(dest: str, null_tokenizer: bool) -> str | None:
        if dest == "vocab_size" and null_tokenizer:  # Bridge builds the NullTokenizer from tokenizer.vocab_size
            return "tokenizer.vocab_size"
        return ".".join(BRIDGE_NAMES[dest]) if dest in BRIDGE_NAMES else None

    def spell(text: str | None, null_tokenizer: bool) -> str | None:
        if text is None:
            return None

        def flag(match: re.Match[str]) -> str:
            dest, inverted = flag_to_dest(match.group(1))
            if dest in _DERIVED:
                return _DERIVED[dest]
            name = name_of(dest, null_tokenizer)
            if name is None:
                return match.group(0)
            return f"{name} false" if inverted else name

        def set_key(match: re.Match[str]) -> str:  # `--set <dest>=`, as Bridge's --set takes it
            name = name_of(match.group(1), null_tokenizer)
            return f"--set {name}=" if name else match.group(0)

        text = _SET.sub(set_key, text)
        text = _FLAG.sub(lambda m: m.group(0) if m.group(0) == "--set" else flag(m), text)
        for megatron, bridge in _PHRASES.items():
            text = text.replace(megatron, bridge)
        return text

    out = []
    for p in problems:
        null_tokenizer = "NullTokenizer" in p.message
        key = p.key
        if key is not None and not key.startswith("--") and "." not in key:
            key = name_of(key, null_tokenizer) or key
        elif key is not None and key.startswith("--") and key != "--set":
            key = spell(key, null_tokenizer)
        out.append(dataclasses.replace(p, message=spell(p.message, null_tokenizer) or p.message,
                                       fix=spell(p.fix, null_tokenizer), key=key))
    return out
