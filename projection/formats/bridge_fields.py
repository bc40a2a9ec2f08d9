"""The Megatron-Bridge ConfigContainer fields projection reads, each with the Megatron-LM argparse dest of the same
meaning (config-formats.md §4; NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py, models/
gpt_provider.py; Megatron-Core transformer_config.py, model_parallel_config.py, distributed_data_parallel_config.py,
optimizer_config.py). Order matters where two fields give one dest: the first present wins (ddp before optimizer,
model before tokenizer); mixed_precision and comm_overlap are applied to model / ddp / optimizer before
(formats/bridge_setup.py), as Megatron-Bridge's setup() does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SECTIONS = ("model", "train", "dataset", "ddp", "optimizer", "mixed_precision", "comm_overlap", "dist", "tokenizer",
            "logger", "rerun_state_machine")
# sections nothing here reads (checkpointing, schedules of the learning rate, logging sinks, fault tolerance)
IGNORED_SECTIONS = ("checkpoint", "scheduler", "rng", "profiling", "peft", "validation", "ft", "straggler",
                    "nvrx_straggler", "inprocess_restart", "env_vars", "tensor_inspect",
                    "optimizer_config_override_provider")  # the last: every run_config.yaml from Bridge 0.3.0 on

_SAME = {
    "model": (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
        "normalization", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "position_embedding_type", "rotary_base",
        "make_vocab_size_divisible_by", "vocab_size", "seq_length",
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
        "pipeline_model_parallel_layout", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split", "microbatch_group_size_per_vp_stage", "cp_comm_type",
        "hierarchical_context_parallel_sizes",
        "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
        "distribute_saved_activations", "cpu_offloading_num_layers", "fine_grained_activation_offloading",
        "offload_modules", "moe_ffn_hidden_size",
        "moe_router_topk", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate", "moe_layer_freq",
        "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_token_dispatcher_type",
        "moe_grouped_gemm", "moe_permute_fusion", "moe_enable_deepep", "moe_flex_dispatcher_backend",
        "moe_layer_recompute",
        "overlap_moe_expert_parallel_comm", "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
        "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers", "hidden_dropout", "attention_dropout",
        "attention_backend", "transformer_impl", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl",
        "gradient_accumulation_fusion", "tp_comm_overlap", "overlap_p2p_comm", "defer_embedding_wgrad_compute",
        "wgrad_deferral_limit", "bf16", "fp16", "fp8", "fp8_recipe", "fp8_amax_history_len",
        "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
        "cuda_graph_impl", "cuda_graph_scope", "enable_cuda_graph", "external_cuda_graph",
        "apply_rope_fusion", "bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion",
        "moe_shared_expert_overlap", "delay_wgrad_compute",
    ),
    "train": ("micro_batch_size", "global_batch_size"),
    "dataset": ("seq_length",),
    "ddp": ("use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
            "data_parallel_sharding_strategy", "use_megatron_fsdp", "num_distributed_optimizer_instances",
            "align_grad_reduce"),
    "optimizer": ("optimizer", "use_distributed_optimizer", "use_precision_aware_optimizer", "main_grads_dtype",
                  "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "optimizer_cpu_offload",
                  "optimizer_offload_fraction", "log_num_zeros_in_grad"),
    "dist": ("use_torch_fsdp2", "use_megatron_fsdp", "use_tp_pp_dp_mapping", "align_grad_reduce"),
    "tokenizer": ("vocab_size", "tokenizer_type", "tokenizer_model"),
    "logger": ("log_params_norm",),
}
_RENAMED = {
    ("model", "num_moe_experts"): "num_experts",
    ("model", "virtual_pipeline_model_parallel_size"): "num_virtual_stages_per_pipeline_rank",
    ("model", "num_layers_in_first_pipeline_stage"): "decoder_first_pipeline_num_layers",
    ("model", "num_layers_in_last_pipeline_stage"): "decoder_last_pipeline_num_layers",
    ("model", "fp8_param"): "fp8_param_gather",
    ("ddp", "fp8_param_gather"): "fp8_param_gather",
    # the grad-bucket NaN checks (DistributedDataParallelConfig, default False); the loss's check is the rerun state
    # machine's (formats/bridge.py reads rerun_state_machine.check_for_nan_in_loss)
    ("ddp", "check_for_nan_in_grad"): "check_for_nan_in_loss_and_grad",
    ("dataset", "sequence_length"): "seq_length",
}
FIELDS: dict[tuple[str, str], str] = {
    **{(s, f): f for s, names in _SAME.items() for f in names},
    **_RENAMED,
}

# Megatron-Bridge / Megatron-Core dataclass defaults that differ from Megatron-LM's argparse defaults
BRIDGE_DEFAULTS: dict[str, tuple[Any, str]] = {
    # GPTModelProvider: field(default_factory=fusions.can_enable_gradient_accumulation_fusion), True wherever
    # Transformer Engine (0.4 on) or apex's fused wgrad kernel (0.2, 0.3) imports; Megatron-FSDP turns it off
    "gradient_accumulation_fusion": (True, "Megatron-Bridge GPTModelProvider gradient_accumulation_fusion, True "
                                           "with Transformer Engine"),
    "check_for_nan_in_loss_and_grad": (False, "Megatron-Core DistributedDataParallelConfig check_for_nan_in_grad "
                                              "False"),
    "cross_entropy_loss_fusion": (True, "Megatron-Bridge GPTModelProvider cross_entropy_loss_fusion True"),
    "data_parallel_sharding_strategy": ("no_shard", "Megatron-Core DistributedDataParallelConfig "
                                        "data_parallel_sharding_strategy 'no_shard'"),
    "overlap_p2p_comm": (False, "Megatron-Core ModelParallelConfig overlap_p2p_comm False"),
    "optimizer_offload_fraction": (0.0, "Megatron-Core OptimizerConfig optimizer_offload_fraction 0.0"),
    "q_lora_rank": (512, "Megatron-Core MLATransformerConfig q_lora_rank 512"),
    "kv_lora_rank": (512, "Megatron-Core MLATransformerConfig kv_lora_rank 512"),
}

# activation_func's `_target_` (its last dotted name) -> the canonical activation
ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "relu": "relu", "quick_gelu": "quick_gelu",
               "squared_relu": "squared_relu", "fast_gelu": "gelu", "openai_gelu": "gelu"}

# megatron.core.transformer.enums.AttnBackend values, as `{_target_: ...AttnBackend, _args_: [n]}` serialises them
_ATTN_BACKENDS = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}
_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float": "fp32"}


# where each dest comes from in the file (the first of FIELDS that gives it): origins, messages, search keys
BRIDGE_NAMES: dict[str, tuple[str, str]] = {}
for (_section, _field), _dest in FIELDS.items():
    BRIDGE_NAMES.setdefault(_dest, (_section, _field))

# Megatron dest -> the Bridge field(s) a layout search sets for it (perf/search_reload.py): the distributed optimizer
# and Megatron-FSDP on both tables validate() synchronises; what Bridge has no field for, dropped
_SEARCH_KEYS: dict[str, tuple[str, ...]] = {
    "use_distributed_optimizer": ("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"),
    "use_megatron_fsdp": ("ddp.use_megatron_fsdp", "dist.use_megatron_fsdp"),
    "global_batch_size": ("train.global_batch_size",), "micro_batch_size": ("train.micro_batch_size",),
    "recompute_activations": (), "num_layers_per_virtual_pipeline_stage": (), "ckpt_format": (),
}


def bridge_keys(megatron: Mapping[str, Any]) -> dict[str, Any]:
    """Megatron argparse dests and values -> the Megatron-Bridge fields that set them."""
    out: dict[str, Any] = {}
    for dest, value in megatron.items():
        for key in _SEARCH_KEYS.get(dest, (".".join(BRIDGE_NAMES.get(dest, ("model", dest))),)):
            out[key] = value
    return out


def section(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A section's table, or an empty one where it is absent or not a table (bridge_checks reports the latter)."""
    value = data.get(name)
    return value if isinstance(value, dict) else {}


