"""What Megatron-LM's validate_args and Megatron-Core's config dataclasses refuse of the arguments themselves, where the
canonical scenario keeps too little to tell (a flag it drops, or one whose value it folds into another): called by
`formats.megatron.args_to_raw`, each problem at the flag as the file spells it (Primus's dest name, Bridge's field
through `bridge_spelling`). Rules on what the canonical scenario does hold live in `specs/validate_megatron.py`.

Each rule names its source: Megatron-LM megatron/training/arguments.py `validate_args` (Megatron-LM and Primus
launches run it; Megatron-Bridge does not) or Megatron-Core 0.16.1 (every Megatron-family job builds its configs)."""

from __future__ import annotations

from projection.formats.megatron_args import FLAG_RENAMES
from projection.formats.megatron_model import MegatronArgs
from projection.specs.validate_megatron import CORE, VALIDATE_ARGS


def fsdp2_drops_fp8_gather(a: MegatronArgs, framework: str) -> bool:
    """validate_args under --use-torch-fsdp2: `if args.fp8_param_gather and is_te_min_version("2.0.0"):
    args.fp8_param_gather = False` ("FSDP2 FP8 param gather is not supported yet in TE 2.0"), before the model's
    config is built: the flag is dropped, not refused (Transformer Engine 2.0 or later taken)."""
    return framework in VALIDATE_ARGS and bool(a.get("use_torch_fsdp2")) and bool(a.get("fp8_param_gather"))


def argument_problems(a: MegatronArgs, framework: str, vpp: int | None) -> None:
    """Record (a.problem) every refusal below that applies to `framework`; `vpp` is the virtual pipeline size the
    arguments give (None for 1)."""
    if framework in VALIDATE_ARGS:
        _validate_args(a, framework, vpp)
    if framework in CORE:
        _core(a, framework, dropped=fsdp2_drops_fp8_gather(a, framework))


def _validate_args(a: MegatronArgs, framework: str, vpp: int | None) -> None:
    pp = a.get("pipeline_model_parallel_size")
    if a.get("fp8_param_gather") and not (a.get("use_distributed_optimizer") or a.get("use_torch_fsdp2")
                                          or a.get("use_megatron_fsdp")):
        # validate_args: `if args.fp8_param_gather: assert args.use_distributed_optimizer or args.use_torch_fsdp2 or
        # args.use_megatron_fsdp or not torch.is_grad_enabled()`
        a.problem("fp8_param_gather", f"{_n(a, 'fp8_param_gather')} needs the distributed optimizer or FSDP (Megatron "
                  "validate_args: '--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron "
                  "fsdp, or inference mode')", f"add {_n(a, 'use_distributed_optimizer')} (or an FSDP), or drop "
                  f"{_n(a, 'fp8_param_gather')}")
    zero_bubble = a.get("patch_zero_bubble") or a.get("patch_primus_pipeline")  # Primus's own pipeline runtimes
    if vpp is not None and pp == 2 and not a.get("overlap_p2p_comm") and not zero_bubble:
        # validate_args: with a virtual pipeline and not args.overlap_p2p_comm, `assert
        # args.pipeline_model_parallel_size > 2` ("... to avoid having multiple p2p sends and recvs between same 2
        # ranks per communication batch")
        a.problem("overlap_p2p_comm", "the interleaved schedule at pipeline size 2 needs overlapped p2p "
                  "communication (Megatron validate_args: 'pipeline-model-parallel size should be greater than 2' "
                  "when p2p communication overlap is disabled)", ("drop --no-overlap-p2p-communication" if a.flags else
                                                                  f"set {_n(a, 'overlap_p2p_comm')} true")
                  + ", or use a pipeline size above 2 or no virtual pipeline")
    if a.given("num_layers_per_virtual_pipeline_stage"):
        for dest in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            if a.given(dest):
                # validate_args: 'please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline
                # parallel degree when enable uneven pipeline parallelism'
                a.problem("num_layers_per_virtual_pipeline_stage", f"{_n(a, 'num_layers_per_virtual_pipeline_stage')}"
                          f" beside {_n(a, dest)} (Megatron validate_args refuses it with uneven pipeline stages)",
                          f"give the virtual pipeline as {_n(a, 'num_virtual_stages_per_pipeline_rank')} instead")
                break
    if a.get("optimizer_cpu_offload") and a.get("fp8_param_gather") and a.get("fp8_recipe") != "delayed":
        # validate_args: `assert not args.fp8_param_gather or args.fp8_recipe == "delayed"` under optimizer_cpu_offload
        a.problem("fp8_param_gather", f"optimizer CPU offload with {_n(a, 'fp8_param_gather')} needs the delayed fp8 "
                  f"recipe, not {a.get('fp8_recipe')!r} (Megatron validate_args)", f"use {_n(a, 'fp8_recipe')} "
                  f"delayed, or drop {_n(a, 'fp8_param_gather')} or {_n(a, 'optimizer_cpu_offload')}")
    kind = "rope" if a.get("use_rotary_position_embeddings") else a.get("position_embedding_type")
    if a.get("mtp_num_layers") and kind not in ("rope", "none", "yarn"):
        # validate_args: `assert args.position_embedding_type == "rope" or args.position_embedding_type == "none"`
        # under mtp_num_layers
        a.problem("mtp_num_layers", f"multi-token prediction with position embedding type {kind!r} (Megatron "
                  "validate_args: MTP supports rope and none only)", f"use {_n(a, 'position_embedding_type')} rope "
                  f"(or none), or drop {_n(a, 'mtp_num_layers')}")
    if a.get("squared_relu") and a.get("swiglu"):
        # arguments.py core_transformer_config_from_args: `if args.squared_relu: assert not args.swiglu`
        a.problem("squared_relu", f"{_n(a, 'squared_relu')} and {_n(a, 'swiglu')} are both set (Megatron asserts "
                  "not both)", "keep one activation")
    if framework == "megatron" and a.get("use_torch_fsdp2") and a.get("use_distributed_optimizer"):
        # validate_args: "--use-torch-fsdp2 is not supported with MCore's distributed optimizer"
        a.problem("use_distributed_optimizer", f"{_n(a, 'use_torch_fsdp2')} with {_n(a, 'use_distributed_optimizer')}"
                  " (Megatron validate_args: not supported with MCore's distributed optimizer)",
                  f"drop {_n(a, 'use_distributed_optimizer')}: FSDP2 shards the optimizer state itself")


