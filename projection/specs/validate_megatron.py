"""What a Megatron-family job refuses at start-up, checked on the canonical plan (called by
specs/validate.layout_problems with its `bad`, so a `--set` or a layout search is checked too): Megatron-Core 0.16.1's
TransformerConfig / ModelParallelConfig / parallel_state for every Megatron-family job (Megatron-LM, Primus,
Megatron-Bridge), Megatron-LM's validate_args (megatron/training/arguments.py) for the jobs that run it (Megatron-LM
and Primus launches, not Megatron-Bridge). Each problem is located at the key the file set (origin_problem), and
names the other flags as the file spells them. Native and HF scenarios are projection's own: not checked here.
Rules on arguments the canonical plan does not keep are formats/megatron_checks.py's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec

if TYPE_CHECKING:
    from projection.specs.scenario import RawScenario

VALIDATE_ARGS = ("megatron", "primus-megatron")  # jobs whose arguments pass Megatron-LM's validate_args
CORE = (*VALIDATE_ARGS, "megatron-bridge")  # jobs that build Megatron-Core's TransformerConfig
Bad = Callable[[str, str, str], None]


def megatron_parity(raw: RawScenario, model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                    bad: Bad) -> None:
    """Report (through `bad`) what Megatron refuses of this plan."""
    if raw.framework not in CORE:
        return

    def said(dotted: str, flag: str) -> str:  # a key as the file spells it, else Megatron-LM's flag
        o = raw.origins.get(dotted)
        return o.key if o is not None and o.key else flag

    _core(raw, model, training, plan, bad, said)
    if raw.framework in VALIDATE_ARGS:
        _validate_args(model, training, plan, bad, said)


def _core(raw: RawScenario, model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, bad: Bad,
          said: Callable[[str, str], str]) -> None:
    if plan.pipeline_layout is not None:
        others = [said(k, flag) for k, flag, on in (
            ("plan.first_stage_layers", "--decoder-first-pipeline-num-layers", plan.first_stage_layers is not None),
            ("plan.last_stage_layers", "--decoder-last-pipeline-num-layers", plan.last_stage_layers is not None),
            ("plan.account_for_embedding", "--account-for-embedding-in-pipeline-split", plan.account_for_embedding),
            ("plan.account_for_loss", "--account-for-loss-in-pipeline-split", plan.account_for_loss)) if on]
        if others:
            # transformer_config.py __post_init__: "pipeline_model_parallel_layout cannot be set with other pipeline
            # layout arguments" (first/last stage layer counts, account_for_embedding/loss_in_pipeline_split)
            bad("plan.pipeline_layout", f"a pipeline layout beside {', '.join(others)} (Megatron-Core "
                "TransformerConfig: 'pipeline_model_parallel_layout cannot be set with other pipeline layout "
                "arguments')", f"drop {' and '.join(others)}: the layout places every layer (E, L for the embedding "
                "and loss)")
    if model.moe is not None and model.add_bias_linear and plan.etp_ != 1:
        # transformer_config.py: `if self.num_moe_experts is not None and self.add_bias_linear: assert
        # self.expert_tensor_parallel_size == 1, "Bias in Moe is only supported when ETP==1"`
        etp = "plan.etp" if "plan.etp" in raw.origins else "plan.tp"
        bad(etp, f"linear biases in an MoE model with expert tensor parallelism {plan.etp_} (Megatron-Core "
            "TransformerConfig: 'Bias in Moe is only supported when ETP==1'; biases are on unless "
            "--disable-bias-linear)", f"add --disable-bias-linear, or set "
            f"{said('plan.etp', '--expert-tensor-parallel-size')} 1")
    if plan.overlap.ep_comm:
        _ep_overlap(model, training, plan, bad)
    r = plan.recompute
    modules = set(r.modules) if r.granularity == "selective" else set()
    if "moe_act" in modules and not training.kernels.moe_grouped_gemm:
        # transformer_config.py: "moe_act in recompute_modules is only supported with moe_grouped_gemm."
        bad("plan.recompute.modules", "recompute module moe_act without grouped GEMM (Megatron-Core "
            "TransformerConfig refuses it)", f"add {said('training.kernels.moe_grouped_gemm', '--moe-grouped-gemm')}, "
            "or drop moe_act")
    if "mla_up_proj" in modules and model.mla is None:
        # transformer_config.py: "mla_up_proj in recompute_modules is only supported with multi_latent_attention."
        bad("plan.recompute.modules", "recompute module mla_up_proj without multi-latent attention (Megatron-Core "
            "TransformerConfig refuses it)", "drop mla_up_proj")
    fp8 = training.fp8
    delayed = sorted(modules & {"moe_act", "layernorm"}) if fp8 is not None and fp8.recipe == "delayed" else []
    if delayed:
        # transformer_config.py: "Delayed scaling does not support moe_act and layernorm recompute for fp8."
        bad("plan.recompute.modules", f"recompute of {' and '.join(delayed)} with delayed fp8 scaling (Megatron-Core "
            "TransformerConfig: 'Delayed scaling does not support moe_act and layernorm recompute for fp8.')",
            f"use another {said('training.fp8.recipe', '--fp8-recipe')} (tensorwise, mxfp8, blockwise), or drop "
            f"{' and '.join(delayed)}")
    if r.distribute_saved_activations and r.granularity != "none" and plan.sp_:
        # transformer_config.py: "distribute_saved_activations: ... must be false when sequence parallel is enabled"
        bad("plan.recompute.distribute_saved_activations", "distributing the saved activations with sequence "
            "parallelism (Megatron-Core TransformerConfig refuses it)",
            f"drop {said('plan.recompute.distribute_saved_activations', '--distribute-saved-activations')} or "
            f"{said('plan.sp', '--sequence-parallel')}")
    _optimizer_instances(plan, bad)
    mods = plan.offload.activation_modules
    if "attn_proj" in mods and "core_attn" not in mods:
        # transformer_config.py: "attn_proj cannot be set to offload_modules alone without core_attn ..."
        bad("plan.offload.activation_modules", "offloading attn_proj without core_attn (Megatron-Core "
            "TransformerConfig: attn_proj's input is core_attn's output, which core_attn's backward needs)",
            "add core_attn to the offloaded modules, or drop attn_proj")


def _ep_overlap(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, bad: Bad) -> None:
    """transformer_config.py __post_init__ under overlap_moe_expert_parallel_comm: each assert, one problem."""
    mtp = model.mtp_num_layers or 0
    for wrong, need in (
            (plan.ep == 1, "expert parallelism (ep > 1)"),
            (training.kernels.moe_token_dispatcher not in ("alltoall", "flex"), "the alltoall or flex token "
             f"dispatcher, not {training.kernels.moe_token_dispatcher}"),
            (plan.pp > 1 and plan.vpp_ == 1, f"a virtual pipeline at pipeline size {plan.pp}"),
            (plan.recompute.granularity == "full", "no full recompute"),
            (training.params_dtype not in ("bf16", "fp16"), "a bf16 or fp16 model"),
            (mtp > 1, f"at most one MTP layer (not {mtp})"),
            (mtp == 1 and plan.pp == 1, "a pipeline (pp > 1) with an MTP layer")):
        if wrong:
            bad("plan.overlap.ep_comm", f"overlapping the expert-parallel all-to-all needs {need} (Megatron-Core "
                "TransformerConfig asserts it under overlap_moe_expert_parallel_comm)",
                "turn the expert-parallel overlap off, or change the plan to meet it")


def _optimizer_instances(plan: ParallelPlan, bad: Bad) -> None:
    """parallel_state.initialize_model_parallel: "Data parallel size should be divisible by partial DistOpt shard
    factor" ((dp * cp) % num_distributed_optimizer_instances) and "Expert data parallel size should be divisible by
    partial DistOpt shard factor" (expert dp = world / (etp * ep * pp), dense models included)."""
    n = plan.sharding.distributed_optimizer_instances
    if n == 1 or plan.dp is None:
        return
    for size, what in ((plan.dp * plan.cp, f"dp * cp = {plan.dp} * {plan.cp}"),
                       (plan.edp(), f"the expert data-parallel size world / (etp * ep * pp) = {plan.edp()}")):
        if size % n:
            bad("plan.sharding.distributed_optimizer_instances", f"{n} distributed-optimizer instances do not divide "
                f"{what} = {size} (Megatron-Core parallel_state refuses it)",
                "use a number of instances that divides both data-parallel sizes")
            return


