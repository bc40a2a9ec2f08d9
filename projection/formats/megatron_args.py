"""Megatron-LM argument tables: the argparse dests the loader reads, their defaults and types, the flag -> dest
mapping (with Megatron's renames and store_false flags), value coercion, and the safe evaluation of list-expression
strings such as `--moe-layer-freq "([0]*3+[1]*58)"`.

Defaults are Megatron-LM's argparse defaults (config-formats.md §1.2-1.9; Megatron-LM `megatron/training/arguments.py`
and the dataclass-generated flags of `megatron/training/argument_utils.py`), not the dataclass defaults: where the two
differ (MLA kv_lora_rank 32 vs 512, q_lora_rank None vs 512, num_query_groups 1 vs None) the CLI value is used.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any, Literal

from projection.errors import shown

Kind = Literal["int", "float", "bool", "str", "list", "freq"]

# dest -> (kind, argparse default). Only the dests that feed the canonical scenario are listed; every other flag is
# kept in the args mapping but has no effect ("inert"), as unknown keys are for Megatron itself (Primus: §2.2 step 8).
DESTS: dict[str, tuple[Kind, Any]] = {
    # model shape (§1.2)
    "num_layers": ("int", None),
    "hidden_size": ("int", None),
    "ffn_hidden_size": ("int", None),
    "num_attention_heads": ("int", None),
    "group_query_attention": ("bool", False),
    "num_query_groups": ("int", 1),
    "kv_channels": ("int", None),
    "max_position_embeddings": ("int", None),
    "position_embedding_type": ("str", "learned_absolute"),
    "use_rotary_position_embeddings": ("bool", False),
    "add_position_embedding": ("bool", True),
    "rotary_base": ("float", 10000),
    "make_vocab_size_divisible_by": ("int", 128),
    "vocab_size": ("int", None),
    "tokenizer_type": ("str", None),
    "tokenizer_model": ("str", None),
    "vocab_file": ("str", None),
    "merge_file": ("str", None),
    "untie_embeddings_and_output_weights": ("bool", False),
    "normalization": ("str", "LayerNorm"),
    "swiglu": ("bool", False),
    "squared_relu": ("bool", False),
    "quick_geglu": ("bool", False),
    "add_bias_linear": ("bool", True),
    "add_qkv_bias": ("bool", False),
    "qk_layernorm": ("bool", False),
    # MLA (§1.8, CLI defaults)
    "multi_latent_attention": ("bool", False),
    "q_lora_rank": ("int", None),
    "kv_lora_rank": ("int", 32),
    "qk_head_dim": ("int", 128),
    "qk_pos_emb_head_dim": ("int", 64),
    "v_head_dim": ("int", 128),
    # MTP (§1.9) and MoE (§1.7)
    "mtp_num_layers": ("int", None),
    "num_experts": ("int", None),
    "moe_router_topk": ("int", 2),
    "moe_ffn_hidden_size": ("int", None),
    "moe_shared_expert_intermediate_size": ("int", None),
    "moe_shared_expert_gate": ("bool", False),
    "moe_expert_capacity_factor": ("float", None),
    "moe_token_dispatcher_type": ("str", "allgather"),
    "moe_enable_deepep": ("bool", False),
    "moe_flex_dispatcher_backend": ("str", "deepep"),
    "moe_pad_expert_input_to_capacity": ("bool", False),
    "moe_layer_freq": ("freq", 1),
    # training and precision (§1.3, §1.6)
    "seq_length": ("int", None),
    "micro_batch_size": ("int", None),
    "global_batch_size": ("int", None),
    "bf16": ("bool", False),
    # --first-last-layers-bf16 and its counts (Megatron-Core 0.12+ TransformerConfig; the counts default to 1)
    "first_last_layers_bf16": ("bool", False),
    "num_layers_at_start_in_bf16": ("int", 1),
    "num_layers_at_end_in_bf16": ("int", 1),
    "fp16": ("bool", False),
    "fp8": ("str", None),
    "fp8_recipe": ("str", "delayed"),
    "fp8_param_gather": ("bool", False),
    "fp8_amax_history_len": ("int", 1),
    # ROCm Megatron-LM's --no-fp8-weight-transpose-cache (store_false) and Primus's key of the opposite sense
    "fp8_weight_transpose_cache": ("bool", True),
    "no_fp8_weight_transpose_cache": ("bool", False),
    "optimizer": ("str", "adam"),
    "use_precision_aware_optimizer": ("bool", False),
    "main_grads_dtype": ("str", "fp32"),
    "main_params_dtype": ("str", "fp32"),
    "exp_avg_dtype": ("str", "fp32"),
    "exp_avg_sq_dtype": ("str", "fp32"),
    "grad_reduce_in_bf16": ("bool", False),
    "accumulate_allreduce_grads_in_fp32": ("bool", False),
    "moe_grouped_gemm": ("bool", False),
    "moe_permute_fusion": ("bool", False),
    "defer_embedding_wgrad_compute": ("bool", False),
    "wgrad_deferral_limit": ("int", 0),
    "cross_entropy_fusion_impl": ("str", "native"),
    "gradient_accumulation_fusion": ("bool", True),
    "log_params_norm": ("bool", False),
    "log_num_zeros_in_grad": ("bool", False),
    "check_for_nan_in_loss_and_grad": ("bool", True),
    "hidden_dropout": ("float", 0.1),
    "attention_dropout": ("float", 0.1),
    "attention_backend": ("str", "auto"),
    "use_flash_attn": ("bool", False),
    "transformer_impl": ("str", "transformer_engine"),
    "cross_entropy_loss_fusion": ("bool", False),
    # CUDA graphs (not modelled: said in the performance notes): Megatron-Core 0.16 TransformerConfig's
    # cuda_graph_impl (none, local, transformer_engine) and scope, and the deprecated flags it replaces
    "cuda_graph_impl": ("str", "none"),
    "cuda_graph_scope": ("list", None),
    "enable_cuda_graph": ("bool", False),
    "external_cuda_graph": ("bool", False),
    # read to say they are not modelled (megatron_kernels.unmodelled_options): fusions Megatron-LM turns on by
    # default (argparse store_false flags; Bridge's TransformerConfig field bias_activation_fusion) and MoE overlaps
    "apply_rope_fusion": ("bool", True),
    "bias_gelu_fusion": ("bool", True),
    "bias_swiglu_fusion": ("bool", True),
    "bias_activation_fusion": ("bool", True),
    "bias_dropout_fusion": ("bool", True),
    "masked_softmax_fusion": ("bool", True),
    "moe_shared_expert_overlap": ("bool", False),
    "delay_wgrad_compute": ("bool", False),
    # parallelism (§1.4)
    "tensor_model_parallel_size": ("int", 1),
    "sequence_parallel": ("bool", False),
    "pipeline_model_parallel_size": ("int", 1),
    "num_layers_per_virtual_pipeline_stage": ("int", None),
    "num_virtual_stages_per_pipeline_rank": ("int", None),
    "pipeline_model_parallel_layout": ("str", None),
    "decoder_first_pipeline_num_layers": ("int", None),
    "decoder_last_pipeline_num_layers": ("int", None),
    "account_for_embedding_in_pipeline_split": ("bool", False),
    "account_for_loss_in_pipeline_split": ("bool", False),
    "context_parallel_size": ("int", 1),
    "cp_comm_type": ("list", None),  # nargs="+", default ["p2p"]; one per layer when several
    "hierarchical_context_parallel_sizes": ("list", None),  # nargs="+", type=int: [a2a group, p2p ring] for a2a+p2p
    "window_size": ("list", None),  # nargs=2 (left, right): sliding-window attention
    "window_attn_skip_freq": ("str", None),  # full-attention layers among the windowed ones (not modelled)
    "expert_model_parallel_size": ("int", 1),
    "expert_tensor_parallel_size": ("int", None),
    "microbatch_group_size_per_vp_stage": ("int", None),
    "decoder_pipeline_manual_split_list": ("list", None),  # Primus (§2.3): decoder layers per pipeline rank
    "use_distributed_optimizer": ("bool", False),
    "use_tp_pp_dp_mapping": ("bool", False),
    "num_distributed_optimizer_instances": ("int", 1),
    "use_torch_fsdp2": ("bool", False),
    "use_megatron_fsdp": ("bool", False),
    # §1.4: no_shard at v0.14, optim_grads_params at HEAD; the fixtures are HEAD (d98e8a6), so HEAD's default.
    "data_parallel_sharding_strategy": ("str", "optim_grads_params"),
    # recompute and offload (§1.5); recompute_layer_ids is Primus's (§2.3)
    "recompute_granularity": ("str", None),
    "recompute_activations": ("bool", False),
    "recompute_method": ("str", None),
    "recompute_num_layers": ("int", None),
    "recompute_modules": ("list", None),
    "recompute_layer_ids": ("list", None),
    "moe_layer_recompute": ("bool", False),
    "distribute_saved_activations": ("bool", False),
    "optimizer_cpu_offload": ("bool", False),
    "optimizer_offload_fraction": ("float", 1.0),
    "cpu_offloading": ("bool", False),
    "cpu_offloading_num_layers": ("int", 0),
    "fine_grained_activation_offloading": ("bool", False),
    "offload_modules": ("list", None),
    # Primus pipeline schedules (primus/configs/modules/megatron/zero_bubble.yaml, primus_pipeline.yaml)
    "patch_zero_bubble": ("bool", False),
    "enable_zero_bubble": ("bool", True),
    "zero_bubble_v_schedule": ("bool", False),
    "zero_bubble_v_schedule_mem_setup": ("str", "half"),
    "zero_bubble_max_pending_backward": ("str", "auto"),
    "patch_primus_pipeline": ("bool", False),
    "enable_1f1b_v": ("bool", False),
    "pp_algorithm": ("str", "1f1b-interleaved"),
    # overlap (§1.4)
    "overlap_grad_reduce": ("bool", False),
    "align_grad_reduce": ("bool", True),  # --no-align-grad-reduce
    "overlap_param_gather": ("bool", False),
    "tp_comm_overlap": ("bool", False),
    "overlap_moe_expert_parallel_comm": ("bool", False),
    "overlap_p2p_comm": ("bool", True),
}

# Dests whose values are only matched by name (a tokenizer file name): an unresolved shell variable in the directory
# part does not stop the loader.
NAME_ONLY_DESTS = frozenset({"tokenizer_model", "vocab_file", "merge_file"})

# Other spellings of a dest: generated-era names (§1.1: `--num-experts` writes num_moe_experts at HEAD) and the
# older Megatron-FSDP flag (`--use-custom-fsdp`, §1.4).
DEST_ALIASES: dict[str, str] = {
    "num_moe_experts": "num_experts",
    "use_custom_fsdp": "use_megatron_fsdp",
}

# Flags whose dest is not the flag's own name (§1.1 renames). value: (dest, inverted).
FLAG_RENAMES: dict[str, tuple[str, bool]] = {
    "disable-bias-linear": ("add_bias_linear", True),
    "no-gradient-accumulation-fusion": ("gradient_accumulation_fusion", True),
    "no-rope-fusion": ("apply_rope_fusion", True),
    "no-overlap-p2p-communication": ("overlap_p2p_comm", True),
    "overlap-p2p-communication": ("overlap_p2p_comm", False),
    "no-position-embedding": ("add_position_embedding", True),
    "norm-epsilon": ("layernorm_epsilon", False),
    "apply-layernorm-1p": ("layernorm_zero_centered_gamma", False),
    "fp8-format": ("fp8", False),
    "fp4-format": ("fp4", False),
    "num-experts": ("num_experts", False),
    "use-custom-fsdp": ("use_megatron_fsdp", False),
    # arguments.py: dest='microbatch_group_size_per_vp_stage'
    "microbatch-group-size-per-virtual-pipeline-stage": ("microbatch_group_size_per_vp_stage", False),
}


def flag_to_dest(flag: str) -> tuple[str, bool]:
    """'--x-y' (or 'x-y') -> (dest, inverted). Generated bool fields with default True are store_false flags spelled
    `--no-<name>` or `--disable-<name>` (§1.1); other flags map to their own name with '-' -> '_'."""
    name = flag.lstrip("-")
    if name in FLAG_RENAMES:
        return FLAG_RENAMES[name]
    for prefix in ("no-", "disable-"):
        if name.startswith(prefix):
            base = canonical_dest(name[len(prefix):].replace("-", "_"))
            if DESTS.get(base, ("", None)) == ("bool", True):
                return base, True
    return canonical_dest(name.replace("-", "_")), False


def canonical_dest(dest: str) -> str:
    return DEST_ALIASES.get(dest, dest)


def is_bool_dest(dest: str) -> bool:
    return DESTS.get(dest, ("", None))[0] == "bool"


def takes_one_value(dest: str) -> bool:
    """Known scalar dests take one value on a command line; list dests and unknown flags take every value given."""
    kind = DESTS.get(dest, ("list", None))[0]
    return kind not in ("list", "bool")


# ------------------------------------------------------------------------------------------------------ coercion


class ArgValueError(ValueError):
    """A value that does not fit its dest's type; the message says what was expected."""


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0", ""}


