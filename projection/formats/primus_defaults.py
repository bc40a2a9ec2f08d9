"""Built-in Primus presets, used when no Primus checkout is given (`primus_root=None`).

Every value below is copied from AMD-AGI/Primus @fd1eeab, `primus/configs/<file>`, with the 1-based line that sets it
there, so provenance can name the exact place (config-formats.md §2.3, §3.6). Only keys that matter for memory or
step-time modelling are kept; everything else in those files (logging, checkpointing, data paths ...) is inert for
a projection. tests/oracle/test_primus_fixtures.py checks every (value, line) against the real files.

Layers are applied in order, later ones winning, which reproduces the `extends` chains:
* megatron `pre_trainer.yaml` extends `trainer_base.yaml`, which extends `../module_base.yaml`,
  `primus_megatron_module.yaml`, `primus_turbo.yaml`, `torch_compile.yaml`, `zero_bubble.yaml`,
  `primus_pipeline.yaml`; `sft_trainer.yaml` extends `trainer_base.yaml` too;
* torchtitan `pre_trainer.yaml` extends `../module_base.yaml` and `quantize.yaml`.

Precedence consequence (config-formats.md §2.2 step 6, §2.6): a model preset's top-level key that also exists in the
module config is dropped. With these module layers that affects, among the modelling keys: `seq_length` (the module
says 1024 for pre_trainer, 2048 for sft), `make_vocab_size_divisible_by` (128), `micro_batch_size` /
`global_batch_size`, `use_flash_attn`, `enable_experimental`, the precision keys (`bf16`, `fp8*`), the recompute and
overlap keys, and the `use_turbo_*` switches: set them in the experiment's `overrides`, not in a model preset.

`MODEL_BASE` is the model-side base every Primus Megatron preset reaches through its chain (`<model>` -> ... ->
`llama_base.yaml` -> `language_model.yaml` -> `primus_megatron_model.yaml`; config-formats.md §2.3: "all end in
llama_base"). It is laid under presets read from our own `models/` folder, so a self-contained preset gets what a
Primus preset of the same name would inherit (dropout 0, swiglu, no linear biases, untied embeddings,
sequence_parallel true ...) rather than Megatron's argparse defaults; keys the preset states win. Shape keys
(num_layers, hidden_size, num_attention_heads) are left out on purpose: a preset without them should fail loudly
instead of becoming Primus's 24 x 1024 toy model.
"""

from __future__ import annotations

from typing import Any

PRIMUS_COMMIT = "fd1eeab"
ORIGIN_PREFIX = f"primus@{PRIMUS_COMMIT}:primus/configs/"

Entry = tuple[Any, int]
"""(value, 1-based line in the Primus file)."""
Layer = tuple[str, dict[str, Entry]]
"""(file relative to primus/configs, {dotted key: entry})."""

