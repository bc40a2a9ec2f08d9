"""What Megatron-Bridge does to a ConfigContainer before it trains (`runtime_config_update`, then `validate()`),
applied to the YAML's tables so that the fields read afterwards are the ones the job ran with. Sources: Megatron-Bridge
training/config.py, training/mixed_precision.py, training/comm_overlap.py (releases 0.2.0rc6-0.6.2, read from their
wheels; README "Config formats").

1. mixed_precision (a MixedPrecisionConfig table, or a recipe name) overwrites every field of the same name on model,
   optimizer and ddp, None and False included (`update_config_with_precision_overrides`);
2. comm_overlap, when given, sets its computed defaults and the user's non-None values on model and ddp: the p2p
   overlap with a virtual pipeline, TP overlap only with tp >= 2 and sequence parallelism, and, with ddp's
   distributed optimizer (read before validate() synchronises it with optimizer's), grad-reduce and param-gather
   overlap (data-parallel size > 1 is assumed: at 1 they change nothing);
3. validate(): the distributed optimizer is on for both ddp and optimizer if either asks for it, Megatron-FSDP for
   both dist and ddp, and Megatron-FSDP turns gradient-accumulation fusion off (so does PyTorch FSDP2 here: its
   wrapper has no main-grad buffer to accumulate into)."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from projection.errors import Problem
from projection.formats.megatron_args import ArgValueError, to_bool
from projection.specs.scenario import Origin

Table = MutableMapping[str, Any]
Origins = MutableMapping[tuple[str, ...], Origin]

# MixedPrecisionConfig's defaults for the fields projection reads
MP_DEFAULTS: dict[str, Any] = {"bf16": False, "fp16": False, "fp8": None, "fp8_recipe": "tensorwise",
                               "fp8_param_gather": False, "fp8_amax_history_len": 1, "grad_reduce_in_fp32": True,
                               "first_last_layers_bf16": False, "num_layers_at_start_in_bf16": 0,
                               "num_layers_at_end_in_bf16": 0}
_BF16 = {"bf16": True, "fp16": False}
_FP16 = {"bf16": False, "fp16": True, "grad_reduce_in_fp32": False}
_DELAYED = {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_param_gather": True, "fp8_amax_history_len": 1024}
# the current-scaling recipes keep the first and last decoder layer in bf16 (mixed_precision.py, 0.3.1 l.272-356)
_CURRENT = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp8_param_gather": True, "first_last_layers_bf16": True,
            "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1}
_TWO_BF16 = {"num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 2}
_MX = {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True}
_SUBCHANNEL = {"fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": False}
# the recipes by name (get_mixed_precision_config; hyphens read as underscores)
MIXED_PRECISION_RECIPES: dict[str, dict[str, Any]] = {
    "bf16_mixed": _BF16, "fp16_mixed": _FP16,
    "bf16_with_fp8_delayed_scaling_mixed": {**_BF16, **_DELAYED}, "bf16_with_fp8_mixed": {**_BF16, **_DELAYED},
    "fp16_with_fp8_delayed_scaling_mixed": {**_FP16, **_DELAYED},
    "bf16_with_fp8_current_scaling_mixed": {**_BF16, **_CURRENT},
    "fp16_with_fp8_current_scaling_mixed": {**_FP16, **_CURRENT},
    "bf16_with_mxfp8_mixed": {**_BF16, **_MX}, "fp16_with_mxfp8_mixed": {**_FP16, **_MX},
    "bf16_with_fp8_subchannel_scaling_mixed": {**_BF16, **_SUBCHANNEL},
    "fp16_with_fp8_subchannel_scaling_mixed": {**_FP16, **_SUBCHANNEL},
    # Nemotron recipes: current scaling / blockwise with the first and last two layers in bf16
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": {**_BF16, **_CURRENT, **_TWO_BF16},
    "nanov2_bf16_with_fp8_current_scaling_mixed": {**_BF16, **_CURRENT, **_TWO_BF16, "fp8_recipe": "blockwise"},
}
_NOT_MODELLED = ("nvfp4",)  # bf16_with_nvfp4_mixed and the Nemotron variants: fp4 GEMMs are not priced
# the MixedPrecisionConfig fields each target has (megatron-core TransformerConfig / DistributedDataParallelConfig),
# as (the target's field, the MixedPrecisionConfig field it takes): fp8_param is kept equal to fp8_param_gather
_MP_TARGETS = {"model": (("bf16", "bf16"), ("fp16", "fp16"), ("fp8", "fp8"), ("fp8_recipe", "fp8_recipe"),
                         ("fp8_amax_history_len", "fp8_amax_history_len"), ("fp8_param", "fp8_param_gather"),
                         ("first_last_layers_bf16", "first_last_layers_bf16"),
                         ("num_layers_at_start_in_bf16", "num_layers_at_start_in_bf16"),
                         ("num_layers_at_end_in_bf16", "num_layers_at_end_in_bf16")),
               "ddp": (("grad_reduce_in_fp32", "grad_reduce_in_fp32"), ("fp8_param_gather", "fp8_param_gather"))}
_BOOLS = {"model": ("sequence_parallel",), "ddp": ("use_distributed_optimizer", "use_megatron_fsdp"),
          "optimizer": ("use_distributed_optimizer",), "dist": ("use_megatron_fsdp", "use_torch_fsdp2"),
          "comm_overlap": ("tp_comm_overlap",)}


def recipe_name(mp: Any) -> str | None:
    """The recipe a `mixed_precision` value names: a string, or a table that is a recipe function's `_target_`."""
    if isinstance(mp, str):
        return mp.replace("-", "_")
    if isinstance(mp, dict) and str(mp.get("_target_", "")).rsplit(".", 1)[-1] in MIXED_PRECISION_RECIPES:
        return str(mp["_target_"]).rsplit(".", 1)[-1]
    return None