def _core(a: MegatronArgs, framework: str, dropped: bool = False) -> None:
    fp8_param = a.origins.get("fp8_param_gather")
    ddp_only = fp8_param is not None and (fp8_param.key or "").startswith("ddp.")  # Bridge's DDP field, not fp8_param
    if a.get("fp8_param_gather") and a.get("fp8") is None and not ddp_only and not dropped:
        # transformer_config.py __post_init__: "fp8_param must be used together with fp8 mode."
        a.problem("fp8_param_gather", f"{_n(a, 'fp8_param_gather')} without fp8 (Megatron-Core TransformerConfig: "
                  "'fp8_param must be used together with fp8 mode.')", f"add {_n(a, 'fp8')} (e4m3 or hybrid), or "
                  f"drop {_n(a, 'fp8_param_gather')}")
    experts = a.get("num_experts")
    if a.given("moe_ffn_hidden_size") and not experts:
        # transformer_config.py: "moe_ffn_hidden_size must be None when num_experts is not set."
        a.problem("moe_ffn_hidden_size", f"{_n(a, 'moe_ffn_hidden_size')} without experts (Megatron-Core "
                  "TransformerConfig asserts it is unset for a dense model)",
                  f"drop {_n(a, 'moe_ffn_hidden_size')}, or give {_n(a, 'num_experts')}")
    factor = a.get("moe_expert_capacity_factor")
    if experts and a.get("moe_pad_expert_input_to_capacity") and (factor is None or factor < 0):
        # transformer_config.py: "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity"
        # (a negative factor is set to None first)
        a.problem("moe_pad_expert_input_to_capacity", f"{_n(a, 'moe_pad_expert_input_to_capacity')} without an "
                  "expert capacity factor (Megatron-Core TransformerConfig refuses it)",
                  f"give {_n(a, 'moe_expert_capacity_factor')}, or drop {_n(a, 'moe_pad_expert_input_to_capacity')}")
    if a.get("moe_layer_recompute") and a.get("recompute_granularity") == "full":
        # transformer_config.py: "Do not set --moe-layer-recompute with full recompute granularity."
        a.problem("moe_layer_recompute", f"{_n(a, 'moe_layer_recompute')} with full recompute granularity "
                  "(Megatron-Core TransformerConfig refuses it)", f"drop {_n(a, 'moe_layer_recompute')} (full "
                  "recompute already recomputes the MoE block), or use selective granularity")
    if a.get("defer_embedding_wgrad_compute"):
        # model_parallel_config.py __post_init__: "Cannot defer embedding wgrad compute when pipeline model parallel
        # is not used" / "... when gradient accumulation fusion is not used"
        if a.get("pipeline_model_parallel_size") == 1:
            a.problem("defer_embedding_wgrad_compute", f"{_n(a, 'defer_embedding_wgrad_compute')} without pipeline "
                      "parallelism (Megatron-Core ModelParallelConfig refuses it)",
                      f"drop {_n(a, 'defer_embedding_wgrad_compute')}, or use a pipeline")
        gaf = a.origin("gradient_accumulation_fusion")
        users = framework != "megatron-bridge" or (gaf.key or "").endswith("gradient_accumulation_fusion")
        if not a.get("gradient_accumulation_fusion") and users:  # (Bridge's FSDP setup turns it off after)
            a.problem("defer_embedding_wgrad_compute", f"{_n(a, 'defer_embedding_wgrad_compute')} without "
                      "gradient-accumulation fusion (Megatron-Core ModelParallelConfig refuses it)",
                      f"turn gradient-accumulation fusion back on, or drop {_n(a, 'defer_embedding_wgrad_compute')}")


