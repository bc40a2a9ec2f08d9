"""The layout search's candidates for frameworks whose own rules follow the layout: each candidate is the config
loaded again with the framework's own keys for that layout (`Reload`), so its loader re-derives every rule.

TorchTitan derives sequence parallelism, the DTensor TP style, async TP, expert TP, FSDP and its resharding, the
pipeline stages, their layer split and the pipeline microbatch from its `[parallelism]` and `[training]` keys
(formats/torchtitan.py); Primus's pipeline patches pick the schedule and refuse layouts from the pipeline size
(formats/megatron.py `_zero_bubble_rules`). Re-deriving those rules beside the loaders would be a second, drifting
copy; loading the same file with `--set` is what a user would run, and what `tests/unit/test_search_layouts.py`
compares against.

Keys per candidate (`layout_overrides`), each only where the value differs from the config's own:
- TorchTitan: `parallelism.tensor_parallel_degree`, `.pipeline_parallel_degree`, `.context_parallel_degree`,
  `.expert_parallel_degree` (MoE models); the micro batch is `parallelism.pipeline_parallel_microbatch_size` with a
  pipeline and `training.local_batch_size` without one (TorchTitan's meaning of each); `training.global_batch_size`
  holds the config's global batch; with a pipeline on another pp or data-parallel size than the file's,
  `training.local_batch_size` is the global batch over dp (no gradient accumulation: the file's local batch was
  chosen for its own dp); `activation_checkpoint.mode` the recompute granularity (selective keeps the file's
  `selective_ac_option`, TorchTitan's default every 2nd layer); ZeRO stage 3 as FSDP over every data-parallel rank
  (`data_parallel_shard_degree` -1, `data_parallel_replicate_degree` 1), 0 as DDP (replicate dp, shard 1), 1 and 2
  refused (TorchTitan has neither). Otherwise a file that fixes `data_parallel_shard_degree` keeps
  it (a layout it no longer fills is refused by the loader, saying so); the stages per rank follow the schedule and
  `pipeline_parallel_layers_per_stage`, so an asked vpp stands only where it is what TorchTitan derives.
- Megatron-Bridge: the same Megatron keys written as the Bridge fields that set them (formats/bridge_fields.py
  `bridge_keys`: `model.tensor_model_parallel_size`, `train.micro_batch_size`, the distributed optimizer on both
  `ddp` and `optimizer`, ...), so Bridge's start-up rules (comm_overlap's TP overlap only at tp >= 2 with sequence
  parallelism, the p2p overlap with a virtual pipeline) see each candidate; sequence parallelism follows tp where
  the file has it on.
- Primus (Megatron argument names): `tensor_model_parallel_size`, `pipeline_model_parallel_size`,
  `context_parallel_size`, `expert_model_parallel_size`, `micro_batch_size`, `global_batch_size`; for another
  pipeline, `num_virtual_stages_per_pipeline_rank` (the other two vpp spellings and the first/last-stage layer counts
  cleared, as the native search drops a split fixed for another pp; the microbatch group size where it is the file's
  own pp, `dropped_group_size`); recompute
  as `recompute_granularity`, `recompute_method`, `recompute_num_layers`, with `recompute_activations` and
  `moe_layer_recompute` off (Megatron's defaults where the file has none: perf/search.py `_recompute`); the ZeRO stage
  as `use_distributed_optimizer` (1), Megatron-FSDP's `optim_grads` (2), the experiment's FSDP (3: Megatron-FSDP's
  `optim_grads_params` where it runs Megatron-FSDP, else `use_torch_fsdp2`) or none of them (0, with
  `overlap_param_gather` off).

A user's `--set` of a projection key (`plan.tp=2`) is applied after the framework's keys and would hold an axis the
search sets: such a candidate is refused (perf/search.py `_held_by_overrides`), never shown under a layout it does
not have.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from projection.errors import COMMAND_LINE, ConfigError, Problem, ProjectionError
from projection.formats.bridge_fields import bridge_keys
from projection.specs.plan import ParallelPlan, RecomputeSpec, ShardingSpec
from projection.specs.scenario import Scenario

Reload = Callable[[Mapping[str, Any]], Scenario]

# Primus's (Megatron's) keys of the searched layout axes (layout_overrides), by axis
FRAMEWORK_AXIS_KEYS = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
                       "context_parallel_size": "cp", "expert_model_parallel_size": "ep", "micro_batch_size": "mbs",
                       "num_virtual_stages_per_pipeline_rank": "vpp"}


class _Own(NamedTuple):
    """The scenario's own layout that layout_overrides writes keys against (all None: write every key)."""

    tp: int | None
    pp: int | None
    cp: int | None
    ep: int | None
    vpp: int | None
    dp: int | None
    mbs: int | None