def recipe_table(name: str) -> dict[str, Any] | None:
    """MixedPrecisionConfig's fields (those read) for a recipe name; None when unknown."""
    return {**MP_DEFAULTS, **MIXED_PRECISION_RECIPES[name]} if name in MIXED_PRECISION_RECIPES else None


def apply_setup(data: Table, origins: Origins, file: str) -> list[Problem]:
    """Apply Megatron-Bridge's start-up changes to `data` in place (origins follow); the problems it finds."""
    problems: list[Problem] = []
    for section in ("model", "ddp", "optimizer", "dist"):
        if not isinstance(data.get(section), dict):
            data[section] = {}
    _coerce_bools(data, origins, file, problems)
    _mixed_precision(data, origins, file, problems)
    _comm_overlap(data, origins, file)
    _sync(data, origins, "use_distributed_optimizer", ("ddp", "optimizer"))
    _sync(data, origins, "use_megatron_fsdp", ("dist", "ddp"))
    if data["ddp"].get("use_megatron_fsdp"):  # validate(): Megatron-FSDP runs without gradient-accumulation fusion
        _set(data, origins, "model", "gradient_accumulation_fusion", False, origins[("ddp", "use_megatron_fsdp")])
    elif data["dist"].get("use_torch_fsdp2"):
        # Megatron-Core's TorchFullyShardedDataParallel keeps no main_grad buffer for the fused weight-gradient
        # accumulation (Megatron-LM's validate_args refuses the two together)
        _set(data, origins, "model", "gradient_accumulation_fusion", False, origins[("dist", "use_torch_fsdp2")])
    return problems


def _set(data: Table, origins: Origins, section: str, field: str, value: Any, origin: Origin) -> None:
    data[section][field] = value
    origins[(section, field)] = origin