_TRAINER_BASE: Layer = ("modules/megatron/trainer_base.yaml", {
    "micro_batch_size": (2, 17), "global_batch_size": (128, 19), "rampup_batch_size": (None, 20),
    "make_vocab_size_divisible_by": (128, 25), "use_flash_attn": (False, 32), "fp16": (False, 39),
    "bf16": (True, 40), "grad_reduce_in_bf16": (False, 41), "calculate_per_token_loss": (False, 42),
    "accumulate_allreduce_grads_in_fp32": (False, 48), "fp16_lm_cross_entropy": (False, 49), "fp8": (None, 52),
    "fp8_recipe": ("delayed", 54), "fp8_amax_history_len": (1024, 56), "fp8_amax_compute_algo": ("max", 57),
    "fp8_wgrad": (True, 58), "fp8_param_gather": (False, 59), "fp4": (None, 64), "fp4_recipe": ("nvfp4", 65),
    "fp4_param": (False, 66), "first_last_layers_bf16": (False, 68), "num_layers_at_start_in_bf16": (1, 69),
    "num_layers_at_end_in_bf16": (1, 70), "optimizer": ("adam", 73), "optimizer_cpu_offload": (False, 113),
    "optimizer_offload_fraction": (1.0, 114), "use_torch_optimizer_for_cpu_offload": (False, 115),
    "overlap_cpu_optimizer_d2h_h2d": (False, 116), "overlap_p2p_comm": (True, 161),
    "defer_embedding_wgrad_compute": (False, 164), "wgrad_deferral_limit": (0, 165), "ddp_num_buckets": (None, 167),
    "ddp_bucket_size": (None, 168), "overlap_grad_reduce": (False, 171), "overlap_param_gather": (False, 172),
    "overlap_param_gather_with_optimizer_step": (False, 173),
    "account_for_embedding_in_pipeline_split": (False, 179), "account_for_loss_in_pipeline_split": (False, 180),
    "empty_unused_memory_level": (0, 181), "standalone_embedding_stage": (False, 182),
    "use_distributed_optimizer": (False, 183), "use_custom_fsdp": (False, 186), "use_megatron_fsdp": (False, 187),
    "data_parallel_sharding_strategy": ("no_shard", 189), "num_distributed_optimizer_instances": (1, 193),
    "data_parallel_replicate_degree": (1, 194), "use_torch_fsdp2": (False, 195),
    "overlap_moe_expert_parallel_comm": (False, 235), "recompute_activations": (False, 249),
    "recompute_granularity": (None, 250), "recompute_method": (None, 251), "recompute_num_layers": (None, 252),
    "distribute_saved_activations": (False, 253), "checkpoint_activations": (False, 254), "mock_data": (False, 271),
    "seq_length": (4096, 287), "encoder_seq_length": (None, 288), "decoder_seq_length": (None, 289),
    "enable_experimental": (False, 355), "use_precision_aware_optimizer": (False, 370),
    "main_grads_dtype": ("fp32", 371), "main_params_dtype": ("fp32", 372), "exp_avg_dtype": ("fp32", 373),
    "exp_avg_sq_dtype": ("fp32", 374), "enable_cuda_graph": (False, 429), "cuda_graph_scope": ("full", 432),
})

# The files trainer_base.yaml extends, in its order (its own keys, above, go on top of them).
_TRAINER_BASE_EXTENDS: tuple[Layer, ...] = (
    ("modules/megatron/primus_megatron_module.yaml", {
        "no_fp8_weight_transpose_cache": (False, 80), "decoder_pipeline_manual_split_list": (None, 83),
        "patch_moe_overlap": (False, 86), "pp_warmup": (False, 89), "recompute_layer_ids": (None, 98),
        "moe_router_force_load_balancing_type": ("even", 106),
    }),
    ("modules/megatron/primus_turbo.yaml", {
        "enable_primus_turbo": (False, 3), "use_turbo_attention": (False, 28),
        "enable_turbo_attention_float8": (False, 37), "use_turbo_gemm": (False, 42),
        "use_turbo_grouped_gemm": (False, 46), "use_turbo_fused_act_with_probs": (False, 51),
        "moe_use_fused_router_with_aux_score": (False, 54), "use_turbo_deepep": (False, 58),
        "turbo_deepep_num_cu": (32, 59), "turbo_sync_free_moe_stage": (0, 63), "use_turbo_mega_moe": (False, 67),
        "turbo_mega_moe_precision": ("bf16", 73), "use_turbo_rms_norm": (False, 77),
    }),
    ("modules/megatron/torch_compile.yaml", {"torch_compile.enable": (False, 10)}),
    ("modules/megatron/zero_bubble.yaml", {
        "patch_zero_bubble": (False, 1), "zero_bubble_max_pending_backward": ("auto", 13),
        "enable_zero_bubble": (True, 21), "zero_bubble_v_schedule": (False, 23),
        "zero_bubble_v_schedule_mem_setup": ("half", 25), "enable_1f1b_v": (False, 27),
        "allow_padding_num_layers": (True, 29), "offload_chunk_num": (0, 35), "num_seq_splits": (1, 44),
        "cpu_offload": (False, 47),
    }),
    ("modules/megatron/primus_pipeline.yaml", {
        "patch_primus_pipeline": (False, 1), "pp_algorithm": ("1f1b-interleaved", 3), "offload": (False, 9),
        "offload_ops": ("", 11),
    }),
)