def own_schedule_names(sc: Scenario) -> tuple[str, ...] | None:
    """The schedules of a pipeline whose framework picks its schedule by its own keys, each to be loaded again as
    `api.load(..., schedule=NAME)` loads it (compare_schedules, `projection performance --schedule all`): TorchTitan
    derives the stages per rank from its pipeline_parallel_schedule, Primus runs a schedule through its pipeline
    patches (and refuses some for the layout). None for another job, or without a pipeline."""
    if sc.plan.pp == 1:
        return None
    if "torchtitan" in sc.framework:
        from projection.formats.torchtitan_schema import TORCHTITAN_SCHEDULE_NAMES

        return tuple(TORCHTITAN_SCHEDULE_NAMES)
    if sc.framework == "primus-megatron":
        from projection.formats.primus_set import PRIMUS_SCHEDULES

        return tuple(n for n in PRIMUS_SCHEDULES if n != "interleaved_1f1b" or sc.plan.vpp_ > 1)
    return None


def framework_schedule_runs(sc: Scenario, reload: Callable[[str], Scenario] | None) -> list[Scenario] | None:
    """compare_schedules' jobs of a framework-scheduled pipeline (own_schedule_names): the job loaded again under
    each schedule by `reload(name)`, leaving out those the framework refuses for it; None for another job."""
    names = own_schedule_names(sc)
    if names is None:
        return None
    if not callable(reload):
        raise ConfigError(Problem(
            f"a {sc.framework} pipeline loads each schedule with its framework's own rules (stages per rank, pipeline "
            "patches), which compare_schedules cannot change on a loaded scenario", key="reload",
            file="<compare_schedules>", fix="pass reload=api.reloader(path, <the arguments the scenario was loaded "
            "with>).schedule, or reload=lambda name: api.load(path, ..., schedule=name)"))
    runs = []
    for name in names:
        try:
            runs.append(reload(name))
        except ProjectionError:
            continue  # a schedule the framework refuses for this job: not compared (as --schedule all)
    return runs


def schedule_problem(sc: Scenario, schedule: str) -> Problem | None:
    """Why project(sc, schedule=NAME) would price another schedule than the one named: a framework-scheduled pipeline
    (own_schedule_names) loaded for another schedule, or a schedule the plan cannot run; None when it can."""
    from projection.perf.project import applicable_schedules
    from projection.schedule.registry import SCHEDULE_NAMES
    from projection.specs.accumulation import schedule_microbatches

    p = sc.plan
    if schedule not in SCHEDULE_NAMES or p.pp == 1 or p.runs_as(schedule) == p.schedule:
        return None  # an unknown name: with_schedule says so; without a pipeline there is no schedule to run
    if own_schedule_names(sc) is not None:
        titan = "torchtitan" in sc.framework
        return Problem(f"schedule={schedule!r}: {'TorchTitan' if titan else 'Primus'} loads each pipeline schedule "
                       "its own way (" + ("the stages per rank follow pipeline_parallel_schedule" if titan else
                                          "its pipeline patches pick and refuse schedules") + "), so this job, "
                       f"loaded for {p.schedule}, would be priced with {p.schedule}'s layout under {schedule}'s name",
                       key="schedule", file="<project>", fix=f"load it with api.load(path, ..., schedule={schedule!r}) "
                       "and project that, or compare_schedules(scenario, reload=api.reloader(path, ...).schedule)")
    ok = applicable_schedules(sc)
    if schedule in ok:
        return None
    return Problem(f"schedule={schedule!r} does not run on pp {p.pp}, vpp {p.vpp_} and {schedule_microbatches(sc)} "
                   "microbatches" + (" (interleaved 1F1B needs vpp > 1)" if schedule == "interleaved_1f1b" else ""),
                   key="schedule", file="<project>", fix=f"use one of {', '.join(ok)}, or load the job with another "
                   "layout (api.load(..., overrides=...))")


def needs_reload(sc: Scenario) -> bool:
    """Whether the search builds this framework's candidates by loading the config again (module docstring)."""
    return "torchtitan" in sc.framework or sc.framework.startswith("primus") or sc.framework == "megatron-bridge"