def _mixed_precision(data: Table, origins: Origins, file: str, problems: list[Problem]) -> None:
    mp = data.get("mixed_precision")
    if mp is None:
        return
    here = origins.get(("mixed_precision",), Origin(file, None, "mixed_precision"))
    name = recipe_name(mp)
    if name is not None:
        if any(n in name for n in _NOT_MODELLED):
            problems.append(Problem(f"mixed-precision recipe {mp!r}: fp4 GEMMs are not modelled", file=here.file,
                                    line=here.line, key="mixed_precision",
                                    fix="project the job with an fp8 or bf16 recipe (e.g. "
                                        "bf16_with_mxfp8_mixed) and read the result as an upper bound"))
            return
        if name not in MIXED_PRECISION_RECIPES:
            problems.append(Problem(f"unknown mixed-precision recipe {mp!r}", file=here.file, line=here.line,
                                    key="mixed_precision", fix="use one of " + ", ".join(MIXED_PRECISION_RECIPES)))
            return
        values = recipe_table(name) or {}
        where: Callable[[str], Origin] = lambda _f: here  # noqa: E731
    elif isinstance(mp, dict):
        values = {**MP_DEFAULTS, **{k: v for k, v in mp.items() if k in MP_DEFAULTS}}
        if mp.get("fp8_param") is not None and "fp8_param_gather" not in mp:
            values["fp8_param_gather"] = mp["fp8_param"]  # kept in sync by MixedPrecisionConfig.__setattr__
        if mp.get("fp4") is not None:
            o = origins.get(("mixed_precision", "fp4"), here)
            problems.append(Problem("mixed_precision.fp4: fp4 GEMMs are not modelled", file=o.file, line=o.line,
                                    key="mixed_precision.fp4", fix="set fp4 to null (an fp8 recipe, priced as such)"))

        def where(f: str) -> Origin:
            return origins.get(("mixed_precision", f), Origin(
                "default (Megatron-Bridge MixedPrecisionConfig)", None, f"mixed_precision.{f}"))
    else:
        problems.append(Problem("mixed_precision must be a recipe name or a table", file=here.file, line=here.line,
                                key="mixed_precision", fix="e.g. mixed_precision: bf16_mixed"))
        return
    for section, pairs in _MP_TARGETS.items():
        for target, f in pairs:
            _set(data, origins, section, target, values[f], where(f))


def _comm_overlap(data: Table, origins: Origins, file: str) -> None:
    co = data.get("comm_overlap")
    if not isinstance(co, dict):
        return
    model, ddp = data["model"], data["ddp"]
    here = origins.get(("comm_overlap",), Origin(file, None, "comm_overlap"))
    # a size that is not a whole number is refused with the layout (Megatron's argument check): 1 here
    pp, vp, tp = (_whole(model.get(f)) for f in ("pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                                                "tensor_model_parallel_size"))

    def pick(field: str, default: Any) -> tuple[Any, Origin]:
        if co.get(field) is not None:
            return co[field], origins.get(("comm_overlap", field), here)
        return default, Origin("default (Megatron-Bridge CommOverlapConfig.setup)", None, f"comm_overlap.{field}")

    tp_overlap, o = pick("tp_comm_overlap", False)
    if tp < 2 or not model.get("sequence_parallel"):  # setup: TP overlap needs tp >= 2 and sequence parallelism
        tp_overlap = False
    _set(data, origins, "model", "tp_comm_overlap", bool(tp_overlap), o)
    _set(data, origins, "model", "overlap_p2p_comm", *pick("overlap_p2p_comm", pp > 1 and vp > 1))
    for field, default in (("defer_embedding_wgrad_compute", False), ("overlap_moe_expert_parallel_comm", False),
                           ("delay_wgrad_compute", False)):
        _set(data, origins, "model", field, *pick(field, default))
    if co.get("wgrad_deferral_limit") is not None:
        _set(data, origins, "model", "wgrad_deferral_limit", *pick("wgrad_deferral_limit", 0))
    if ddp.get("use_distributed_optimizer"):  # setup() reads ddp's flag, before validate() synchronises the two
        for field in ("overlap_grad_reduce", "overlap_param_gather"):
            _set(data, origins, "ddp", field, *pick(field, True))


def _coerce_bools(data: Table, origins: Origins, file: str, problems: list[Problem]) -> None:
    """The flags the start-up rules branch on, as booleans ('false' is false); anything else is a problem."""
    for section, names in _BOOLS.items():
        table = data.get(section)
        if not isinstance(table, dict):
            continue
        for f in names:
            if table.get(f) is None or isinstance(table[f], bool):
                continue
            try:
                table[f] = to_bool(table[f])
            except ArgValueError:
                o = origins.get((section, f), Origin(file, None, f"{section}.{f}"))
                problems.append(Problem(f"{section}.{f} must be true or false, not {table[f]!r}", file=o.file,
                                        line=o.line, key=f"{section}.{f}", fix="write true or false"))


def _sync(data: Table, origins: Origins, field: str, sections: tuple[str, str]) -> None:
    """validate(): either section asking for `field` turns it on in both."""
    on = [s for s in sections if data[s].get(field)]
    if on:
        for s in sections:
            _set(data, origins, s, field, True, origins.get((on[0], field), Origin("validate()", None, field)))


def _whole(value: Any) -> int:
    """A parallel size as a whole number >= 1; 1 for anything else (null, a string, a list: reported elsewhere)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1
