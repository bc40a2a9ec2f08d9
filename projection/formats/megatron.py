"""Megatron-LM arguments -> RawScenario.

`args_to_raw` maps argparse dests (underscored names, as in a Primus YAML or an `args` namespace) to the canonical key
space, applying Megatron's argparse defaults and `validate_args` derivations (config-formats.md §1.2-1.9).
The files those args come in (a functional-test `model_config.yaml`, a flat YAML of dest names, a bash launch
script, a plain file of flags) are read by `projection.formats.megatron_files.load_megatron`.

Documented choices:
* NullTokenizer: up to Megatron commit c9dfe34 (2026-04-22) it reports `--vocab-size` + 1 (an EOD id); from then on
  exactly `--vocab-size` (§1.3 trap). Default: +1 only for framework names starting with 'primus' (Primus pins
  Megatron d3528a2, 2026-03, which still adds 1); plain Megatron follows HEAD (the functional-test fixtures are
  d98e8a6, after c9dfe34). `null_tokenizer_adds_eod` overrides the choice.
* `--vocab-size` given with another tokenizer type is used as the tokenizer length (models/ presets state it so).
* No `--tokenizer-type` with `--merge-file`: GPT-2 BPE (the only Megatron tokenizer taking a merge file; the gpt3
  functional tests pass only --vocab-file/--merge-file).
* Dropout: --hidden-dropout -> training.dropout (residual and embedding masks), --attention-dropout ->
  training.attention_dropout (the probabilities, saved without flash attention); both default 0.1.
* Attention backend: `--attention-backend local` and `--transformer-impl local` are Megatron's own unfused attention.
* Primus's decoder_pipeline_manual_split_list (layers per pipeline stage) becomes plan.stage_layers.
* A --moe-layer-freq list that a (first_k_dense, layer_freq) rule reproduces, e.g. DeepSeek's ([0]*3+[1]*58), is
  stored as that rule (the form the HF and TorchTitan loaders give the same model); any other list as layer_pattern.
* kv_channels equal to hidden / heads is not stored (head_dim None means exactly that), so explicit and omitted
  kv_channels give the same canonical model.
* Missing --num-layers / --hidden-size / --num-attention-heads raise here (no model without them); a missing
  --seq-length is left to `build_scenario` so a model-only preset still loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError
from projection.formats.common import one_slip
from projection.formats.megatron_args import DESTS, to_list
from projection.formats.megatron_checks import (
    argument_problems,
    deepep_problem,
    fsdp2_drops_fp8_gather,
    zero_bubble_rules,
)
from projection.formats.megatron_kernels import attention_backend, cuda_graphs, unmodelled_options
from projection.formats.megatron_model import MegatronArgs, model_section
from projection.specs.scenario import SET, Origin, RawScenario
from projection.workload.stages import LayoutError, expand_layout

SET_ORIGIN = SET  # a value a --set key gave (RawScenario.set refuses two spellings that disagree)


def args_to_raw(args: Mapping[str, Any], origins: Mapping[str, Origin], *, source: str, framework: str = "megatron",
                null_tokenizer_adds_eod: bool | None = None) -> RawScenario:
    """Megatron args (dest -> value, only the keys given) -> RawScenario. Absent dests take Megatron's argparse
    defaults; every canonical value carries the Origin of the dest it came from (derived values: the origin of what
    they were derived from; defaults: Origin('default (Megatron-LM argparse)', key=<flag>)). Raises ConfigError
    listing every problem (bad value types, missing model shape, impossible pipeline split); an unknown vocabulary
    is stood in for and its problem kept in `raw.placeholders` (build_scenario reports it with the layout's)."""
    a = MegatronArgs(args, origins, source=source, flags=framework == "megatron", bridge=framework == "megatron-bridge")
    for dest in args:  # a misspelt flag would be inert (Megatron's argparse rejects it; Primus passes it on)
        meant = [d for d in DESTS if one_slip(dest, d)]
        if dest not in DESTS and meant:
            a.problem(dest, f"unknown argument {a.key(dest)}", f"did you mean {a.key(meant[0])}?")
    raw = RawScenario(source=source, framework=framework)
    eod = framework.startswith("primus") if null_tokenizer_adds_eod is None else null_tokenizer_adds_eod
    model_section(a, raw, null_tokenizer_adds_eod=eod)
    _training(a, raw)
    _plan(a, raw)
    vpp = raw.get("plan.vpp")
    argument_problems(a, framework, vpp if isinstance(vpp, int) and vpp > 1 else None)
    if a.problems:
        raise ConfigError([*a.problems, *a.unknown.values()])
    raw.placeholders.update(a.unknown)
    name = args.get("model")  # Primus keeps the model preset's name under `model`
    if isinstance(name, str) and name:
        raw.set("model.name", name.removesuffix(".yaml"), origins.get("model", Origin(source, None, "model")))
    else:
        stem = Path(source).stem
        raw.set("model.name", Path(source).parent.name if stem == "model_config" else stem,
                Origin(source, None, "the file name"))
    return raw


def _training(a: MegatronArgs, raw: RawScenario) -> None:
    for dest, key in (("seq_length", "seq_length"), ("micro_batch_size", "micro_batch_size"),
                      ("global_batch_size", "global_batch_size")):
        if a.given(dest):
            raw.set(f"training.{key}", a.get(dest), a.origin(dest))
    # §1.6: params dtype fp32 unless --bf16 or --fp16.
    bf16, fp16 = a.get("bf16"), a.get("fp16")
    if bf16 and fp16:
        a.problem("fp16", "--bf16 and --fp16 are both set", "keep only one of them")
    dtype_dest = "bf16" if bf16 else "fp16" if fp16 else "bf16"
    raw.set("training.params_dtype", "bf16" if bf16 else "fp16" if fp16 else "fp32", a.origin(dtype_dest))
    if a.get("fp8") is not None:
        raw.set("training.fp8.format", a.get("fp8"), a.origin("fp8"))
        for dest, key in (("fp8_recipe", "recipe"), ("fp8_param_gather", "param_gather"),
                          ("fp8_amax_history_len", "amax_history_len")):
            raw.set(f"training.fp8.{key}", a.get(dest), a.origin(dest))
        if fsdp2_drops_fp8_gather(a, raw.framework):
            raw.set("training.fp8.param_gather", False, a.origin("use_torch_fsdp2"))
        for dest, keeps in (("fp8_weight_transpose_cache", a.get("fp8_weight_transpose_cache")),
                            ("no_fp8_weight_transpose_cache", not a.get("no_fp8_weight_transpose_cache"))):
            if a.given(dest) and not keeps:
                raw.set("training.fp8.weight_transpose_cache", False, a.origin(dest))
        if a.get("first_last_layers_bf16"):
            _bf16_layers(a, raw)
    opt = "training.optimizer"
    raw.set(f"{opt}.name", a.get("optimizer"), a.origin("optimizer"))
    if a.get("use_precision_aware_optimizer"):
        # §1.6: the state dtypes are honoured only with the precision-aware optimizer.
        raw.set(f"{opt}.precision_aware", True, a.origin("use_precision_aware_optimizer"))
        for dest in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            raw.set(f"{opt}.{dest}", a.get(dest), a.origin(dest))
    else:
        # §1.3 / megatron/training/arguments.py: with --bf16 main grads are accumulated and reduced in fp32 unless
        # --grad-reduce-in-bf16; with --fp16 they stay fp16 unless --accumulate-allreduce-grads-in-fp32.
        if a.get("grad_reduce_in_bf16"):
            grads, why = "bf16", "grad_reduce_in_bf16"
        elif fp16 and not a.get("accumulate_allreduce_grads_in_fp32"):
            grads, why = "fp16", "fp16"
        else:
            grads, why = "fp32", "accumulate_allreduce_grads_in_fp32" if fp16 else dtype_dest
        raw.set(f"{opt}.main_grads_dtype", grads, a.origin(why))
    raw.set("training.gradient_accumulation_fusion", a.get("gradient_accumulation_fusion"),
            a.origin("gradient_accumulation_fusion"))
    for dest in ("log_params_norm", "log_num_zeros_in_grad",  # per-iteration logging work (perf/optimizer.py)
                 "check_for_nan_in_loss_and_grad"):  # host reads of loss and bucket checks (perf/pricing.py)
        raw.set(f"training.{dest}", a.get(dest), a.origin(dest))
    # two rates in Megatron: residual / embedding dropout and the attention probabilities' dropout
    raw.set("training.dropout", a.get("hidden_dropout"), a.origin("hidden_dropout"))
    raw.set("training.attention_dropout", a.get("attention_dropout"), a.origin("attention_dropout"))
    raw.set("training.attention_backend", *attention_backend(a))
    raw.set("training.fused_loss", a.get("cross_entropy_loss_fusion"), a.origin("cross_entropy_loss_fusion"))
    impl = a.get("transformer_impl")
    raw.set("training.kernels.transformer_impl", "local" if impl == "local" else "transformer_engine",
            a.origin("transformer_impl"))
    # Primus-Turbo's DeepEP: with enable_primus_turbo and use_turbo_deepep, Primus sets moe_enable_deepep and the
    # 'flex' dispatcher before Megatron builds the model (AMD-AGI/Primus primus/backends/megatron/patches/turbo/
    # moe_dispatcher_patches.py)
    # (_is_turbo_deepep_enabled: tensor_model_parallel_size == 1 as well)
    turbo_deepep = raw.framework.startswith("primus") and bool(a.args.get("enable_primus_turbo")) \
        and bool(a.args.get("use_turbo_deepep")) and a.get("tensor_model_parallel_size") == 1
    deepep = "use_turbo_deepep" if turbo_deepep else "moe_enable_deepep" if a.get("moe_enable_deepep") else ""
    if deepep == "moe_enable_deepep":
        deepep_problem(a, raw.framework)  # Megatron-Core wants the flex dispatcher named beside it
    dispatcher = "flex" if deepep else a.get("moe_token_dispatcher_type")
    dispatcher = {"alltoall_seq": "alltoall"}.get(dispatcher, dispatcher)  # §1.7: the older sequence variant
    if dispatcher not in ("alltoall", "allgather", "flex"):
        a.problem("moe_token_dispatcher_type", f"unknown MoE token dispatcher {dispatcher!r}",
                  "use allgather, alltoall or flex")
    elif turbo_deepep:
        o = a.origins.get("use_turbo_deepep")
        raw.set("training.kernels.moe_token_dispatcher", dispatcher, o or Origin(a.source, None, "use_turbo_deepep"))
    else:
        raw.set("training.kernels.moe_token_dispatcher", dispatcher, a.origin(deepep or "moe_token_dispatcher_type"))
    backend = "turbo_deepep" if turbo_deepep else str(a.get("moe_flex_dispatcher_backend"))
    if dispatcher == "flex":  # other backends (ncclep, ...) read their counts on the host as DeepEP's does
        turbo = a.origins.get("use_turbo_deepep") if turbo_deepep else None
        raw.set("training.kernels.moe_flex_backend", backend, turbo or a.origin("moe_flex_dispatcher_backend"))
    cuda_graphs(a, raw)
    unmodelled_options(a, raw)
    for dest, key in (("moe_grouped_gemm", "moe_grouped_gemm"), ("moe_permute_fusion", "moe_permute_fusion"),
                      ("defer_embedding_wgrad_compute",
                                                                  "defer_embedding_wgrad"),
                      ("wgrad_deferral_limit", "wgrad_deferral_limit"),
                      ("cross_entropy_fusion_impl", "cross_entropy_fusion_impl")):
        raw.set(f"training.kernels.{key}", a.get(dest), a.origin(dest))


def _plan(a: MegatronArgs, raw: RawScenario) -> None:
    if a.get("use_tp_pp_dp_mapping"):  # initialize.py: order='tp-cp-ep-pp-dp' if args.use_tp_pp_dp_mapping
        raw.set("plan.rank_order", "tp-cp-ep-pp-dp", a.origin("use_tp_pp_dp_mapping"))
    for dest, key in (("tensor_model_parallel_size", "tp"), ("sequence_parallel", "sp"),
                      ("pipeline_model_parallel_size", "pp"), ("context_parallel_size", "cp"),
                      ("expert_model_parallel_size", "ep"), ("account_for_embedding_in_pipeline_split",
                                                             "account_for_embedding"),
                      ("account_for_loss_in_pipeline_split", "account_for_loss")):
        raw.set(f"plan.{key}", a.get(dest), a.origin(dest))
    for dest, key in (("expert_tensor_parallel_size", "etp"), ("decoder_first_pipeline_num_layers",
                                                               "first_stage_layers"),
                      ("decoder_last_pipeline_num_layers", "last_stage_layers"),
                      ("pipeline_model_parallel_layout", "pipeline_layout"),
                      ("microbatch_group_size_per_vp_stage", "microbatch_group_size")):
        if a.given(dest):
            raw.set(f"plan.{key}", a.get(dest), a.origin(dest))
    if a.given("cp_comm_type"):  # arguments.py --cp-comm-type, nargs='+': one type, or one per layer
        # one type, or one per layer as given (each layer's exchange is priced; specs/validate_kernels.py checks
        # the count as transformer_config.py __post_init__ does)
        listed = to_list(a.get("cp_comm_type")) or ["p2p"]
        raw.set("plan.cp_comm", " ".join(str(k) for k in listed), a.origin("cp_comm_type"))
    if a.given("hierarchical_context_parallel_sizes"):  # arguments.py: nargs='+', type=int
        raw.set("plan.cp_hierarchy", tuple(a.int_list("hierarchical_context_parallel_sizes")),
                a.origin("hierarchical_context_parallel_sizes"))
    vpp = _vpp(a)
    pp = a.get("pipeline_model_parallel_size")
    if a.given("decoder_pipeline_manual_split_list"):  # Primus-only: layers per pipeline stage, stage-major
        raw.set("plan.stage_layers", tuple(a.int_list("decoder_pipeline_manual_split_list")),
                a.origin("decoder_pipeline_manual_split_list"))
    if vpp is not None:
        raw.set("plan.vpp", vpp[0], vpp[1])
        if pp > 1:  # the contract: pp > 1 with vpp > 1 runs Megatron's interleaved 1F1B
            raw.set("plan.schedule", "interleaved_1f1b", vpp[1])
    if pp > 1:
        _primus_schedule(a, raw, pp)
    if not (a.get("patch_primus_pipeline") or (a.get("patch_zero_bubble") and a.get("enable_zero_bubble"))):
        # Megatron's schedules.py runs any pipeline (sim/p2p_walk.py), also one a layout search adds; Primus's
        # patches run their own scheduler, which the dependency walk models
        raw.set("plan.pipeline_runtime", "megatron", a.origin("pipeline_model_parallel_size"))
    _sharding(a, raw)
    _recompute(a, raw)
    off = "plan.offload"
    raw.set(f"{off}.optimizer", a.get("optimizer_cpu_offload"), a.origin("optimizer_cpu_offload"))
    raw.set(f"{off}.optimizer_fraction", a.get("optimizer_offload_fraction"), a.origin("optimizer_offload_fraction"))
    if a.get("optimizer_cpu_offload") and not a.get("use_precision_aware_optimizer"):
        a.problem("optimizer_cpu_offload", "optimizer CPU offload requires the precision-aware optimizer (Megatron "
                  "validate_args)", "add --use-precision-aware-optimizer")
    # §1.5: --cpu-offloading-num-layers > 0 offloads that many layers' activations (older: with --cpu-offloading).
    if a.get("cpu_offloading_num_layers") > 0:
        raw.set(f"{off}.activation_layers", a.get("cpu_offloading_num_layers"), a.origin("cpu_offloading_num_layers"))
    if a.get("fine_grained_activation_offloading"):
        raw.set(f"{off}.activation_modules", tuple(a.get("offload_modules") or ()), a.origin("offload_modules"))
    ov = "plan.overlap"
    for dest, key in (("overlap_grad_reduce", "grad_reduce"), ("overlap_param_gather", "param_gather"),
                      ("tp_comm_overlap", "tp_comm"), ("overlap_moe_expert_parallel_comm", "ep_comm"),
                      ("align_grad_reduce", "align_grad_reduce")):
        raw.set(f"{ov}.{key}", a.get(dest), a.origin(dest))
    if a.get("use_megatron_fsdp") and not a.get("use_torch_fsdp2") and a.get("overlap_param_gather") and \
            a.get("data_parallel_sharding_strategy") == "no_shard":
        # validate_args accepts --overlap-param-gather with Megatron-FSDP whatever its strategy ("only supported with
        # distributed optimizer or megatron fsdp"); under no_shard every rank holds whole parameters, so there is no
        # parameter all-gather for it to overlap
        raw.set(f"{ov}.param_gather", False, a.origin("data_parallel_sharding_strategy"))
    # Megatron validate_args turns overlap_p2p_comm off without a virtual pipeline (§1.3): kept as given, it applies
    # where the plan interleaves (ParallelPlan.megatron_p2p_overlap), also in a layout search that adds one
    raw.set(f"{ov}.p2p_comm", a.get("overlap_p2p_comm"), a.origin("overlap_p2p_comm"))


# Primus pp_algorithm (patch_primus_pipeline) -> schedule; "zero-bubble-heuristic" builds Primus's own cost-driven
# order, taken as ZB-H1 (the same memory bound, pp pending backwards)
_PP_ALGORITHMS = {"1f1b": "1f1b", "1f1b-interleaved": "interleaved_1f1b", "zero-bubble": "zb_h1",
                  "zero-bubble-heuristic": "zb_h1", "zbv-formatted": "zbv", "v-half": "v_half", "v-min": "v_min"}
_ZBV_MEM_SETUPS = {"half": "v_half", "min": "v_min", "zb": "zbv"}


def _primus_schedule(a: MegatronArgs, raw: RawScenario, pp: int) -> None:
    """Primus's pipeline patches: `patch_primus_pipeline` with `pp_algorithm`, or `patch_zero_bubble` (with
    `enable_zero_bubble`): ZB-V with its memory setup when `zero_bubble_v_schedule`, else ZB-H2 when
    `zero_bubble_max_pending_backward` allows 2 pp pending backwards (zb2p) and ZB-H1 otherwise, 'auto' (an adaptive
    memory limit) included. V schedules place two stages per rank (vpp 2)."""
    name, origin = None, None
    if a.get("patch_zero_bubble") and a.get("enable_1f1b_v"):
        a.problem("enable_1f1b_v", "Primus's 1F1B-V schedule is not modelled", "use zero_bubble_v_schedule (ZB-V, "
                  "V-Half, V-Min) or a 1F1B schedule")
        return
    if a.get("patch_primus_pipeline"):
        algo = str(a.get("pp_algorithm"))
        if algo not in _PP_ALGORITHMS:
            a.problem("pp_algorithm", f"unknown Primus pp_algorithm {algo!r}", "use one of: " +
                      ", ".join(_PP_ALGORITHMS))
            return
        name, origin = _PP_ALGORITHMS[algo], a.origin("pp_algorithm")
        if name == "interleaved_1f1b" and (_vpp(a) or (1, None))[0] == 1:
            name = "1f1b"  # interleaving needs a virtual pipeline
    elif a.get("patch_zero_bubble") and a.get("enable_zero_bubble"):
        if a.get("zero_bubble_v_schedule"):
            setup = str(a.get("zero_bubble_v_schedule_mem_setup"))
            if setup not in _ZBV_MEM_SETUPS:
                a.problem("zero_bubble_v_schedule_mem_setup", f"unknown ZB-V memory setup {setup!r}",
                          "use half, min or zb")
                return
            name, origin = _ZBV_MEM_SETUPS[setup], a.origin("zero_bubble_v_schedule")
        else:
            pending = str(a.get("zero_bubble_max_pending_backward"))
            name = "zb_h2" if pending.isdecimal() and int(pending) >= 2 * pp else "zb_h1"
            origin = a.origin("patch_zero_bubble")
        zero_bubble_rules(a)
    if name is None or origin is None:
        return
    raw.set("plan.schedule", name, origin)
    if name in ("zbv", "v_half", "v_min"):
        given = _vpp(a)
        if given is not None and given[0] != 2:  # Primus's launcher asserts vpp 2 for its V schedules
            a.problem("pp_algorithm" if a.get("patch_primus_pipeline") else "zero_bubble_v_schedule",
                      f"the V schedule {name} places two model chunks per rank: it needs vpp 2, not {given[0]}",
                      "set the virtual pipeline to 2 stages per rank, or pick a non-V schedule")
            return
        raw.set("plan.vpp", 2, origin)


def _vpp(a: MegatronArgs) -> tuple[int, Origin] | None:
    """Virtual pipeline size from one of its three spellings (§1.3 'Virtual pipeline'); None when it is 1."""
    given = [d for d in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                         "pipeline_model_parallel_layout") if a.given(d)]
    if len(given) > 1:
        a.problem(given[1], f"at most one of {', '.join(a.key(d) for d in given)} may be set (Megatron "
                  "validate_args)", "keep one of them")
        return None
    if not given:
        return None
    dest, pp = given[0], a.get("pipeline_model_parallel_size")
    if not isinstance(pp, int) or pp < 1:  # refused with the layout (ParallelPlan: pp >= 1)
        return None
    if dest == "num_virtual_stages_per_pipeline_rank":
        vpp = a.get(dest)
    elif dest == "pipeline_model_parallel_layout":
        try:
            stages = len(expand_layout(a.get(dest)))
        except LayoutError as e:
            a.problem(dest, str(e), "fix the layout string (E t m L | * ( ) ,)")
            return None
        if stages % pp:
            a.problem(dest, f"the layout has {stages} stages, not a multiple of pipeline size {pp}",
                      "give pp * vpp stages separated by '|'")
            return None
        vpp = stages // pp  # Megatron PipelineParallelLayerLayout: vpp = stages / pp
    else:
        # validate_args: vpp = (num_layers [+1 embedding] [+1 loss]) // pp // layers_per_virtual_stage
        n = a.get("num_layers") or 0
        n += int(a.get("account_for_embedding_in_pipeline_split")) + int(a.get("account_for_loss_in_pipeline_split"))
        per = a.get(dest)
        if per is None or per <= 0 or n % pp or (n // pp) % per:
            a.problem(dest, f"{n} layers over pipeline size {pp} cannot be cut into virtual stages of {per} layers",
                      "choose a layer count per virtual stage that divides num_layers / pp")
            return None
        vpp = n // pp // per
    if vpp is None or vpp < 1:
        return None
    if vpp > 1 and pp == 1:
        a.problem(dest, "a virtual pipeline needs pipeline-model-parallel-size > 1 (Megatron validate_args)",
                  "raise --pipeline-model-parallel-size or drop the virtual-pipeline setting")
    return (vpp, a.origin(dest)) if vpp > 1 else None


def _bf16_layers(a: MegatronArgs, raw: RawScenario) -> None:
    """--first-last-layers-bf16 under fp8: the first and last decoder layers run without fp8 (Megatron-Core
    fp8_utils.is_first_last_bf16_layer); what TransformerConfig refuses with it is checked with the layout
    (specs/validate_kernels.py `_bf16_layers`)."""
    for dest, key in (("num_layers_at_start_in_bf16", "bf16_first_layers"),
                      ("num_layers_at_end_in_bf16", "bf16_last_layers")):
        # a count left at its default is reported at --first-last-layers-bf16, the flag the file does give
        raw.set(f"training.fp8.{key}", a.get(dest), a.origin(dest if a.given(dest) else "first_last_layers_bf16"))


def _sharding(a: MegatronArgs, raw: RawScenario) -> None:
    sh = "plan.sharding"
    # §1.4 / contract: distributed optimizer = ZeRO-1; torch FSDP2 = ZeRO-3; Megatron-FSDP by its strategy.
    if a.get("use_torch_fsdp2"):
        raw.set(f"{sh}.zero_stage", 3, a.origin("use_torch_fsdp2"))
        raw.set(f"{sh}.fsdp", "torch_fsdp2", a.origin("use_torch_fsdp2"))
    elif a.get("use_megatron_fsdp"):
        strategy = a.get("data_parallel_sharding_strategy")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            a.problem("data_parallel_sharding_strategy", f"unknown sharding strategy {strategy!r}",
                      f"use one of {', '.join(stages)}")
        stage = stages.get(strategy, 3)
        raw.set(f"{sh}.zero_stage", stage, a.origin("data_parallel_sharding_strategy"))
        if stage == 3:
            raw.set(f"{sh}.fsdp", "megatron_fsdp", a.origin("use_megatron_fsdp"))
    else:
        raw.set(f"{sh}.zero_stage", 1 if a.get("use_distributed_optimizer") else 0,
                a.origin("use_distributed_optimizer"))
    raw.set(f"{sh}.distributed_optimizer_instances", a.get("num_distributed_optimizer_instances"),
            a.origin("num_distributed_optimizer_instances"))


def _recompute(a: MegatronArgs, raw: RawScenario) -> None:
    rc = "plan.recompute"
    granularity, origin = a.get("recompute_granularity"), a.origin("recompute_granularity")
    if granularity is None and a.get("recompute_activations"):  # §1.3: --recompute-activations = selective
        granularity, origin = "selective", a.origin("recompute_activations")
    modules = list(a.get("recompute_modules") or [])
    if granularity == "selective" and not modules:
        modules = ["core_attn"]  # §1.3: selective modules default to ["core_attn"]
    if a.get("moe_layer_recompute"):
        # §1.5: --moe-layer-recompute checkpoints the whole MoE block, the same as recompute module "moe".
        granularity = granularity or "selective"
        if granularity == "selective" and "moe" not in modules:
            modules.append("moe")
        origin = origin if a.given("recompute_granularity") else a.origin("moe_layer_recompute")
    raw.set(f"{rc}.granularity", granularity or "none", origin)
    given = [d for d in ("recompute_method", "recompute_num_layers") if a.given(d)]
    if granularity == "selective" and given:
        # validate_args: 'recompute method is not yet supported for selective recomputing granularity';
        # TransformerConfig: 'When using recompute_granularity: selective recompute_num_layers must be None.'
        a.problem(given[0], f"selective recompute takes no {' / '.join(a.key(d) for d in given)} (Megatron "
                  "refuses them)", f"drop {' and '.join(a.key(d) for d in given)}, or use full granularity")
    for dest, key in (("recompute_method", "method"), ("recompute_num_layers", "num_layers")):
        if a.given(dest) and granularity == "full":
            raw.set(f"{rc}.{key}", a.get(dest), a.origin(dest))
    if a.given("recompute_layer_ids") and granularity == "full":
        raw.set(f"{rc}.layer_ids", tuple(a.int_list("recompute_layer_ids")), a.origin("recompute_layer_ids"))
    if granularity == "selective":
        raw.set(f"{rc}.modules", tuple(modules), a.origin("recompute_modules"))
    raw.set(f"{rc}.distribute_saved_activations", a.get("distribute_saved_activations"),
            a.origin("distribute_saved_activations"))


__all__ = ["SET_ORIGIN", "args_to_raw"]
