"""Megatron-Bridge `ConfigContainer` YAML -> RawScenario, through Megatron's own mapping (`args_to_raw`).

The file is the one Megatron-Bridge writes and prints: `run_config.yaml` in each checkpoint, the "Task Configuration"
block logged at start-up (`ConfigContainer.to_yaml`), or a hand-written YAML of the same sections (`model:`, `train:`,
`dataset:`, `ddp:`, `optimizer:`, `mixed_precision:`, `comm_overlap:`, `dist:`, `tokenizer:`; config-formats.md §4).
`model:` is a GPTModelProvider, i.e. a Megatron-Core TransformerConfig, so its fields are Megatron-Core's; each read
field is mapped to the Megatron-LM argparse dest of the same meaning and the rest of the conversion is Megatron's.

Where the dataclass path differs from the argparse path, Megatron-Bridge's rule is applied and its origin says so
(the field mapping's own rules: formats/bridge_args.py):
* the vocabulary is padded (make_vocab_size_divisible_by x tp) only with `model.should_pad_vocab`, or when
  model.vocab_size is null and the tokenizer's size is taken (training setup), or with
  `tokenizer.use_tokenizer_vocab_size`;
* gradient_accumulation_fusion defaults to True (GPTModelProvider, with Transformer Engine), cross_entropy_loss_fusion
  to True, the grad buckets' NaN checks to False (DistributedDataParallelConfig.check_for_nan_in_grad) and the
  loss's to True (RerunStateMachineConfig.check_for_nan_in_loss);
* main gradients are fp32 only with `ddp.grad_reduce_in_fp32` (DistributedDataParallelConfig; default False), not
  forced on by bf16 as Megatron-LM's validate_args does;
* the tokens per sample are the dataset's (`dataset.sequence_length` up to Bridge 0.5, `dataset.seq_length` from
  0.6), what the data loader feeds; `model.seq_length` (the position table's length) stands in when it gives none;
* mixed_precision (a MixedPrecisionConfig or a recipe name) and comm_overlap are applied over model / ddp /
  optimizer, and the distributed-optimizer and Megatron-FSDP flags synchronised, as Megatron-Bridge does before
  training (formats/bridge_setup.py).
Values serialised as `{_target_: torch.bfloat16}` (dtypes, the activation function, AttnBackend) are read back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem, ProjectionError
from projection.formats.bridge_args import activation, bridge_args, grad_reduce_in_fp32
from projection.formats.bridge_checks import apply_overrides, bridge_spelling, structure_problems
from projection.formats.bridge_fields import BRIDGE_NAMES, is_bridge, section
from projection.formats.bridge_setup import apply_setup
from projection.formats.common import coerce_scalar, load_yaml
from projection.formats.megatron import SET_ORIGIN, args_to_raw
from projection.formats.megatron_model import DEFAULT_FILE
from projection.specs.scenario import Origin, RawScenario

FRAMEWORK = "megatron-bridge"
BRIDGE_DEFAULT_FILE = "default (Megatron-Core / Megatron-Bridge dataclasses)"
Origins = Mapping[tuple[str, ...], Origin]


def load_bridge(path: Path, overrides: Mapping[str, Any] | None = None) -> RawScenario:
    """Read a Megatron-Bridge ConfigContainer YAML. `overrides` (--set) use Bridge's Hydra spelling
    (`model.tensor_model_parallel_size=4`, `train.global_batch_size=512`, `mixed_precision=bf16_mixed`), or
    projection's `training.*` / `plan.*`. Problems name Bridge's fields, not Megatron-LM's flags."""
    try:
        return _load(Path(path), overrides)
    except ProjectionError as err:
        raise type(err)(bridge_spelling(err.problems)) from None


