"""Cross-spec checks: a parallel layout against the model, the batch and the world size. Every violation is listed
(never only the first), each located at the file/line/key that set the offending value."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from projection.errors import COMMAND_LINE, Problem, count_of
from projection.specs.accumulation import microbatches_per_schedule
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import runs_megatron
from projection.specs.training import TrainingSpec
from projection.specs.validate_gqa import kv_heads_problem
from projection.specs.validate_kernels import kernel_problems
from projection.specs.validate_megatron import megatron_parity
from projection.specs.validate_schedule import schedule_problems
from projection.workload.stages import LayoutError, layer_counts

if TYPE_CHECKING:
    from projection.specs.scenario import RawScenario


def resolve_dp(raw: RawScenario, plan: ParallelPlan, world: int) -> tuple[ParallelPlan, list[Problem]]:
    """Fill plan.dp from the world size (world = tp * cp * pp * dp), or check a given dp against it."""
    from projection.specs.scenario import origin_problem

    mp = plan.tp * plan.cp * plan.pp
    if world % mp:
        return plan, [origin_problem(
            raw, _blamed_size(raw, plan, world), f"world size {world} is not divisible by tp * cp * pp = {plan.tp} * "
            f"{plan.cp} * {plan.pp} = {mp}", "change --nodes/--gpus-per-node or the tp/cp/pp sizes so that tp*cp*pp "
            "divides the number of GPUs" + _assumed_nodes(raw))]
    dp = world // mp
    if plan.dp is not None and plan.dp != dp:
        origin = raw.origins.get("plan.dp")
        rep = plan.sharding.dp_replicate
        fix = (f"set data_parallel_shard_degree to {dp // rep} (or -1, the ranks left over)"
               if origin is not None and (origin.key or "").endswith("data_parallel_shard_degree") and dp % rep == 0
               else f"set dp to {dp}")
        return plan, [origin_problem(
            raw, "plan.dp", f"dp = {plan.dp}, but world {world} / (tp*cp*pp = {mp}) = {dp}",
            f"{fix}, or change the number of nodes/GPUs")]
    return plan.model_copy(update={"dp": dp}), []


def _blamed_size(raw: RawScenario, plan: ParallelPlan, world: int) -> str:
    """Which of tp, cp and pp a world size they do not divide is reported at: one the command line set (a --set
    the user just made), else one that alone does not divide the world, else the largest."""
    sizes = {"plan.tp": plan.tp, "plan.cp": plan.cp, "plan.pp": plan.pp}
    above = [k for k, v in sizes.items() if v > 1] or ["plan.tp"]

    def on_command_line(k: str) -> bool:
        o = raw.origins.get(k)
        return o is not None and o.file in ("--set", COMMAND_LINE)
    return next((k for k in above if on_command_line(k)), None) or next(
        (k for k in above if world % sizes[k]), None) or max(above, key=lambda k: sizes[k])


def torchtitan_without_fsdp(framework: str, plan: ParallelPlan, training: TrainingSpec
                            ) -> tuple[ParallelPlan, TrainingSpec]:
    """A TorchTitan job whose data-parallel shard degree resolves to 1 (dp_shard * cp == 1, e.g. tp 8 on 8 GPUs) runs
    no FSDP: `fully_shard` is applied only when dp_shard or cp is enabled (ParallelDims.fsdp_enabled). Mixed precision
    is then FSDP's to give and nobody gives it: `maybe_enable_amp` disables it under TP or PP ("Mixed precision
    training with TP or PP is only supported when FSDP/HSDP/CP is enabled"), so such a job computes, stores and
    reduces in `training.dtype` (float32 by default). Without TP and PP TorchTitan autocasts (DDP or one device);
    that keeps the loader's mixed-precision reading."""
    sh = plan.sharding
    if "torchtitan" not in framework or sh.fsdp != "torch_fsdp2" or sh.zero_stage != 3:
        return plan, training
    shard = plan.dp_() // sh.dp_replicate
    if shard == 1 and training.fp8 is not None and training.fp8.param_gather:
        # torchao's Float8Converter all-gathers in fp8 only where the shard degree exceeds 1 (dp_shard_enabled),
        # whether FSDP runs over cp or not at all
        training = training.model_copy(update={"fp8": training.fp8.model_copy(update={"param_gather": False})})
    if shard * plan.cp > 1:
        return plan, training
    # replicas without a shard group are DDP (apply_ddp): one gradient all-reduce over the whole data-parallel group
    plan = plan.model_copy(update={"sharding": sh.model_copy(update={"zero_stage": 0, "fsdp": "none",
                                                                     "dp_replicate": 1}),
                                   "overlap": plan.overlap.model_copy(update={"param_gather": False})})
    if (plan.tp > 1 or plan.pp > 1) and training.params_dtype != "fp32" and training.fp8 is None \
            and training.optimizer.main_params_dtype == "fp32":  # mixed precision was FSDP's (not pure bf16)
        opt = training.optimizer.model_copy(update={"main_grads_dtype": "fp32"})
        training = training.model_copy(update={"params_dtype": "fp32", "optimizer": opt})
    return plan, training