_TORCHTITAN_PRE_TRAINER: Layer = ("modules/torchtitan/pre_trainer.yaml", {
    "optimizer.early_step_in_backward": (False, 22), "optimizer.implementation": ("fused", 24),
    "optimizer.name": ("AdamW", 26),
    "training.mock_data": (True, 37), "training.enable_cpu_offload": (False, 40),
    "training.global_batch_size": (-1, 43), "training.local_batch_size": (8, 44), "training.max_norm": (1.0, 45),
    "training.mixed_precision_param": ("bfloat16", 46), "training.mixed_precision_reduce": ("float32", 47),
    "training.seq_len": (2048, 48), "debug.moe_force_load_balance": (False, 54),
    "parallelism.context_parallel_degree": (1, 58), "parallelism.context_parallel_rotate_method": ("allgather", 59),
    "parallelism.data_parallel_replicate_degree": (1, 60), "parallelism.data_parallel_shard_degree": (-1, 61),
    "parallelism.disable_loss_parallel": (False, 62), "parallelism.enable_async_tensor_parallel": (False, 63),
    "parallelism.expert_parallel_degree": (1, 64), "parallelism.expert_tensor_parallel_degree": (1, 65),
    "parallelism.fsdp_reshard_after_forward": ("default", 66), "parallelism.module_fqns_per_model_part": (None, 67),
    "parallelism.pipeline_parallel_degree": (1, 68), "parallelism.pipeline_parallel_first_stage_less_layers": (1, 69),
    "parallelism.pipeline_parallel_last_stage_less_layers": (1, 70),
    "parallelism.pipeline_parallel_layers_per_stage": (None, 71),
    "parallelism.pipeline_parallel_microbatch_size": (1, 72), "parallelism.pipeline_parallel_schedule": ("1F1B", 73),
    "parallelism.pipeline_parallel_schedule_csv": ("", 74), "parallelism.tensor_parallel_degree": (1, 75),
    "activation_checkpoint.mode": ("none", 95), "activation_checkpoint.selective_ac_option": ("2", 96),
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns": (["moe.router.gate"], 97),
    "activation_checkpoint.early_stop": (False, 99), "compile.enable": (True, 102),
    "compile.components": (["model", "loss"], 103), "primus_turbo.enable_primus_turbo": (True, 155),
    "primus_turbo.enable_attention_float8": (False, 156), "primus_turbo.use_turbo_attention": (True, 157),
    "primus_turbo.use_classic_attention": (False, 158), "primus_turbo.use_turbo_async_tp": (True, 159),
    "primus_turbo.use_turbo_mx_linear": (True, 160), "primus_turbo.use_turbo_float8_linear": (True, 161),
    "primus_turbo.use_turbo_grouped_mm": (False, 162), "primus_turbo.use_moe_fp8": (True, 163),
    "primus_turbo.enable_embedding_autocast": (True, 164),
})

_TORCHTITAN_QUANTIZE: Layer = ("modules/torchtitan/quantize.yaml", {
    "quantize.linear.float8.enable_fsdp_float8_all_gather": (False, 11),
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": (False, 15),
    "quantize.linear.float8.recipe_name": (None, 19), "quantize.linear.float8.filter_fqns": ([], 24),
    "quantize.linear.float8.emulate": (False, 29),
    "quantize.linear.mx.mxfp8_dim1_cast_kernel_choice": ("triton", 35),
    "quantize.linear.mx.recipe_name": ("mxfp8_cublas", 39), "quantize.linear.mx.filter_fqns": (["output"], 45),
    "quantize.grouped_mm.float8.fqns": ([], 55), "quantize.grouped_mm.mx.recipe_name": ("mxfp8", 60),
    "quantize.grouped_mm.mx.fqns": ([], 66),
})