def _load(path: Path, overrides: Mapping[str, Any] | None) -> RawScenario:
    file = str(path)
    data, lines = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(Problem("a Megatron-Bridge config is a mapping of sections", file=file,
                                  fix="give the run_config.yaml Megatron-Bridge writes (model:, train:, ...)"))
    by_target = str(data.get("_target_", "")).startswith("megatron.bridge.")
    origins = {k: Origin(file, line, ".".join(k)) for k, line in lines.items()}
    # keys that name nothing (misspelt --set keys, sections and fields) are dropped and reported with every other
    # problem, the layout's included (build_scenario), so a misspelt key does not hide them
    canonical, unknown = apply_overrides(data, origins, overrides or {})
    dropped, problems = structure_problems(data, lines, file, by_target)
    unknown += dropped
    if not problems:
        problems += apply_setup(data, origins, file)
    if not problems:
        problems += _bridge_refusals(data, origins, file)
    if problems:
        raise ConfigError([*unknown, *problems])
    try:
        args, arg_origins = bridge_args(data, origins, file)
        raw = args_to_raw(args, arg_origins, source=file, framework=FRAMEWORK, null_tokenizer_adds_eod=False)
    except ConfigError as err:
        raise ConfigError([*unknown, *err.problems]) from None
    _after(data, origins, raw, file)
    for key, value in canonical.items():
        raw.set(key, coerce_scalar(value) if isinstance(value, str) else value, Origin(SET_ORIGIN, None, key))
    vocab = _vocab_problem(raw)
    if vocab is not None:
        raise ConfigError([*unknown, vocab])
    raw.deferred += unknown
    return raw


def _bridge_refusals(data: Mapping[str, Any], origins: Origins, file: str) -> list[Problem]:
    """What Megatron-Bridge / Megatron-Core refuse at start-up that Megatron-LM's rules here do not check."""
    model, dist, ddp = data["model"], data["dist"], data["ddp"]

    def at(section: str, field: str, message: str, fix: str) -> Problem:
        o = origins.get((section, field), Origin(file, None, f"{section}.{field}"))
        return Problem(message, file=o.file, line=o.line, key=o.key, fix=fix)

    problems = []
    if dist.get("use_torch_fsdp2") and ddp.get("use_megatron_fsdp"):
        problems.append(at("dist", "use_torch_fsdp2", "PyTorch FSDP2 and Megatron-FSDP are both on (ConfigContainer."
                           "validate refuses it)", "keep one of dist.use_torch_fsdp2 and use_megatron_fsdp"))
    if model.get("sequence_parallel") and (model.get("tensor_model_parallel_size") or 1) == 1:
        problems.append(at("model", "sequence_parallel", "sequence parallelism without tensor parallelism "
                           "(Megatron-Core ModelParallelConfig refuses it)",
                           "set model.sequence_parallel false at tensor_model_parallel_size 1"))
    tok = section(data, "tokenizer")
    mine, theirs = model.get("vocab_size"), tok.get("vocab_size")
    if isinstance(mine, int) and isinstance(theirs, int) and mine < theirs:
        problems.append(at("model", "vocab_size", f"model.vocab_size {mine} is below the tokenizer's {theirs} "
                           "(training setup refuses it)", "give the tokenizer's size or more, or leave "
                           "model.vocab_size out to take the tokenizer's"))
    return problems