def layout_overrides(sc: Scenario, tp: int, pp: int, vpp: int | None, cp: int, ep: int, mbs: int | None,
                     recompute: RecomputeSpec, zero: int | None = None,
                     every: bool = False) -> dict[str, Any] | list[Problem]:
    """The framework's own keys that turn the config into this layout (module docstring), or why it cannot.
    vpp / mbs / zero None: not searched (the config's own; for TorchTitan, what it derives for the layout).
    every: the layout keys even where the value is the scenario's own (the search's starting layout, when `sc` was
    loaded with projection's keys, whose framework rules saw the file's values: `starting_keys`)."""
    base, gbs = sc.plan, sc.training.resolved_global_batch(sc.plan.dp_())
    # every: compare against nothing, so each layout key is written (None never equals a size)
    own = _Own(None, None, None, None, None, None, None) if every else \
        _Own(base.tp, base.pp, base.cp, base.ep, base.vpp_, base.dp_(), sc.training.micro_batch_size)
    if zero == base.sharding.zero_stage:
        zero = None
    if "torchtitan" in sc.framework:
        if zero in (1, 2):
            return [Problem(f"ZeRO stage {zero}: TorchTitan shards with FSDP2 (stage 3) or replicates (DDP, stage 0)",
                            key="--zero", file=COMMAND_LINE, fix="search --zero 0,3 on a TorchTitan job")]
        # a shard degree the file fixes stays (and the loader refuses a layout it no longer fills): TorchTitan's
        # batch rule is then checked against that data-parallel size, so size the local batch by it too
        fixed = zero is None and "data_parallel_shard_degree" in sc.origins.get("plan.dp", "")
        titan = _torchtitan(sc, tp, pp, vpp, cp, ep, mbs, recompute, gbs, own, base.dp_() if fixed else None)
        if isinstance(titan, dict) and zero is not None:
            dp = sc.world_size // (tp * pp * cp)
            p = "parallelism"
            titan.update({f"{p}.data_parallel_shard_degree": -1, f"{p}.data_parallel_replicate_degree": 1}
                         if zero == 3 else
                         {f"{p}.data_parallel_shard_degree": 1, f"{p}.data_parallel_replicate_degree": max(dp, 1)})
        return titan
    out: dict[str, Any] = {"global_batch_size": gbs}
    if zero is not None:
        out.update(_primus_sharding(base.sharding, zero, sc.framework))
    for key, value, mine in (("tensor_model_parallel_size", tp, own.tp), ("pipeline_model_parallel_size", pp, own.pp),
                             ("context_parallel_size", cp, own.cp), ("expert_model_parallel_size", ep, own.ep),
                             ("micro_batch_size", mbs, own.mbs)):
        if value is not None and value != mine:
            out[key] = value
    levels = hierarchy_for(base, cp)
    if levels is not None and cp != own.cp:
        out["hierarchical_context_parallel_sizes"] = list(levels)
    vpp = base.vpp_ if vpp is None else vpp
    if (pp, vpp) != (own.pp, own.vpp):
        out.update(num_virtual_stages_per_pipeline_rank=vpp if vpp > 1 else None,
                   num_layers_per_virtual_pipeline_stage=None, pipeline_model_parallel_layout=None,
                   decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None)
    if dropped_group_size(base, pp):
        out["microbatch_group_size_per_vp_stage"] = None
    if recompute != base.recompute:
        # --moe-layer-recompute would turn a cleared granularity back into selective 'moe' (formats/megatron.py)
        out.update(recompute_activations=False, moe_layer_recompute=False,
                   recompute_granularity=None if recompute.granularity == "none"
                   else recompute.granularity, recompute_method=recompute.method,
                   recompute_num_layers=recompute.num_layers)
        if recompute.granularity == "selective":
            out["recompute_modules"] = list(recompute.modules)
    if sc.framework == "megatron-bridge":
        if tp != own.tp and base.sp:  # Megatron-Core refuses sequence parallelism at tp 1; Bridge's scripts: tp > 1
            out["sequence_parallel"] = tp > 1
        return bridge_keys(out)
    return out


def hierarchy_for(base: ParallelPlan, cp: int) -> tuple[int, ...] | None:
    """A hierarchical cp split (a2a+p2p) for another cp: the same all-to-all group, the ring over the rest; the
    config's own split where the group does not divide cp (the layout rules then refuse it, saying why)."""
    if base.cp_levels is None or cp == base.cp or cp % base.cp_levels[0]:
        return base.cp_hierarchy
    return base.cp_levels[0], cp // base.cp_levels[0]


def dropped_group_size(base: ParallelPlan, pp: int) -> bool:
    """Whether a layout on pipeline size `pp` drops the config's microbatch group size: where it equals the config's
    own pp, the value Megatron-Core sets when none is given (ModelParallelConfig: None -> pp), which a logged config
    (a Bridge run_config.yaml, a logged argument dump) holds; another group size is the user's and is kept (the
    interleaved schedule's rule then checks it)."""
    return pp != base.pp and base.microbatch_group_size is not None and base.microbatch_group_size == base.pp


def runs_megatron_fsdp(own: ShardingSpec, framework: str) -> bool:
    """Whether a job's FSDP is Megatron-FSDP: the file runs it at stage 3, or a Megatron job sits at stage 2, which
    only Megatron-FSDP (`optim_grads`) reaches."""
    return own.fsdp == "megatron_fsdp" or (own.zero_stage == 2 and "megatron" in framework)