def is_bridge(data: Mapping[str, Any]) -> bool:
    """A Megatron-Bridge ConfigContainer: its _target_, or a `model:` table beside Bridge's own sections."""
    if str(data.get("_target_", "")).startswith("megatron.bridge."):
        return True
    return isinstance(data.get("model"), dict) and bool({"train", "ddp", "dataset", "mixed_precision"} & set(data))


def read_target(value: Any) -> Any:
    """A serialised object (`{_target_: torch.bfloat16, _call_: false}`, an AttnBackend, a function) as the plain
    value Megatron's argparse would hold; plain values unchanged. Raises ValueError for an object it cannot read."""
    if not isinstance(value, dict):
        if isinstance(value, str) and value.startswith("torch."):
            return _DTYPES.get(value.removeprefix("torch."), value)
        if isinstance(value, str) and value.startswith("AttnBackend."):
            return value.removeprefix("AttnBackend.")
        return value
    target = str(value.get("_target_", ""))
    last = target.rsplit(".", 1)[-1]
    if target.startswith("torch.") and last in _DTYPES:
        return _DTYPES[last]
    if last == "AttnBackend":
        args = value.get("_args_")
        arg = args[0] if isinstance(args, list) and args else None
        if arg in _ATTN_BACKENDS:
            return _ATTN_BACKENDS[arg]
        if isinstance(arg, str) and arg in _ATTN_BACKENDS.values():
            return arg
    if last in ACTIVATIONS:
        return target
    raise ValueError(f"cannot read the serialised object {target or value!r}")