MODULE_CONFIGS: dict[tuple[str, str], tuple[Layer, ...]] = {
    ("megatron", "pre_trainer.yaml"): (*_TRAINER_BASE_EXTENDS, _TRAINER_BASE, ("modules/megatron/pre_trainer.yaml", {
        "global_batch_size": (16, 5), "seq_length": (1024, 8), "use_flash_attn": (True, 30),
        "use_distributed_optimizer": (True, 32),
    })),
    ("megatron", "sft_trainer.yaml"): (*_TRAINER_BASE_EXTENDS, _TRAINER_BASE, ("modules/megatron/sft_trainer.yaml", {
        "global_batch_size": (128, 12), "micro_batch_size": (1, 13), "seq_length": (2048, 20),
        "use_flash_attn": (True, 58), "use_distributed_optimizer": (True, 60),
    })),
    ("torchtitan", "pre_trainer.yaml"): (_TORCHTITAN_QUANTIZE, _TORCHTITAN_PRE_TRAINER),
}
"""(framework, module config file name) -> layers, later winning."""

MODEL_BASE: dict[str, tuple[Layer, ...]] = {"megatron": (
    ("models/megatron/primus_megatron_model.yaml", {"moe_router_force_load_balancing": (False, 3)}),
    ("models/megatron/language_model.yaml", {
        "model_type": ("gpt", 11), "group_query_attention": (False, 18), "qk_layernorm": (False, 19),
        "qk_l2_norm": (False, 20), "num_query_groups": (None, 21), "add_position_embedding": (False, 22),
        "position_embedding_type": ("learned_absolute", 23), "max_position_embeddings": (None, 24),
        "original_max_position_embeddings": (None, 25), "untie_embeddings_and_output_weights": (True, 26),
        "ffn_hidden_size": (None, 28), "kv_channels": (None, 29), "hidden_dropout": (0.1, 30),
        "attention_dropout": (0.1, 31), "apply_residual_connection_post_layernorm": (False, 34),
        "add_bias_linear": (False, 35), "add_qkv_bias": (False, 36), "swiglu": (True, 37), "quick_geglu": (False, 38),
        "openai_gelu": (False, 39), "squared_relu": (False, 40), "rotary_base": (10000, 41),
        "rotary_percent": (1.0, 42), "rotary_seq_len_interpolation_factor": (None, 44), "use_rope_scaling": (False, 46),
        "rope_scaling_factor": (8.0, 47), "transformer_impl": ("transformer_engine", 48), "rope_type": (None, 50),
        "tokenizer_type": (None, 58), "tokenizer_model": (None, 59), "vocab_size": (None, 60),
        "apply_query_key_layer_scaling": (False, 73), "attention_softmax_in_fp32": (False, 74),
        "cross_entropy_loss_fusion": (False, 78), "cross_entropy_fusion_impl": ("native", 79),
        "apply_rope_fusion": (True, 84), "norm_epsilon": (1e-05, 89), "normalization": ("LayerNorm", 90),
        "apply_layernorm_1p": (False, 91), "multi_latent_attention": (False, 94), "q_lora_rank": (None, 95),
        "kv_lora_rank": (32, 96), "qk_head_dim": (128, 97), "qk_pos_emb_head_dim": (64, 98), "v_head_dim": (128, 99),
        "rotary_scaling_factor": (1.0, 100), "mscale": (1.0, 101), "mscale_all_dim": (1.0, 102),
        "num_experts": (None, 105), "moe_layer_freq": (1, 106), "moe_ffn_hidden_size": (None, 107),
        "moe_shared_expert_overlap": (False, 108), "moe_shared_expert_intermediate_size": (None, 109),
        "moe_grouped_gemm": (False, 110), "moe_router_load_balancing_type": ("aux_loss", 112),
        "moe_router_dtype": (None, 113), "moe_router_score_function": ("softmax", 114), "moe_router_topk": (2, 115),
        "moe_router_pre_softmax": (False, 116), "moe_router_num_groups": (None, 126),
        "moe_router_group_topk": (None, 127), "moe_router_topk_scaling_factor": (None, 128),
        "moe_router_enable_expert_bias": (False, 129), "moe_aux_loss_coeff": (0.0, 132),
        "moe_token_dispatcher_type": ("allgather", 135), "moe_enable_deepep": (False, 136),
        "moe_expert_capacity_factor": (None, 138), "moe_pad_expert_input_to_capacity": (False, 139),
        "moe_layer_recompute": (False, 141), "moe_permute_fusion": (False, 144), "delay_wgrad_compute": (False, 145),
        "tensor_model_parallel_size": (1, 149), "context_parallel_size": (1, 151), "cp_comm_type": ("p2p", 152),
        "hierarchical_context_parallel_sizes": (None, 153), "pipeline_model_parallel_size": (1, 155),
        "pipeline_model_parallel_layout": (None, 156), "decoder_first_pipeline_num_layers": (None, 160),
        "decoder_last_pipeline_num_layers": (None, 161), "virtual_pipeline_model_parallel_size": (None, 162),
        "num_layers_per_virtual_pipeline_stage": (None, 163), "num_virtual_stages_per_pipeline_rank": (None, 164),
        "microbatch_group_size_per_vp_stage": (None, 165), "sequence_parallel": (True, 166),
        "expert_model_parallel_size": (1, 167), "expert_tensor_parallel_size": (None, 168),
        "gradient_accumulation_fusion": (True, 178), "tp_comm_overlap": (False, 180),
    }),
    ("models/megatron/llama_base.yaml", {
        "group_query_attention": (False, 4), "num_query_groups": (None, 5), "qk_layernorm": (False, 6),
        "swiglu": (True, 8), "add_bias_linear": (False, 9), "attention_softmax_in_fp32": (True, 10),
        "untie_embeddings_and_output_weights": (True, 11), "hidden_dropout": (0.0, 12), "attention_dropout": (0.0, 13),
        "position_embedding_type": ("rope", 15), "rotary_base": (10000, 16), "rotary_scaling_factor": (40, 17),
        "normalization": ("RMSNorm", 19),
    }),
)}
"""framework -> model-side base layers, laid under presets read from our `models/` folder."""