def coerce(dest: str, value: Any) -> Any:
    """Convert a value as written (YAML scalar, shell word, Primus key) to the dest's Python type. None stays None."""
    kind = DESTS[dest][0]
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null") and kind != "bool"):
        return None
    if kind == "bool":
        return to_bool(value)
    if kind == "int":
        return to_int(value)
    if kind == "float":
        return to_float(value)
    if kind == "list":
        return to_list(value)
    if kind == "freq":
        return moe_layer_freq(value)
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def to_bool(value: Any) -> bool:
    """Megatron keys can arrive as ints or strings where a bool is expected (`sequence_parallel: 1`, §8.2 trap 13)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ArgValueError(f"expected true/false, got {shown(value)}")


def _bare(value: Any) -> str:
    """How a bool given where a value is needed reads: True is also a flag written with no value."""
    return "no value (a bare flag) or true" if value is True else shown(value)


def to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ArgValueError(f"expected an integer, got {_bare(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ArgValueError(f"expected an integer, got {shown(value)}")


def to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ArgValueError(f"expected a number, got {_bare(value)}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ArgValueError(f"expected a number, got {shown(value)}")


def to_list(value: Any) -> list[str]:
    """A nargs='+' value: a list, or one string such as 'core_attn mlp' or '[layernorm mla_up_proj]' (the
    functional-test YAML spelling)."""
    if isinstance(value, list | tuple):
        return [str(v).strip("[],") for v in value if str(v).strip("[],")]
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [part.strip("'\"") for part in text.replace(",", " ").split() if part.strip("'\"")]


def int_list(value: Any) -> list[int]:
    """A list of ints given as a list, a list-expression string ('[0,1,2]', '([1]*4)') or space-separated ints."""
    if isinstance(value, str) and "[" in value:
        return eval_list_expression(value)
    items = value if isinstance(value, list | tuple) else to_list(value)
    return [to_int(v) for v in items]


def moe_layer_freq(value: Any) -> int | list[int]:
    """Megatron `moe_freq_type`: an int N, or a string containing '[' that is a Python list expression (§1.7)."""
    if isinstance(value, list | tuple):
        return [to_int(v) for v in value]
    if isinstance(value, str) and "[" in value:
        return eval_list_expression(value)
    return to_int(value)


# ------------------------------------------------------------------------------------- safe list expressions

_MAX_LIST = 1_000_000  # longest list a list expression may build (a layer pattern has one entry per layer)


def eval_list_expression(text: str) -> list[int]:
    """Evaluate a list expression such as '([0]*3+[1]*58)' without eval(): parsed with `ast`, allowing only list
    literals, integer constants, '+' and '*'. Anything else (names, calls, attributes...) raises ArgValueError."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ArgValueError(f"{text!r} is not a list expression such as ([0]*3+[1]*58)") from None
    result = _eval_node(tree.body, text)
    if not isinstance(result, list):
        raise ArgValueError(f"{text!r} does not evaluate to a list")
    return result