def torchtitan_fp8_without_amp(framework: str, plan: ParallelPlan, training: TrainingSpec) -> bool:
    """A TorchTitan job torchtitan_without_fsdp leaves without mixed precision (no FSDP, TP or PP) that converts its
    linears to float8: torchao's Float8Linear keeps fp32 weights and returns fp32 outputs there, which projection
    does not model (fp8 is modelled over bf16 or fp16 params); it is priced with bf16 mixed precision instead."""
    return "torchtitan" in framework and plan.sharding.zero_stage == 0 and training.fp8 is not None \
        and (plan.tp > 1 or plan.pp > 1)


FP8_WITHOUT_AMP = ("TorchTitan applies no FSDP at dp_shard x cp = 1 and, under TP or PP, no mixed precision: the job "
                   "runs in fp32, and float8 converters keep fp32 master weights and outputs there, which is not "
                   "modelled: memory and time are priced with bf16 mixed precision (in fp32 the weights and "
                   "activations take twice the bytes and the optimizer keeps no separate master copy)")


def torchtitan_ddp_problem(framework: str, asked: ParallelPlan, runs: ParallelPlan) -> Problem | None:
    """TorchTitan replicas whose shard group resolved to one rank run as DDP (torchtitan_without_fsdp), which
    TorchTitan refuses beside TP or PP (apply_ddp: "DDP has not supported > 1D parallelism")."""
    if "torchtitan" not in framework or asked.sharding.dp_replicate <= 1 or runs.sharding.zero_stage != 0 \
            or asked.sharding.zero_stage != 3 or not (runs.tp > 1 or runs.pp > 1):
        return None
    return Problem(f"data-parallel replicas without a shard group run as DDP, which TorchTitan refuses beside TP or "
                   f"PP (tp {runs.tp}, pp {runs.pp}): 'DDP has not supported > 1D parallelism'",
                   key="plan.sharding.dp_replicate",
                   fix="give data_parallel_shard_degree > 1 (HSDP), or drop TP and PP")