def _primus_sharding(own: ShardingSpec, zero: int, framework: str) -> dict[str, Any]:
    """Primus's (Megatron's) keys for ZeRO stage `zero`: the distributed optimizer for 1, Megatron-FSDP's optim_grads
    for 2, for 3 the experiment's FSDP (Megatron-FSDP's optim_grads_params where it runs Megatron-FSDP, else
    use_torch_fsdp2), none for 0 (with the parameter-gather overlap off, which Megatron refuses without them)."""
    megatron_fsdp = zero == 2 or (zero == 3 and runs_megatron_fsdp(own, framework))
    # Megatron-FSDP runs with the distributed optimizer and its own checkpoint format (NVIDIA's Megatron-FSDP guide;
    # Megatron Bridge: "checkpoint format fsdp_dtensor"), so the row is a job Megatron starts
    out: dict[str, Any] = {"use_distributed_optimizer": zero == 1 or megatron_fsdp,
                           "use_torch_fsdp2": zero == 3 and not megatron_fsdp, "use_megatron_fsdp": megatron_fsdp}
    if megatron_fsdp:
        out["data_parallel_sharding_strategy"] = "optim_grads" if zero == 2 else "optim_grads_params"
        out["ckpt_format"] = "fsdp_dtensor"
    if zero == 0:
        out["overlap_param_gather"] = False
    return out


def derived_vpp_problem(sc: Scenario, asked: int, derived: int) -> Problem | None:
    """A TorchTitan layout whose stages per rank, as TorchTitan derives them for its pp, are not the vpp asked."""
    if "torchtitan" not in sc.framework or asked == derived:
        return None
    return Problem(f"TorchTitan derives {derived} stage(s) per rank for this layout (from the schedule and "
                   f"pipeline_parallel_layers_per_stage), not vpp {asked}", key="--vpp", file=COMMAND_LINE,
                   fix="leave --vpp out for TorchTitan jobs, or set parallelism.pipeline_parallel_layers_per_stage "
                       "with --set")


def _torchtitan(sc: Scenario, tp: int, pp: int, vpp: int | None, cp: int, ep: int, mbs: int | None,
                recompute: RecomputeSpec, gbs: int, own: _Own, fixed_dp: int | None = None
                ) -> dict[str, Any] | list[Problem]:
    base, p = sc.plan, "parallelism"
    if ep != base.ep and not sc.model.moe:
        return [Problem(f"ep {ep} on a dense model: it has no experts", key="--ep", file=COMMAND_LINE,
                        fix="search ep on a MoE model only")]
    out: dict[str, Any] = {"training.global_batch_size": gbs}
    for key, value, mine in (("tensor_parallel_degree", tp, own.tp), ("pipeline_parallel_degree", pp, own.pp),
                             ("context_parallel_degree", cp, own.cp), ("expert_parallel_degree", ep, own.ep)):
        if value != mine:
            out[f"{p}.{key}"] = value
    if mbs is not None:  # TorchTitan's micro batch: the pipeline microbatch with a pipeline, else the local batch
        out[f"{p}.pipeline_parallel_microbatch_size" if pp > 1 else "training.local_batch_size"] = mbs
    # dp 0 where tp pp cp do not divide the world: the loader then refuses the layout with every reason
    dp = sc.world_size // (tp * pp * cp) if sc.world_size % (tp * pp * cp) == 0 else 0
    dp = fixed_dp if fixed_dp is not None and dp > 0 else dp  # the file's shard degree holds (layout_overrides)
    local = sc.training.local_batch_size or sc.training.micro_batch_size
    if pp == 1 and mbs is None and dp > 0 and gbs % (local * dp):
        # without a pipeline the local batch is the micro batch: the search keeps the file's, so say which to search
        return [Problem(f"the file's local batch {local} x dp {dp} does not divide the global batch {gbs} (TorchTitan "
                        "asserts it)", key="--mbs", file=COMMAND_LINE,
                        fix=f"search --mbs with a divisor of {gbs // dp}" if gbs >= dp else
                        f"fewer data-parallel ranks: the global batch {gbs} is below dp {dp}")]
    if pp > 1 and (own.pp in (1, None) or dp != own.dp) and dp > 0 and gbs % dp == 0:
        # another pipeline or data-parallel size: each DP rank's local batch is its share of the global batch, split
        # into pipeline microbatches (no gradient accumulation; the file's local batch was chosen for its own dp)
        out["training.local_batch_size"] = gbs // dp
    if recompute.granularity != base.recompute.granularity:
        out["activation_checkpoint.mode"] = recompute.granularity
    return out