def _eval_node(node: ast.AST, text: str) -> int | list[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_eval_node(e, text) for e in node.elts]
        if not all(isinstance(i, int) for i in items):
            raise ArgValueError(f"{text!r}: list elements must be integers")
        return [i for i in items if isinstance(i, int)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
        left, right = _eval_node(node.left, text), _eval_node(node.right, text)
        if isinstance(node.op, ast.Add):
            if isinstance(left, list) and isinstance(right, list):
                return _checked(left + right, text)
            if isinstance(left, int) and isinstance(right, int):
                return left + right
            raise ArgValueError(f"{text!r}: '+' needs two lists or two integers")
        if isinstance(left, int) and isinstance(right, int):
            if abs(left * right) > _MAX_LIST * 1000:
                raise ArgValueError(f"{text!r}: number too large")
            return left * right
        lst, times = (left, right) if isinstance(left, list) else (right, left)
        if not isinstance(lst, list) or not isinstance(times, int):
            raise ArgValueError(f"{text!r}: '*' needs a list and an integer")
        if len(lst) * max(times, 0) > _MAX_LIST:
            raise ArgValueError(f"{text!r}: the list would have more than {_MAX_LIST} entries")
        return lst * times
    raise ArgValueError(f"{text!r}: only list literals, integers, '+' and '*' are allowed "
                        f"(found {type(node).__name__})")


def _checked(lst: list[int], text: str) -> list[int]:
    if len(lst) > _MAX_LIST:
        raise ArgValueError(f"{text!r}: the list would have more than {_MAX_LIST} entries")
    return lst


def merged(args: Mapping[str, Any]) -> dict[str, Any]:
    """Args with alias dests folded into their canonical names (the canonical spelling wins if both are given)."""
    out: dict[str, Any] = {}
    for dest, value in args.items():
        canon = canonical_dest(dest)
        if canon != dest and canon in args:
            continue
        out[canon] = value
    return out