def layout_problems(raw: RawScenario, model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                    world: int) -> list[Problem]:
    """All inconsistencies between the plan and the model/batch/world, at once."""
    from projection.specs.scenario import origin_problem

    out: list[Problem] = []

    def bad(key: str, message: str, fix: str) -> None:
        out.append(origin_problem(raw, key, message, fix))

    tp = plan.tp
    if model.num_attention_heads % tp:
        bad("plan.tp", f"tp = {tp} does not divide num_attention_heads = {model.num_attention_heads}",
            f"use a tp that divides {model.num_attention_heads}")
    kv_problem = kv_heads_problem(raw.framework, model, training, plan)
    if kv_problem is not None:
        bad("plan.tp", *kv_problem)
    if model.moe is not None:
        if model.moe.num_experts % plan.ep:
            bad("plan.ep", f"ep = {plan.ep} does not divide num_experts = {model.moe.num_experts}",
                f"use an ep that divides {model.moe.num_experts}")
        grid = tp * plan.cp * plan.dp if plan.dp is not None else 0  # TorchTitan's stricter rule: _torchtitan_rules
        if grid and "torchtitan" not in raw.framework and grid % (plan.etp_ * plan.ep):
            bad("plan.ep", f"etp * ep = {plan.etp_} * {plan.ep} does not divide tp * cp * dp = "
                f"{grid} (Megatron expert grid: world = etp*ep*edp*pp; world {world})",
                "choose ep and etp whose product divides the non-pipeline ranks" + _assumed_nodes(raw))
        if model.moe.expert_ffn_hidden_size % plan.etp_:
            # etp defaults to tp (Megatron): blamed on tp where the file gives no etp
            bad("plan.etp" if "plan.etp" in raw.origins else "plan.tp", f"etp = {plan.etp_} does not divide the "
                f"expert FFN size "
                f"{model.moe.expert_ffn_hidden_size}", "use a smaller etp")
    elif plan.ep > 1:
        bad("plan.ep", f"ep = {plan.ep} but the model has no experts", "set ep to 1")
    if model.ffn_hidden_size % tp:
        bad("plan.tp", f"tp = {tp} does not divide ffn_hidden_size = {model.ffn_hidden_size}", "use a smaller tp")
    try:
        layer_counts(model, plan)
    except LayoutError as e:
        key = "plan.pipeline_layout" if plan.pipeline_layout else "plan.pp"
        if plan.vpp and not plan.pipeline_layout:
            key = "plan.vpp"
        bad(key, str(e), "change pp/vpp (or the layout / first-last stage layer counts) so the layers split evenly")
    mpe = model.max_position_embeddings
    if mpe and training.seq_length > mpe and (model.position_embedding == "learned" or runs_megatron(raw.framework)):
        # a learned position table has max_position_embeddings rows; Megatron's validate_args asserts
        # "max_position_embeddings (...) must be greater than or equal to seq_length (...)" for every position type
        bad("training.seq_length", f"seq_length {training.seq_length} is longer than max_position_embeddings {mpe}"
            + (" (the learned position table)" if model.position_embedding == "learned" else
               " (Megatron asserts max_position_embeddings >= seq_length)"),
            f"use a sequence length of at most {mpe}, or raise max_position_embeddings "
            "(Megatron's --max-position-embeddings)")
    if plan.cp > 1 and training.seq_length % (2 * plan.cp):
        bad("training.seq_length", f"seq_length {training.seq_length} is not divisible by 2 * cp = {2 * plan.cp}",
            "use a sequence length divisible by 2*cp (load-balanced causal context parallelism)")
    if plan.sp_ and training.seq_length % (plan.cp * tp):
        # Megatron's scatter_to_sequence_parallel_region splits each CP rank's seq_length / cp tokens over tp ranks
        bad("training.seq_length", f"seq_length {training.seq_length} is not divisible by cp * tp = {plan.cp} * {tp} "
            "(sequence parallelism splits each context-parallel rank's tokens over the tp ranks)",
            f"use a sequence length divisible by {plan.cp * tp}, or turn sequence parallelism off")
    titan_round = (training.local_batch_size * plan.dp if plan.dp is not None and "torchtitan" in raw.framework
                   and training.local_batch_size is not None else None)
    # the schedule rules below count whole microbatches: where the global batch does not split into them, that is
    # the problem to report, not a schedule rule broken by a rounded-down count
    whole = plan.dp is not None and training.resolved_global_batch(plan.dp) % (training.micro_batch_size * plan.dp) == 0
    if plan.dp is not None:
        per_step = training.micro_batch_size * plan.dp
        gbs = training.resolved_global_batch(plan.dp)
        if gbs % per_step and not (titan_round and gbs % titan_round):  # TorchTitan's own check (below) says it
            bad("training.global_batch_size", f"global batch {gbs} is not divisible by micro batch * dp = "
                f"{training.micro_batch_size} * {plan.dp} = {per_step}",
                f"use a global batch that is a multiple of {per_step}")
        if plan.rank_order != "tp-cp-ep-dp-pp" and plan.pp > 1 and plan.edp() != plan.dp_():
            # parallel_state.initialize_model_parallel asserts `order.endswith("pp") or pipeline_model_parallel_size
            # == 1 or expert_data_parallel_size == data_parallel_size` ("When not using pp-last rank ordering, the data
            # parallel size of the attention and moe layers must be the same") for dense models too: the expert grid
            # world / (etp * ep * pp) is built whatever the model, and has no cp
            bad("plan.rank_order", f"the rank order {plan.rank_order} (--use-tp-pp-dp-mapping) with pp {plan.pp} needs "
                f"the expert grid's data-parallel size, world / (etp * ep * pp) = {plan.edp()}, equal to the "
                f"attention's ({plan.dp_()}): Megatron-Core refuses it"
                + (", for a dense model too" if model.moe is None else ""),
                "drop --use-tp-pp-dp-mapping, or choose " + ("ep / etp" if model.moe is not None else "etp = tp and "
                                                               "cp 1") + " so that the two data-parallel sizes agree")
        if plan.sharding.dp_replicate > 1 and plan.rank_order != "tp-cp-ep-dp-pp":
            bad("plan.rank_order", f"HSDP replicas (dp_replicate {plan.sharding.dp_replicate}) with the rank order "
                f"{plan.rank_order} are not modelled", "drop --use-tp-pp-dp-mapping (rank order tp-cp-ep-dp-pp) or "
                "the replicate degree")
        if plan.sharding.dp_replicate > 1 and plan.dp % plan.sharding.dp_replicate:
            bad("plan.sharding.dp_replicate", f"dp_replicate {plan.sharding.dp_replicate} does not divide dp "
                f"{plan.dp}", "use a replicate degree that divides dp")
        elif model.moe is not None and plan.sharding.dp_replicate > 1 and plan.edp() % plan.sharding.dp_replicate:
            # HSDP shards the experts inside each replica too: the replicas must split the expert-data-parallel group
            bad("plan.ep", f"ep {plan.ep} leaves {plan.edp()} expert-data-parallel ranks, which the "
                f"{plan.sharding.dp_replicate} HSDP replicas do not divide",
                "use an ep (or replicate degree) such that dp_replicate divides the expert-data-parallel size")
    if titan_round and plan.dp is not None and training.local_batch_size is not None:
        gbs = training.resolved_global_batch(plan.dp)
        if gbs % titan_round:  # torchtitan train.py: global_batch_size % (local_batch_size * dp_degree) == 0
            bad("training.global_batch_size", f"global batch {gbs} is not a multiple of local batch * dp = "
                f"{training.local_batch_size} * {plan.dp} = {titan_round} (TorchTitan asserts it)",
                f"use a global batch that is a multiple of {titan_round}")
    if whole and plan.pp > 1 and plan.vpp_ > 1 and plan.schedule == "interleaved_1f1b":
        from projection.schedule.interleaved import megatron_group_size, torch_group_size

        m = microbatches_per_schedule(training, plan)
        try:  # Megatron's interleaved schedule: pp <= group size <= microbatches (arithmetic only); torch's rounds
            if plan.schedule_style == "torch":
                torch_group_size(plan.pp, m)
            else:
                megatron_group_size(plan.pp, m, plan.microbatch_group_size)
        except ValueError as e:
            if plan.schedule_style == "torch":
                bad("plan.schedule", f"{e} ({m} microbatches per data-parallel rank)",
                    "use a number of microbatches that torch's ScheduleInterleaved1F1B accepts (a multiple of "
                    "max(1, microbatches // pp)), or a non-interleaved schedule")
            elif m >= plan.pp:
                # enough microbatches: the group size (given, or the default pp) is what is wrong
                ok = [k for k in range(plan.pp, m + 1) if not 0 < m % k < plan.pp]
                unset = plan.microbatch_group_size is not None and plan.pp in ok
                bad("plan.microbatch_group_size", f"{e} ({m} microbatches per data-parallel rank)",
                    f"use a group size in [{plan.pp}, {m}] that leaves no remainder below pp, e.g. "
                    f"{', '.join(map(str, ok[:4]))}{', ...' if len(ok) > 4 else ''}"
                    + (", or leave it unset (pp)" if unset else "")
                    + " (Megatron's --microbatch-group-size-per-virtual-pipeline-stage)")
            else:
                bad("plan.schedule", f"{e} (global batch {training.resolved_global_batch(plan.dp_())} / (micro batch "
                    f"{training.micro_batch_size} * dp {plan.dp}) = {m} microbatches)",
                    f"give at least {plan.pp} microbatches per data-parallel rank (a larger global batch or fewer "
                    "data-parallel ranks), or a non-interleaved schedule (vpp 1)")
    if whole and plan.pp > 1:
        schedule_problems(plan, microbatches_per_schedule(training, plan), bad)
    if whole and plan.pp > 1 and plan.schedule == "1f1b" and plan.schedule_style == "torch":
        m = microbatches_per_schedule(training, plan)
        if m < plan.pp:  # torch.distributed.pipelining Schedule1F1B refuses fewer microbatches than stages
            bad("plan.schedule", f"1f1b (torch Schedule1F1B) needs at least pp = {plan.pp} microbatches per "
                f"data-parallel rank, got {m}", "a larger local batch or a smaller pipeline microbatch size "
                "(parallelism.pipeline_parallel_microbatch_size)")
    if plan.pp == 1 and plan.vpp_ > 1:  # Megatron validate_args; a virtual pipeline has no pipeline to interleave
        bad("plan.vpp", f"vpp = {plan.vpp_} with pp = 1: a virtual pipeline needs a pipeline (pp > 1)",
            "raise pp, or drop vpp")
    if plan.pp > 1 or plan.vpp_ == 1:  # (pp 1 with vpp > 1 is refused above)
        from projection.schedule.registry import stages_per_rank_problem

        stages = stages_per_rank_problem(plan.schedule, plan.vpp_)
        # a schedule Megatron's runtime lacks is refused for that alone (validate_schedule.py), not twice
        if stages is not None and not plan.megatron_lacks_schedule:
            bad("plan.schedule", stages, "pick a schedule for this vpp (interleaved_1f1b or gpipe for vpp > 1, a V "
                "schedule for vpp 2), or change vpp")
    _megatron_rules(raw, model, plan, bad)
    _torchtitan_rules(raw, model, training, plan, bad)
    kernel_problems(raw, model, training, plan, bad)
    r = plan.recompute
    if r.granularity == "full" and r.layer_ids is None and (r.method is None or r.num_layers is None):
        # TransformerConfig: full granularity needs recompute_method and recompute_num_layers (Primus adds
        # recompute_layer_ids)
        names = {"megatron": "--recompute-method and --recompute-num-layers", "megatron-bridge":
                 "--recompute-method and --recompute-num-layers", "primus-megatron": "recompute_method and "
                 "recompute_num_layers (or recompute_layer_ids)"}.get(raw.framework, "recompute method and "
                                                                       "num_layers (or layer_ids)")
        bad("plan.recompute.granularity", f"full recompute needs {names}", f"set {names}")
    megatron_parity(raw, model, training, plan, bad)
    return out


