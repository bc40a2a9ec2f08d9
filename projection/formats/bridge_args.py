"""A Megatron-Bridge ConfigContainer's fields (after Bridge's start-up changes, formats/bridge_setup.py) as the
Megatron-LM argparse dests of the same meaning, with their origins: what `args_to_raw` reads (formats/bridge.py).

Where the dataclass path differs from Megatron-LM's command line, Bridge's rule is applied here:
* ffn_hidden_size absent -> 4 x hidden even for gated units (TransformerConfig.__post_init__; no 8h/3 rule);
* gated_linear_unit + activation_func -> --swiglu / --quick-geglu / --squared-relu (other pairs: formats/bridge.py);
* num_query_groups alone is GQA; share_embeddings_and_output_weights is the inverse of --untie-...;
* activation offloading of whole layers only with model.cpu_offloading (TransformerBlock);
* learned absolute positions: a table of model.seq_length rows (GPTModelProvider.provide: max_sequence_length =
  seq_length, default 1024), Bridge having no max_position_embeddings;
* a pipeline layout with a virtual pipeline size it implies (TransformerConfig accepts both when they agree); the
  list-of-stages layout as Megatron's layout string;
* selective recompute ignores recompute_method (TransformerConfig refuses only recompute_num_layers with it);
* the dataclasses' defaults where they differ from argparse's (bridge_fields.BRIDGE_DEFAULTS), only for fields the
  file leaves out: a field written as null keeps the dataclass's None (an explicit `q_lora_rank: null` is MLA
  without query compression, not the 512 default)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from projection.errors import ConfigError, Problem
from projection.formats.bridge_fields import ACTIVATIONS, BRIDGE_DEFAULTS, BRIDGE_NAMES, FIELDS, read_target
from projection.formats.megatron_args import DESTS, is_bool_dest
from projection.specs.scenario import Origin
from projection.workload.stages import LayoutError, expand_layout

Put = Callable[[str, Any, Origin], None]
Origins = Mapping[tuple[str, ...], Origin]
_LAYER_SYMBOLS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}


def bridge_args(data: Mapping[str, Any], origins: Origins, file: str) -> tuple[dict[str, Any], dict[str, Origin]]:
    """Megatron dest -> value and origin (module docstring); raises ConfigError listing every problem."""
    args: dict[str, Any] = {}
    where: dict[str, Origin] = {}
    problems: list[Problem] = []

    def put(dest: str, value: Any, origin: Origin) -> None:
        args[dest], where[dest] = value, origin

    def origin(section: str, field: str) -> Origin:
        return origins.get((section, field), Origin(file, None, f"{section}.{field}"))

    nulls: dict[str, Origin] = {}  # fields written as null, by dest
    for (section, field), dest in FIELDS.items():
        table = data.get(section)
        if isinstance(table, dict) and field in table and table[field] is None:
            nulls.setdefault(dest, origin(section, field))
        if not isinstance(table, dict) or table.get(field) is None:
            continue
        try:
            value = read_target(table[field])
        except ValueError as e:
            o = origin(section, field)
            problems.append(Problem(str(e), file=o.file, line=o.line, key=o.key,
                                    fix="give the value as Megatron-Bridge writes it (a string, number or bool)"))
            continue
        if dest not in args or section == "dataset":
            put(dest, value, origin(section, field))
    for dest, o in nulls.items():  # a null the dataclass holds as None, unless another field gives the value
        if dest in args:
            continue
        if is_bool_dest(dest):  # None is off wherever the code tests the flag (`if config.<field>:`)
            put(dest, False, o)
        elif DESTS.get(dest, ("", None))[1] is None:  # the argparse default is None too: shown at the file's line
            where[dest] = o
    model, ddp = data["model"], data["ddp"]
    _activation(model, origins, file, put, problems)
    if model.get("multi_latent_attention"):
        # MLA has no query groups; TransformerConfig.__post_init__ sets num_query_groups = num_attention_heads, so
        # every MLA run_config.yaml holds one, which MLASelfAttention never reads
        args.pop("num_query_groups", None)
    elif model.get("num_query_groups") is not None:  # TransformerConfig: num_query_groups alone is GQA
        put("group_query_attention", True, origin("model", "num_query_groups"))
    if model.get("share_embeddings_and_output_weights") is not None:
        put("untie_embeddings_and_output_weights", not model["share_embeddings_and_output_weights"],
            origin("model", "share_embeddings_and_output_weights"))
    if model.get("ffn_hidden_size") is None and isinstance(model.get("hidden_size"), int):
        put("ffn_hidden_size", 4 * model["hidden_size"],
            Origin("default (Megatron-Core TransformerConfig: 4 x hidden_size, gated or not)", None,
                   "model.hidden_size"))
    if not model.get("cpu_offloading"):  # TransformerBlock offloads layers only with config.cpu_offloading
        args.pop("cpu_offloading_num_layers", None)
    if model.get("position_embedding_type", "learned_absolute") == "learned_absolute":
        length = model.get("seq_length")
        put("max_position_embeddings", length if isinstance(length, int) else 1024,
            origin("model", "seq_length") if length is not None else
            Origin("default (Megatron-Bridge GPTModelProvider seq_length 1024: the position table's rows)", None,
                   "model.seq_length"))
    _layout(model, origin, args, problems)
    if model.get("recompute_granularity") == "selective":
        args.pop("recompute_method", None)  # TransformerConfig ignores it under selective
        if args.pop("recompute_num_layers", None) is not None:
            o = origin("model", "recompute_num_layers")
            problems.append(Problem("selective recompute takes no recompute_num_layers (Megatron-Core "
                                    "TransformerConfig refuses it)", file=o.file, line=o.line, key=o.key,
                                    fix="drop model.recompute_num_layers, or use recompute_granularity full"))
    if ddp.get("use_megatron_fsdp") and ddp.get("keep_fp8_transpose_cache") is False:
        # DistributedDataParallelConfig.keep_fp8_transpose_cache: Megatron-FSDP's alone (default False): without it
        # the fp8 weights' transposes are made again in each backward
        put("fp8_weight_transpose_cache", False, origin("ddp", "keep_fp8_transpose_cache"))
    fp32, o = grad_reduce_in_fp32(data, origins)
    put("grad_reduce_in_bf16", not fp32, o)
    put("accumulate_allreduce_grads_in_fp32", fp32, o)
    for dest, (value, why) in BRIDGE_DEFAULTS.items():
        section, field = BRIDGE_NAMES.get(dest, ("model", dest))
        table = data.get(section)
        if dest not in args and not (isinstance(table, dict) and field in table):  # absent, not written as null
            put(dest, value, Origin(f"default ({why})", None, f"{section}.{field}"))
    if problems:
        raise ConfigError(problems)
    return args, where


def _activation(model: Mapping[str, Any], origins: Origins, file: str, put: Put, problems: list[Problem]) -> None:
    """gated_linear_unit + activation_func -> Megatron's --swiglu / --quick-geglu / --squared-relu."""
    gated = bool(model.get("gated_linear_unit"))
    kind = activation(model)
    o = origins.get(("model", "activation_func"), origins.get(("model", "gated_linear_unit"), Origin(file)))
    if kind is None:
        problems.append(Problem(f"activation function {model.get('activation_func')!r} is not modelled", file=o.file,
                                line=o.line, key="model.activation_func",
                                fix="use silu, gelu, quick_gelu or squared_relu"))
        return
    dest = {("silu", True): "swiglu", ("quick_gelu", True): "quick_geglu", ("squared_relu", False): "squared_relu"}
    if (kind, gated) in dest:
        put(dest[(kind, gated)], True, o)


