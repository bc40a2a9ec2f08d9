"""TorchTitan train configs (TOML, v0.1 and v0.2 layouts) -> RawScenario in the canonical key space.

Spec: shared/reference/config-formats.md §3 (sections and defaults of pytorch/torchtitan @v0.2.2 `JobConfig`, flavors,
PP stage split) and the traps of §8.2 (#2 FFN rounding, #12 version drift). v0.1 differences handled here: `[float8]`
instead of `[quantize.linear.float8]`, `[mx]` instead of `[quantize.linear.mx]`, `training.compile` instead of
`[compile] enable`, `model.tokenizer_path`, `parallelism.pipeline_parallel_split_points`.

`job_config_to_raw` takes the nested sections as a mapping, so the Primus loader can feed it the torchtitan YAML it has
merged. Batch sizes count sequences; sequence lengths count tokens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, shown
from projection.formats.common import coerce_scalar, load_toml, set_nested
from projection.formats.torchtitan_flavors import NO_PIPELINE_MODELS, FlavorError, known_models, model_fields
from projection.formats.torchtitan_fp8 import read_fp8
from projection.formats.torchtitan_schema import (
    SCHEDULES,
    UNMODELLED_SCHEDULES,
    JobReader,
    check_schema,
)
from projection.specs.scenario import Origin, RawScenario

_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


def load_torchtitan(path: Path, overrides: Mapping[str, Any] | None = None) -> RawScenario:
    """Load a TorchTitan TOML train config. `overrides` use TorchTitan's CLI spelling (`training.local_batch_size`,
    leading dashes allowed) and are applied before conversion; string values are read as YAML scalars."""
    data, lines = load_toml(path)
    origins = {".".join(k): Origin(str(path), line, ".".join(k)) for k, line in lines.items()}
    for key, value in (overrides or {}).items():
        dotted = key.lstrip("-")
        set_nested(data, dotted, coerce_scalar(value) if isinstance(value, str) else value)
        origins[dotted] = Origin("--set", None, dotted)
    raw = job_config_to_raw(data, origins, source=str(path))
    # TorchTitan's launcher, run_train.sh, starts torchrun with PYTORCH_ALLOC_CONF="expandable_segments:True"
    # (PYTORCH_CUDA_ALLOC_CONF in older versions); a TOML cannot say otherwise, --set env.PYTORCH_ALLOC_CONF can
    raw.job_env["PYTORCH_ALLOC_CONF"] = (
        "expandable_segments:True", Origin("default (TorchTitan's run_train.sh sets PYTORCH_ALLOC_CONF="
                                           "expandable_segments:True; --set env.PYTORCH_ALLOC_CONF=... to change)"))
    return raw


def job_config_to_raw(cfg: Mapping[str, Any], origins: Mapping[str, Origin], *, source: str,
                      framework: str = "torchtitan") -> RawScenario:
    """Convert TorchTitan JobConfig sections (nested mapping) to a RawScenario. `origins` maps dotted "section.key" to
    where it was written. Raises ConfigError listing every problem: unknown section, unknown key in a modelled section,
    unknown model/flavor, bad value, unsupported feature."""
    job = JobReader(cfg, origins, source)
    check_schema(job)
    unknown = len(job.problems)  # unknown sections and keys: nothing below reads them
    raw = RawScenario(source=source, framework=framework)
    model = _model(job, raw)
    tp, pp, cp = (job.integer(f"parallelism.{k}_parallel_degree", 1) for k in ("tensor", "pipeline", "context"))
    _training(job, raw, pp)
    fp8_gather_ok = _plan(job, raw, tp, pp, cp, model)
    fp8 = read_fp8(job, fp8_gather_ok, mla=bool(raw.get("model.mla")), tp=tp)
    if fp8 is not None:
        raw.set("training.fp8", fp8, job.origin("model.converters"))
    _recompute(job, raw)
    if pp > 1 and model is not None:
        _pipeline(job, raw, pp, model)
    if len(job.problems) > unknown:
        raise ConfigError(job.problems)
    raw.deferred += job.problems  # only unknown keys: reported with the layout's problems (build_scenario)
    return raw


def _model(job: JobReader, raw: RawScenario) -> dict[str, Any] | None:
    """Flavor table -> canonical model fields, all located at `model.flavor`."""
    name, flavor = str(job.get("model.name", "llama3")), str(job.get("model.flavor", "debugmodel"))
    try:
        fields = model_fields(name, flavor)
    except FlavorError as err:
        key = "model.name" if name not in known_models() else "model.flavor"
        job.problem(key, str(err), "use one of: " + ", ".join(err.known))
        return None
    origin = job.origin("model.flavor")
    for field, value in fields.items():
        raw.set(f"model.{field}", value, origin)
    _norm_type(job, raw)
    return {**fields, "model": name}


def _norm_type(job: JobReader, raw: RawScenario) -> None:
    """[model] norm_type of the 2024 TorchTitan releases (torchtitan/models/norms.py build_norm): 'rmsnorm' is
    TorchTitan's own RMSNorm, the composite aten chain run eagerly (x.float(), pow, mean, rsqrt, products, cast:
    KernelSpec.rms_norm_kernel 'composite'); 'fused_rmsnorm' its Triton kernel and 'compiled_rmsnorm' a compiled
    one, one kernel a direction; 'layernorm' / 'np_layernorm' nn.LayerNorm without bias (with / without weight).
    Later releases build nn.RMSNorm and have no such key: PyTorch's fused kernel since 2.8."""
    key = "model.norm_type"
    if not job.has(key):
        return
    kinds = ("rmsnorm", "fused_rmsnorm", "compiled_rmsnorm", "layernorm", "np_layernorm")
    value = job.get(key, "rmsnorm")
    kind = value.lower() if isinstance(value, str) else value  # build_norm: `norm_type = norm_type.lower()`
    if kind not in kinds:
        job.problem(key, f"{shown(value)} is not one of {', '.join(kinds)}", f"set {key} to one of: {', '.join(kinds)}")
        return
    if kind == "rmsnorm":
        raw.set("training.kernels.rms_norm_kernel", "composite", job.origin(key))
    elif kind in ("layernorm", "np_layernorm"):
        raw.set("model.norm", "layernorm", job.origin(key))