def _n(a: MegatronArgs, dest: str) -> str:
    """A flag as the file spells it: as written where given; else Megatron-LM's flag, which Megatron-Bridge's problems
    rewrite as its field (bridge_spelling), or Primus's dest name."""
    if dest in a.args or not (a.flags or a.bridge):
        return a.key(dest)
    return next((f"--{flag}" for flag, (d, inverted) in FLAG_RENAMES.items() if d == dest and not inverted),
                "--" + dest.replace("_", "-"))


def deepep_problem(a: MegatronArgs, framework: str) -> None:
    """--moe-enable-deepep (transformer_config.py __post_init__, Megatron-Core 0.16.1): 'DeepEP backend is only
    supported with flex token dispatcher.' and 'Only one backend is supported for flex token dispatcher.' (with
    --moe-flex-dispatcher-backend hybridep). Megatron-LM's arguments.py does not set the dispatcher for it (its help:
    'Only works with flex token dispatcher by setting --moe-token-dispatcher-type=flex'); Primus-Turbo's DeepEP patch
    does, and is read apart (formats/megatron.py)."""
    if framework not in CORE:
        return
    if a.get("moe_token_dispatcher_type") != "flex":
        a.problem("moe_enable_deepep", f"{_n(a, 'moe_enable_deepep')} with the "
                  f"{a.get('moe_token_dispatcher_type')!r} token dispatcher (Megatron-Core TransformerConfig: 'DeepEP "
                  "backend is only supported with flex token dispatcher.')",
                  f"add {_n(a, 'moe_token_dispatcher_type')} flex, or drop {_n(a, 'moe_enable_deepep')}")
    elif a.get("moe_flex_dispatcher_backend") == "hybridep":
        a.problem("moe_enable_deepep", f"{_n(a, 'moe_enable_deepep')} with {_n(a, 'moe_flex_dispatcher_backend')} "
                  "hybridep (Megatron-Core TransformerConfig: 'Only one backend is supported for flex token "
                  "dispatcher.')", f"keep one of {_n(a, 'moe_enable_deepep')} and "
                  f"{_n(a, 'moe_flex_dispatcher_backend')} hybridep")


def zero_bubble_rules(a: MegatronArgs) -> None:
    """What Primus's zero-bubble runtime refuses at start-up (AMD-AGI/Primus zerobubble/zbpp_utils.py
    validate_arguments, read at f8abd27): with the distributed optimizer, overlapped gradient reduction or parameter
    gather; and the runtime without gradient-accumulation fusion."""
    if a.get("use_distributed_optimizer"):
        for dest in ("overlap_grad_reduce", "overlap_param_gather"):
            if a.get(dest):
                a.problem(dest, f"Primus's zero-bubble schedules refuse {a.key(dest)} with the distributed optimizer",
                          f"turn {a.key(dest)} off, or use a schedule without zero bubble")
    if a.get("gradient_accumulation_fusion") is False:
        a.problem("gradient_accumulation_fusion", "Primus's zero-bubble runtime needs gradient-accumulation fusion",
                  f"turn {a.key('gradient_accumulation_fusion')} back on, or use a schedule without zero bubble")