def _torchtitan_rules(raw: RawScenario, model: ModelSpec, training: TrainingSpec, plan: ParallelPlan,
                      bad: Callable[[str, str, str], None]) -> None:
    """Report (through `bad`) plans TorchTitan refuses at start-up (pytorch/torchtitan torchtitan/distributed/
    parallel_dims.py ParallelDims._validate and seq_len_divisor, asserted by every model's parallelize)."""
    if "torchtitan" not in raw.framework:
        return
    tp, cp = plan.tp, plan.cp
    if training.seq_length % (tp * 2 * cp):  # "must be divisible by the product of TP degree and 2 * CP degree"
        bad("training.seq_length", f"seq_len {training.seq_length} is not divisible by tp * 2 * cp = {tp} * 2 * {cp} "
            "(TorchTitan asserts it: sequence parallelism splits the sequence over tp, load-balanced context "
            "parallelism over 2 * cp)", f"use a seq_len that is a multiple of {tp * 2 * cp}")
    if model.moe is None or plan.ep <= 1 or plan.dp is None:
        return
    shard = plan.dp // max(1, plan.sharding.dp_replicate)
    # EP borrows all of cp, and of tp too when etp is 1, then part of dp_shard (never dp_replicate)
    borrowed, names = (cp * tp, "cp * tp") if plan.etp_ == 1 else (cp, "cp")
    if plan.ep % borrowed or (shard * borrowed) % plan.ep:
        bad("plan.ep", f"expert_parallel_degree {plan.ep} with expert_tensor_parallel_degree {plan.etp_}: TorchTitan "
            f"needs ep to be a multiple of {names} = {borrowed} and to divide data_parallel_shard_degree * {names} = "
            f"{shard} * {borrowed} = {shard * borrowed} (ParallelDims._validate asserts it)",
            f"choose an expert_parallel_degree that is a multiple of {borrowed} and divides {shard * borrowed}"
            + (" (or expert_tensor_parallel_degree = tensor_parallel_degree)" if plan.etp_ == 1 and tp > 1 else "")
            + _assumed_nodes(raw))