def _validate_args(model: ModelSpec, training: TrainingSpec, plan: ParallelPlan, bad: Bad,
                   said: Callable[[str, str], str]) -> None:
    fp16 = said("training.params_dtype", "--fp16")
    if plan.ep > 1 and training.params_dtype == "fp16":
        # validate_args: "Expert parallelism is not supported with fp16 training."
        bad("plan.ep", f"expert parallelism (ep = {plan.ep}) with fp16 training (Megatron validate_args refuses it)",
            f"train in bf16 instead of {fp16}, or use ep 1")
    if training.kernels.moe_grouped_gemm and training.params_dtype != "bf16":
        # validate_args: `if args.moe_grouped_gemm: assert args.bf16` ("Currently GroupedGEMM for MoE only supports
        # bf16 dtype.")
        bad("training.kernels.moe_grouped_gemm", f"grouped GEMM for MoE in {training.params_dtype} (Megatron "
            "validate_args: 'Currently GroupedGEMM for MoE only supports bf16 dtype.')",
            f"train in bf16, or drop {said('training.kernels.moe_grouped_gemm', '--moe-grouped-gemm')}")
    r = plan.recompute
    if r.distribute_saved_activations:
        # validate_args: 'can distribute recomputed activations only across tensor model parallel groups' (tp > 1),
        # 'only application to full recompute granularity', 'need to use a recompute method'
        for wrong, need in ((plan.tp == 1, "tensor parallelism (tp > 1)"),
                            (r.granularity != "full", "full recompute granularity"),
                            (r.granularity == "full" and r.method is None, "a recompute method (uniform or block)")):
            if wrong:
                bad("plan.recompute.distribute_saved_activations", f"distributing the saved activations needs {need} "
                    "(Megatron validate_args)", "change the plan to meet it, or drop "
                    f"{said('plan.recompute.distribute_saved_activations', '--distribute-saved-activations')}")