def _training(job: JobReader, raw: RawScenario, pp: int) -> None:
    """Sequence, batch, precision and optimizer (config-formats.md §3.2 [training], [optimizer])."""
    raw.set("training.seq_length", job.integer("training.seq_len", 2048), job.origin("training.seq_len"))
    local = job.integer("training.local_batch_size", 8)
    raw.set("training.local_batch_size", local, job.origin("training.local_batch_size"))
    micro, micro_key = local, "training.local_batch_size"
    if pp > 1:  # PP microbatches = local_batch_size / pipeline_parallel_microbatch_size
        micro_key = "parallelism.pipeline_parallel_microbatch_size"
        micro = job.integer(micro_key, 1)
        if local % micro:
            job.problem(micro_key, f"local_batch_size {local} is not divisible by the pipeline microbatch size "
                        f"{micro}", "choose a pipeline_parallel_microbatch_size that divides local_batch_size")
    raw.set("training.micro_batch_size", micro, job.origin(micro_key))
    # -1 (any value < 0) means local_batch_size * dp, dp = dp_replicate * dp_shard (CP excluded): leave it unset.
    gbs = job.integer("training.global_batch_size", -1, minimum=-(2**62))
    if gbs > 0:
        raw.set("training.global_batch_size", gbs, job.origin("training.global_batch_size"))
    elif gbs == 0:
        job.problem("training.global_batch_size", "global batch size 0", "use -1 (= local_batch_size * dp) or > 0")
    dtype = job.choice("training.dtype", "float32", tuple(_DTYPES))
    opt = "training.optimizer"
    if dtype == "bfloat16":  # pure bf16: params, grads and optimizer state in bf16, no fp32 master copy
        origin = job.origin("training.dtype")
        raw.set("training.params_dtype", "bf16", origin)
        for field in ("main_params_dtype", "main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            raw.set(f"{opt}.{field}", "bf16", origin)
    else:  # FSDP mixed precision: fp32 master params, compute in mixed_precision_param, reduce in ..._reduce
        param = job.choice("training.mixed_precision_param", "bfloat16", tuple(_DTYPES))
        reduce = job.choice("training.mixed_precision_reduce", "float32", tuple(_DTYPES))
        raw.set("training.params_dtype", _DTYPES[param], job.origin("training.mixed_precision_param"))
        raw.set(f"{opt}.main_params_dtype", "fp32", job.origin("training.dtype"))
        raw.set(f"{opt}.main_grads_dtype", _DTYPES[reduce], job.origin("training.mixed_precision_reduce"))
    name = str(job.get("optimizer.name", "AdamW"))
    if name.lower() in ("adam", "adamw"):  # torchtitan build_optimizers: Adam / AdamW
        raw.set(f"{opt}.name", name.lower(), job.origin("optimizer.name"))
        # build_optimizers passes fused / foreach: [optimizer] implementation (default 'fused'), or in the 2024
        # releases optimizer.fused (default false: foreach = not fused)
        if job.has("optimizer.implementation"):
            way = job.choice("optimizer.implementation", "fused", ("fused", "foreach", "for-loop"))
            raw.set(f"{opt}.implementation", way, job.origin("optimizer.implementation"))
        elif job.has("optimizer.fused"):
            fused = job.flag("optimizer.fused", False)
            raw.set(f"{opt}.implementation", "fused" if fused else "foreach", job.origin("optimizer.fused"))
        if job.has("optimizer.weight_decay"):
            raw.set(f"{opt}.weight_decay", job.get("optimizer.weight_decay"), job.origin("optimizer.weight_decay"))
    else:
        job.problem("optimizer.name", f"optimizer {name!r} is not a TorchTitan optimizer", "use AdamW or Adam")


def _plan(job: JobReader, raw: RawScenario, tp: int, pp: int, cp: int, model: dict[str, Any] | None) -> bool:
    """Parallel degrees, sharding, offload and overlap; returns whether the shard degree may exceed 1 (fp8 gather)."""
    p = "parallelism"
    raw.set("plan.tp", tp, job.origin(f"{p}.tensor_parallel_degree"))
    raw.set("plan.sp", tp > 1, job.origin(f"{p}.tensor_parallel_degree"))  # TorchTitan TP always shards sequence
    raw.set("plan.tp_style", "dtensor", job.origin(f"{p}.tensor_parallel_degree"))
    # TorchTitan's eager modules save other tensors than Transformer Engine's (memory/activations.py)
    raw.set("training.kernels.transformer_impl", "torchtitan", job.origin("model.name"))
    if tp > 1 and job.flag(f"{p}.disable_loss_parallel", False):
        # without loss parallelism the logits are all-gathered (output layouts Replicate) and every TP rank runs the
        # full-vocabulary cross-entropy: memory and traffic tp times the vocab-parallel loss's, not modelled
        job.problem(f"{p}.disable_loss_parallel", "a TP job without loss parallelism (replicated logits and a "
                    "full-vocabulary loss on every TP rank) is not modelled", "leave loss parallelism on (the default)")
    raw.set("plan.schedule_style", "torch", job.origin(f"{p}.pipeline_parallel_schedule"))
    raw.set("plan.pp", pp, job.origin(f"{p}.pipeline_parallel_degree"))
    raw.set("plan.cp", cp, job.origin(f"{p}.context_parallel_degree"))
    # torch's context parallel: "allgather" gathers K/V (the default), "alltoall" passes them round a ring
    rotate = job.choice(f"{p}.context_parallel_rotate_method", "allgather", ("allgather", "alltoall"))
    raw.set("plan.cp_comm", "all_gather" if rotate == "allgather" else "p2p",
            job.origin(f"{p}.context_parallel_rotate_method"))
    rep = job.integer(f"{p}.data_parallel_replicate_degree", 1)
    shard = job.integer(f"{p}.data_parallel_shard_degree", -1, also=(-1,))
    if shard != -1:  # -1 = the ranks left over, resolved from the world size later
        raw.set("plan.dp", rep * shard, job.origin(f"{p}.data_parallel_shard_degree"))
    ep = job.integer(f"{p}.expert_parallel_degree", 1)
    etp = job.integer(f"{p}.expert_tensor_parallel_degree", 1)
    if model is not None and model.get("moe"):  # EP/ETP have no effect on dense models (JobConfig docs)
        raw.set("plan.ep", ep, job.origin(f"{p}.expert_parallel_degree"))
        if ep > 1 and etp not in (1, tp):
            job.problem(f"{p}.expert_tensor_parallel_degree", f"expert_tensor_parallel_degree {etp} must be 1 or "
                        f"equal to tensor_parallel_degree {tp} when EP > 1", f"set it to 1 or {tp}")
        elif ep > 1:  # with EP = 1 the experts are TP-sharded like the rest: etp stays None (= tp)
            raw.set("plan.etp", etp, job.origin(f"{p}.expert_tensor_parallel_degree"))
    # FSDP2 (fully_shard, ZeRO-3) applies wherever dp_shard * cp > 1 (config-formats.md §3.4, ParallelDims
    # .fsdp_enabled). It is asked for here whatever the degrees, and specs/validate.torchtitan_without_fsdp decides
    # once -1 is resolved from the world size, an explicit shard degree of 1 the same way: no FSDP then, replicas as
    # DDP, and no mixed precision under TP or PP.
    # torchao's fp8 all-gather needs a shard degree above 1 (dp_shard_enabled); -1 is decided with the world size
    fp8_gather_ok = shard != 1
    policy = job.choice(f"{p}.fsdp_reshard_after_forward", "default", ("default", "always", "never"))
    origin = job.origin(f"{p}.data_parallel_shard_degree")
    raw.set("plan.sharding.zero_stage", 3, origin)
    raw.set("plan.sharding.fsdp", "torch_fsdp2", origin)
    # "default" reshards after forward unless PP is on (torchtitan parallelize: not pp_enabled).
    reshard = {"always": True, "never": False}.get(policy, pp == 1)
    raw.set("plan.sharding.reshard_after_forward", reshard, job.origin(f"{p}.fsdp_reshard_after_forward"))
    raw.set("plan.overlap.param_gather", True, origin)  # FSDP2 prefetches the next all-gather
    if rep > 1:  # HSDP; replicas without a shard group are DDP (apply_ddp), over the whole dp group
        raw.set("plan.sharding.dp_replicate", rep, job.origin(f"{p}.data_parallel_replicate_degree"))
    if rep > 1 and shard != -1 and shard * cp == 1 and (tp > 1 or pp > 1):
        job.problem(f"{p}.data_parallel_replicate_degree", f"data-parallel replicas without a shard group run as "
                    f"DDP, which TorchTitan refuses beside TP or PP (tp {tp}, pp {pp}): 'DDP has not supported > 1D "
                    "parallelism'", "give data_parallel_shard_degree > 1 (HSDP), or drop TP and PP")
    # FSDP2's reduce-scatter and DDP's all-reduce both run during backward
    raw.set("plan.overlap.grad_reduce", True, origin)
    if job.flag("training.enable_cpu_offload", False):
        raw.set("plan.offload.fsdp_params", True, job.origin("training.enable_cpu_offload"))
    # Async TP needs torch.compile of the model: [compile] enable + "model" component (v0.2), training.compile (v0.1).
    components = _components(job)
    compiled = (job.flag("compile.enable", False) and "model" in components) or job.flag("training.compile", False)
    _compiled_kernels(job, raw, compiled, components)
    if tp > 1 and job.flag(f"{p}.enable_async_tensor_parallel", False):
        if compiled:
            raw.set("plan.overlap.tp_comm", True, job.origin(f"{p}.enable_async_tensor_parallel"))
        else:  # parallelize_llama: `raise RuntimeError("Async TP requires torch.compile")`
            job.problem(f"{p}.enable_async_tensor_parallel", "async TP without torch.compile of the model: "
                        "TorchTitan refuses it at start-up ('Async TP requires torch.compile')",
                        "turn [compile] enable on with the 'model' component, or enable_async_tensor_parallel off")
    return fp8_gather_ok


def _components(job: JobReader) -> list[str]:
    """[compile] components (TorchTitan's default ["model", "loss"]); a value that is not a list of names is a
    problem (`"model" in "abc"` would be a substring test)."""
    value = job.get("compile.components", ["model", "loss"])
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    job.problem("compile.components", f"expected a list of component names, got {shown(value)}",
                'give components = ["model", "loss"] (or one of them)')
    return []


def _compiled_kernels(job: JobReader, raw: RawScenario, model_compiled: bool, components: list[str]) -> None:
    """torch.compile of the blocks and of the loss, and Primus-Turbo's attention, where they change what is saved.
    The loss compiled (v0.2 component "loss"; v0.1 `training.compile` compiles it with the model) keeps the 16-bit
    logits for backward instead of the fp32 log-softmax, as a fused loss does (measured: 2 B per logit against 4,
    tests/oracle/test_memory_torchtitan_compile.py). Primus's turbo attention patch replaces Llama 3 and 4 attention
    with a GQA-native kernel that takes K and V without repeat_kv."""
    if model_compiled:
        origin = job.origin("compile.enable" if job.has("compile.enable") else "training.compile")
        raw.set("training.kernels.compiled", True, origin)
    loss = (job.flag("compile.enable", False) and "loss" in components) or job.flag("training.compile", False)
    if loss:
        raw.set("training.fused_loss", True, job.origin("compile.components" if job.has("compile.components")
                                                       else "compile.enable" if job.has("compile.enable")
                                                       else "training.compile"))
    name = str(job.get("model.name", ""))
    if job.flag("primus_turbo.enable_primus_turbo", False) and job.flag("primus_turbo.use_turbo_attention", True) \
            and name in ("llama3", "llama4"):
        raw.set("training.kernels.gqa_native_attention", True, job.origin("primus_turbo.use_turbo_attention"))


def _recompute(job: JobReader, raw: RawScenario) -> None:
    """[activation_checkpoint] -> plan.recompute (config-formats.md §3.2)."""
    key = "activation_checkpoint.mode"
    mode = job.choice(key, "selective", ("none", "selective", "full", "memory_budget"))
    origin = job.origin(key)
    if mode == "memory_budget":
        job.problem(key, "mode 'memory_budget' lets the compiler choose what to recompute; it cannot be projected",
                    "use none, selective or full")
    elif mode == "full":  # every TransformerBlock is checkpoint-wrapped: Megatron uniform recompute of 1 layer
        raw.set("plan.recompute", {"granularity": "full", "method": "uniform", "num_layers": 1}, origin)
    elif mode == "selective":
        opt_key = "activation_checkpoint.selective_ac_option"
        option = str(job.get(opt_key, "2")).strip()
        if option == "op":
            modules: tuple[str, ...] = ("op",)
        elif option.isdecimal():  # every N-th block fully checkpointed; 0 means every block (`not ac_freq` in apply_ac)
            modules = (f"layer:{max(1, int(option))}",)
        else:
            job.problem(opt_key, f"selective_ac_option {option!r} is neither 'op' nor an integer",
                        "use 'op' or an integer N >= 0 (checkpoint every N-th layer; 0: every layer)")
            return
        raw.set("plan.recompute", {"granularity": "selective", "modules": modules}, job.origin(opt_key))
    else:
        raw.set("plan.recompute", {"granularity": "none"}, origin)


def stage_layer_counts(num_layers: int, num_stages: int, first_stage_less_layers: int = 1,
                       last_stage_less_layers: int = 1) -> list[int]:
    """Decoder layers per virtual stage, data-flow order, as torchtitan `generate_llm_fqn_per_model_part` splits them.

    Units = layers + first_stage_less_layers (embedding) + last_stage_less_layers (norm + output); each stage gets
    floor(units / stages) units and the first (units mod stages) one more; stage 0 spends its first units on the
    embedding, the last stage on norm + output (config-formats.md §3.2). Raises ValueError where torchtitan asserts."""
    if num_stages == 1:
        return [num_layers]
    units = num_layers + first_stage_less_layers + last_stage_less_layers
    per, extra = divmod(units, num_stages)
    if per < 1 or max(first_stage_less_layers, last_stage_less_layers) > per:
        raise ValueError(f"{num_layers} layers + {first_stage_less_layers} + {last_stage_less_layers} less-layer units "
                         f"cannot fill {num_stages} stages ({per} units each)")
    counts = [per + (s < extra) for s in range(num_stages)]
    counts[0] -= first_stage_less_layers
    counts[-1] -= last_stage_less_layers
    return counts


def _pipeline(job: JobReader, raw: RawScenario, pp: int, model: dict[str, Any]) -> None:
    """Schedule, stages per rank and TorchTitan's own layer split -> plan.schedule / vpp / stage_layers."""
    p = "parallelism"
    if model["model"] in NO_PIPELINE_MODELS:
        job.problem(f"{p}.pipeline_parallel_degree", f"TorchTitan v0.2.2 has no pipeline parallelism for "
                    f"{model['model']} (its train spec's pipelining_fn is None)", "set pipeline_parallel_degree = 1")
        return
    sched_key = f"{p}.pipeline_parallel_schedule"
    name = str(job.get(sched_key, "1F1B"))
    if name.lower() in UNMODELLED_SCHEDULES:
        job.problem(sched_key, f"{name} (zero-bubble over several stages per rank) is not modelled: projection's "
                    "zero-bubble schedules run one stage per rank (ZB-H1/H2) or two in a V (ZBVZeroBubble)",
                    "project it as Interleaved1F1B or ZBVZeroBubble (--set parallelism.pipeline_parallel_schedule=...)")
        return
    if name.lower() not in SCHEDULES:
        job.problem(sched_key, f"unsupported pipeline schedule {name!r}",
                    "use one of: GPipe, 1F1B, Interleaved1F1B, LoopedBFS, ZBVZeroBubble, DualPipeV")
        return
    schedule, multi = SCHEDULES[name.lower()]
    n = model["num_layers"]
    in_w = job.integer(f"{p}.pipeline_parallel_first_stage_less_layers", 1, minimum=0)
    out_w = job.integer(f"{p}.pipeline_parallel_last_stage_less_layers", 1, minimum=0)
    fqns, splits = job.get(f"{p}.module_fqns_per_model_part"), job.get(f"{p}.pipeline_parallel_split_points")
    try:
        if fqns:  # explicit modules per stage: count the `layers.<i>` entries of each part
            src = f"{p}.module_fqns_per_model_part"
            counts = [sum(bool(re.fullmatch(r"layers\.\d+", str(m))) for m in part) for part in fqns]
        elif splits:  # v0.1: each split point "layers.<i>" starts a new stage
            src = f"{p}.pipeline_parallel_split_points"
            bounds = [0, *(int(str(s).rsplit(".", 1)[-1]) for s in splits), n]
            counts = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
            if min(counts) < 0:
                raise ValueError(f"split points {splits} are not increasing layer names within 0..{n}")
        else:
            lps_key = f"{p}.pipeline_parallel_layers_per_stage"
            src = lps_key if job.has(lps_key) else f"{p}.pipeline_parallel_first_stage_less_layers"
            if job.has(lps_key):  # stages = ceil(units / layers_per_stage)
                stages = math.ceil((n + in_w + out_w) / job.integer(lps_key, 1))
            else:  # 1 stage per rank for single-stage schedules, 2 for looped / V schedules
                stages = pp * (2 if multi else 1)
            counts = stage_layer_counts(n, stages, in_w, out_w)
    except (ValueError, TypeError) as err:
        job.problem(src, str(err), "change the pipeline degree, the layers per stage or the less-layers counts")
        return
    per_rank, rest = divmod(len(counts), pp)
    if rest or per_rank < 1:
        job.problem(src, f"{len(counts)} pipeline stages are not a multiple of pipeline_parallel_degree {pp}",
                    "make the number of stages a multiple of the PP degree")
    elif (per_rank == 1) == multi or (schedule in ("zbv", "dualpipev") and per_rank != 2):
        need = "exactly 2" if schedule in ("zbv", "dualpipev") else ("2 or more" if multi else "exactly 1")
        job.problem(sched_key, f"schedule {name} needs {need} stage(s) per rank, the split gives {per_rank}",
                    "change the schedule or pipeline_parallel_layers_per_stage")
    else:
        raw.set("plan.schedule", schedule, job.origin(sched_key))
        raw.set("plan.stage_layers", tuple(counts), job.origin(src))
        if per_rank > 1:
            raw.set("plan.vpp", per_rank, job.origin(sched_key))
        if schedule == "dualpipev" and raw.get("plan.ep", 1) > 1 and \
                job.flag(f"{p}.pipeline_parallel_expert_parallel_overlap", True):
            raw.set("plan.overlap.ep_comm", True, job.origin(f"{p}.pipeline_parallel_expert_parallel_overlap"))