def _torchtitan_preset(file: str, name: str, flavor: str, hf_assets: str, converters: list[str],
                       first_line: int) -> Layer:
    """The `model:` section of a Primus torchtitan model preset (its `job:` section is bookkeeping)."""
    return (f"models/torchtitan/{file}", {
        "model.name": (name, first_line + 1), "model.flavor": (flavor, first_line + 2),
        "model.hf_assets_path": (hf_assets, first_line + 3), "model.converters": (converters, first_line + 4),
    })


TORCHTITAN_MODEL_PRESETS: dict[str, Layer] = {
    "llama3.1_8B.yaml": _torchtitan_preset("llama3.1_8B.yaml", "llama3", "8B", "meta-llama/Llama-3.1-8B",
                                           ["primus_turbo"], 5),
    "llama3.1_8B-fp8.yaml": _torchtitan_preset("llama3.1_8B-fp8.yaml", "llama3", "8B", "meta-llama/Llama-3.1-8B",
                                               ["primus_turbo", "quantize.linear.float8"], 5),
    "deepseek_v3_16b.yaml": _torchtitan_preset("deepseek_v3_16b.yaml", "deepseek_v3", "16B",
                                               "deepseek-ai/deepseek-moe-16b-base", ["primus_turbo"], 7),
    "deepseek_v3_671b.yaml": _torchtitan_preset("deepseek_v3_671b.yaml", "deepseek_v3", "671B",
                                                "deepseek-ai/DeepSeek-V3.1-Base", ["primus_turbo"], 6),
}
"""Primus torchtitan model presets (`primus/configs/models/torchtitan/<file>`), by file name."""