def activation(model: Mapping[str, Any]) -> str | None:
    """The canonical activation of model.activation_func (TransformerConfig's default F.gelu); None if unknown."""
    try:
        act = read_target(model.get("activation_func")) or "gelu"
    except ValueError:
        return None
    return ACTIVATIONS.get(str(act).rsplit(".", 1)[-1])


def _layout(model: Mapping[str, Any], origin: Callable[[str, str], Origin], args: dict[str, Any],
            problems: list[Problem]) -> None:
    layout = model.get("pipeline_model_parallel_layout")
    if isinstance(layout, list):  # TransformerConfig takes a list of stages, each a list of layer-type names
        try:
            layout = "|".join("".join(_LAYER_SYMBOLS[str(t)] for t in stage) for stage in layout)
        except (KeyError, TypeError):
            o = origin("model", "pipeline_model_parallel_layout")
            problems.append(Problem("a pipeline layout given as a list holds one list of layer types per stage, of "
                                    f"{', '.join(_LAYER_SYMBOLS)}", file=o.file, line=o.line, key=o.key,
                                    fix="write the layout as Megatron's string (e.g. Et*4|t*4L) or such lists"))
            return
        args["pipeline_model_parallel_layout"] = layout
    vp = args.get("num_virtual_stages_per_pipeline_rank")
    if not isinstance(layout, str) or vp is None:
        return
    try:
        stages = len(expand_layout(layout))
    except LayoutError:
        return  # args_to_raw says why
    pp = model.get("pipeline_model_parallel_size") or 1
    if isinstance(pp, int) and stages == pp * vp:  # TransformerConfig.__post_init__ accepts both when they agree
        args.pop("num_virtual_stages_per_pipeline_rank")
        return
    o = origin("model", "virtual_pipeline_model_parallel_size")
    problems.append(Problem(f"virtual_pipeline_model_parallel_size {vp} disagrees with the layout's {stages} stages "
                            f"over pipeline size {pp} (Megatron-Core TransformerConfig)", file=o.file, line=o.line,
                            key=o.key, fix="drop the virtual pipeline size: the layout gives it"))


def grad_reduce_in_fp32(data: Mapping[str, Any], origins: Origins) -> tuple[bool, Origin]:
    """Megatron-Core's DDP keeps main grads in fp32 only with grad_reduce_in_fp32 (mixed_precision's is copied to
    ddp by bridge_setup)."""
    if data["ddp"].get("grad_reduce_in_fp32") is not None:
        return bool(data["ddp"]["grad_reduce_in_fp32"]), origins[("ddp", "grad_reduce_in_fp32")]
    return False, Origin("default (Megatron-Core DistributedDataParallelConfig grad_reduce_in_fp32 False)", None,
                         "ddp.grad_reduce_in_fp32")