def _after(data: Mapping[str, Any], origins: Origins, raw: RawScenario, file: str) -> None:
    """What the dataclass path sets differently from Megatron-LM's argparse, on the canonical keys."""
    model = data["model"]
    for key, o in list(raw.origins.items()):  # the dataclasses' defaults, which equal argparse's for these keys
        if o.file == DEFAULT_FILE:
            named = BRIDGE_NAMES.get(o.key or "")
            raw.origins[key] = Origin(BRIDGE_DEFAULT_FILE, o.line, ".".join(named) if named else o.key)
    # the loss's NaN/Inf checks are the rerun state machine's (losses.masked_next_token_loss, called with
    # cfg.rerun_state_machine.check_for_nan_in_loss; RerunStateMachineConfig default True), apart from the grad
    # buckets' (ddp.check_for_nan_in_grad, read as check_for_nan_in_loss_and_grad)
    rerun = section(data, "rerun_state_machine")
    if "check_for_nan_in_loss" in rerun:
        loss_checks = rerun["check_for_nan_in_loss"]
        loss_checks = coerce_scalar(loss_checks) if isinstance(loss_checks, str) else loss_checks
        loss_checks = False if loss_checks is None else loss_checks  # None: `if check_for_nan_in_loss` is off
        if not isinstance(loss_checks, bool):
            o = origins.get(("rerun_state_machine", "check_for_nan_in_loss"), Origin(file))
            raise ConfigError(Problem(f"check_for_nan_in_loss must be true or false, got {loss_checks!r}",
                                      file=o.file, line=o.line, key="rerun_state_machine.check_for_nan_in_loss",
                                      fix="set rerun_state_machine.check_for_nan_in_loss: true or false"))
        raw.set("training.check_for_nan_in_loss", loss_checks,
                origins.get(("rerun_state_machine", "check_for_nan_in_loss"),
                            Origin(file, None, "rerun_state_machine.check_for_nan_in_loss")))
    else:
        raw.set("training.check_for_nan_in_loss", True,
                Origin("default (Megatron-Bridge RerunStateMachineConfig check_for_nan_in_loss True)", None,
                       "rerun_state_machine.check_for_nan_in_loss"))
    if not raw.get("training.optimizer.precision_aware"):  # main grads: fp32 iff grad_reduce_in_fp32
        fp32, o = grad_reduce_in_fp32(data, origins)
        raw.set("training.optimizer.main_grads_dtype", "fp32" if fp32 else raw.get("training.params_dtype"), o)
    # GPTModelProvider.provide pads by make_vocab_size_divisible_by x tp only with should_pad_vocab; training setup
    # (_validate_and_set_vocab_size) turns it on when model.vocab_size is null (the tokenizer's size is taken) or
    # tokenizer.use_tokenizer_vocab_size, off otherwise. A checkpoint's run_config.yaml holds the value set then.
    tokenizer = section(data, "tokenizer")
    if model.get("vocab_size") is None or tokenizer.get("use_tokenizer_vocab_size"):
        if tokenizer.get("vocab_size") is not None:
            o = origins[("tokenizer", "vocab_size")]
            raw.set("model.vocab_size", tokenizer["vocab_size"], o)
            raw.set("model.vocab_pad_with_tp", True, o)  # padded, the size being the tokenizer's
    elif not model.get("should_pad_vocab"):
        o = origins.get(("model", "should_pad_vocab"),
                        Origin("default (Megatron-Bridge GPTModelProvider should_pad_vocab False)", None,
                               "model.should_pad_vocab"))
        raw.set("model.vocab_divisible_by", 1, o)
        raw.set("model.vocab_pad_with_tp", False, o)
    gated, act = bool(model.get("gated_linear_unit")), activation(model)
    if act is not None and (act, gated) not in (("silu", True), ("quick_gelu", True), ("squared_relu", False),
                                                 ("gelu", False)):
        o = origins.get(("model", "activation_func"), origins.get(("model", "gated_linear_unit"), Origin(file)))
        raw.set("model.gated_mlp", gated, o)  # GEGLU, or a plain SiLU MLP: no Megatron-LM flag says so
        raw.set("model.activation", act, o)
    target, stem = str(model.get("_target_") or ""), Path(file).stem
    if stem in ("run_config", "config") and target:  # a checkpoint's file: name the model by its provider
        raw.set("model.name", target.rsplit(".", 1)[-1].removesuffix("Provider"),
                origins.get(("model", "_target_"), Origin(file, None, "model._target_")))
    else:
        raw.set("model.name", stem, Origin(file, None, "the file name"))


def _vocab_problem(raw: RawScenario) -> Problem | None:
    """An unpadded vocabulary that tensor parallelism does not divide: Megatron-Core's VocabParallelEmbedding cannot
    split it."""
    tp, vocab = raw.get("plan.tp") or 1, raw.get("model.vocab_size")
    if raw.get("model.vocab_pad_with_tp") is False and raw.get("model.vocab_divisible_by") == 1 \
            and isinstance(vocab, int) and isinstance(tp, int) and vocab % tp:
        o = raw.origins.get("model.vocab_size", Origin(raw.source))
        return Problem(f"the vocabulary, {vocab} rows unpadded (should_pad_vocab false), does not split over "
                       f"tensor_model_parallel_size {tp} (Megatron-Core's vocab-parallel embedding divides it)",
                       file=o.file, line=o.line, key=o.key, fix="set model.should_pad_vocab true, or a tp that divides "
                       "the vocabulary")
    return None


__all__ = ["FRAMEWORK", "is_bridge", "load_bridge"]