def _assumed_nodes(raw: RawScenario) -> str:
    """The fix's tail where the file gives no cluster size and a node count was assumed."""
    origin = raw.origins.get("cluster.nodes")
    if origin is None or not origin.file.startswith("default"):
        return ""
    nodes = int(raw.get("cluster.nodes") or 1)
    return (f"; the file does not give the cluster size and {count_of(nodes, 'node')} "
            f"{'was' if nodes == 1 else 'were'} assumed: give it with --nodes")


def _megatron_rules(raw: RawScenario, model: ModelSpec, plan: ParallelPlan,
                    bad: Callable[[str, str, str], None]) -> None:
    """Report (through `bad`) plans Megatron-Core refuses at start-up. TorchTitan jobs are exempt, and FSDP
    (zero_stage 3) from the gradient-overlap rule: its prefetch is plan.overlap.param_gather, its reduce-scatter
    overlaps the backward by itself."""
    if "torchtitan" in raw.framework:
        return
    if model.moe is not None and plan.tp > 1 and not plan.sp and (plan.ep > 1 or runs_megatron(raw.framework)):
        # Megatron-Core 0.16.1 transformer/moe/moe_layer.py MoELayer.forward raises in training whenever the attention
        # tp group is larger than 1 without sequence parallelism, whatever ep ("During training, performance may
        # degrade if MoE and tensor parallelism are enabled without also enabling sequence parallelism."); older
        # releases refused ep > 1 with tp > 1 in TransformerConfig
        bad("plan.sp", f"an MoE model with tensor parallelism (tp = {plan.tp}"
            + (f", ep = {plan.ep}" if plan.ep > 1 else "") + ") needs sequence parallelism (Megatron-Core's MoE "
            "layer raises at the first training step without it)",
            "turn sequence parallelism on (plan.sp: true; Megatron's --sequence-parallel)")
    # megatron/training/arguments.py validate_args turns sequence parallelism off at tp 1, then asserts "Tensor parallel
    # communication/GEMM overlap can happen only when sequence parallelism is enabled": a Megatron launch with
    # --tp-comm-overlap fails at tp 1 too. A native scenario at tp 1 has no TP communication to overlap: accepted.
    if plan.overlap.tp_comm and (not plan.sp_ if runs_megatron(raw.framework) else plan.tp > 1 and not plan.sp):
        bad("plan.overlap.tp_comm", f"overlapping tensor-parallel communication (tp = {plan.tp}) needs sequence "
            "parallelism (Megatron refuses --tp-comm-overlap without --sequence-parallel"
            + (", and turns sequence parallelism off at tp 1)" if plan.tp == 1 else ")"),
            "turn the TP overlap off" if plan.tp == 1 else
            "turn sequence parallelism on (plan.sp: true; --sequence-parallel) or the TP overlap off")
    if plan.overlap.param_gather and plan.sharding.zero_stage == 0:
        # megatron/training/arguments.py validate_args: "--overlap-param-gather only supported with distributed
        # optimizer or megatron fsdp"
        bad("plan.overlap.param_gather", "overlapping the parameter all-gather needs sharded parameters or optimizer "
            "state: there is no parameter all-gather without the distributed optimizer (zero_stage 0)",
            "use the distributed optimizer (plan.sharding.zero_stage: 1; Megatron's --use-distributed-optimizer) or "
            "turn the overlap off")
    if plan.overlap.param_gather and not plan.overlap.grad_reduce and plan.sharding.zero_stage < 3:
        # validate_args: "Must use --overlap-param-gather with --overlap-grad-reduce"
        bad("plan.overlap.param_gather", "overlapping the parameter all-gather needs the gradient reduction "
            "overlapped too (Megatron refuses --overlap-param-gather without --overlap-grad-reduce)",
            "turn on the gradient overlap (plan.overlap.grad_reduce; --overlap-grad-reduce), or the parameter-gather "
            "overlap off")
    n_off = plan.offload.activation_layers
    if n_off:
        # megatron/core/transformer/transformer_config.py __post_init__: layer-level CPU offloading
        if n_off >= model.num_layers:
            bad("plan.offload.activation_layers", f"CPU offloading of {n_off} layers: Megatron-Core offloads fewer "
                f"than the model's {model.num_layers} layers", f"offload at most {model.num_layers - 1} layers")
        if plan.pp > 1:
            bad("plan.offload.activation_layers", "layer-level CPU offloading with pipeline parallelism "
                "(Megatron-Core: 'no support for Pipeline parallelism with CPU offloading')",
                "use pp 1, or fine-grained activation offloading (--fine-grained-activation-offloading; "
                "plan.offload.activation_modules)")
        if plan.offload.activation_modules:
            bad("plan.offload.activation_layers", "layer-level CPU offloading together with fine-grained activation "
                "offloading (Megatron-Core: 'fine_grained_activation_offloading cannot be enabled with "
                "cpu_offloading')", "keep one of --cpu-offloading and --fine-grained-activation-offloading "
                "(plan.offload.activation_layers, activation_modules)")
        if plan.recompute.granularity != "none":
            bad("plan.offload.activation_layers", "layer-level CPU offloading with activation recomputation "
                "(Megatron-Core: 'CPU offloading does not work when activation recomputation is enabled')",
                "turn recomputation off or offload no layers")
    uneven = plan.first_stage_layers is not None or plan.last_stage_layers is not None
    if uneven and (plan.account_for_embedding or plan.account_for_loss) and plan.pipeline_layout is None:
        # Megatron get_num_layers_to_build: "Does not support standalone embedding stage and standalone loss stage
        # with uneven pp"
        bad("plan.account_for_loss" if plan.account_for_loss else "plan.account_for_embedding",
            "accounting for the embedding or loss in the pipeline split together with first/last stage layer counts "
            "(Megatron-Core refuses the pair: no standalone embedding or loss stage with uneven pp)",
            "keep the first/last stage layer counts or the account-for flags, not both")
    for key, count in (("plan.first_stage_layers", plan.first_stage_layers),
                       ("plan.last_stage_layers", plan.last_stage_layers)):
        if count == 0 and plan.pp > 1:
            # transformer_config.py: "num_layers_in_first_pipeline_stage must be larger than 0" (and last)
            bad(key, "a pipeline stage with no transformer layers (Megatron-Core requires more than 0)",
                "give the stage at least one layer, or leave it unset for an even split")


