"""`search_layouts`: the parallel layouts of one cluster and global batch, memory first, then time.

For each combination of tp, pp, vpp, cp, ep, micro batch size, recompute granularity and ZeRO stage (the scenario's own
value of any not given; beside pipelines, pp 1 takes vpp 1 only: `_combos`), the layout is built from the scenario's
plan: dp = world / (tp cp pp); a pipeline layout or stage split the file fixed for its own pp is dropped, and a
microbatch group size equal to its own pp (search_reload.dropped_group_size);
recompute is one of RECOMPUTE (`_recompute`: the file's own selective modules or full method at the file's granularity,
else the framework's defaults); the ZeRO stage is the file's sharding at its own stage, else the framework's way to the
stage asked (`_sharding`); the schedule is the file's where it fits, else interleaved_1f1b for vpp > 1 and 1f1b for vpp
1 (a layout neither fits is refused with the schedule's reason). Native, HF and Megatron jobs are built from the
scenario's plan; TorchTitan and Primus jobs, whose rules depend on the layout, from the config loaded again with the
framework's own keys when a `reload` is given (perf/search_reload.py), else TorchTitan jobs and Primus pipeline changes
are refused (_check_supported). The layout is checked with the rules a config file is checked with
(specs.validate.layout_problems), its memory estimated (projection.memory), and only a layout that fits is projected
(perf.project). Candidates come back fastest first, then the out-of-memory ones, then the refused ones with every
reason. Nothing here is new arithmetic: each number is what `projection memory` and `projection performance` print for
that layout loaded with its --set overrides at the same global batch (tests/unit/test_search_layouts.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from projection.cost.model import CostModel
from projection.errors import COMMAND_LINE, ConfigError, Problem, ProjectionError
from projection.memory.report import MemoryReport
from projection.perf.costmodel import check_arguments, default_cost_model
from projection.perf.project import Engine, applicable_schedules, project
from projection.perf.result import Projection
from projection.perf.search_reload import (
    Reload,
    derived_vpp_problem,
    dropped_group_size,
    hierarchy_for,
    layout_overrides,
    needs_reload,
    runs_megatron_fsdp,
)
from projection.specs.plan import ParallelPlan, RecomputeSpec, ShardingSpec
from projection.specs.scenario import CLASH_FIX, RawScenario, Scenario
from projection.specs.training import TrainingSpec
from projection.specs.validate import layout_problems

RECOMPUTE = ("none", "selective", "full")
ZERO = (0, 1, 2, 3)


@dataclass(frozen=True)
class Candidate:
    """One layout: its plan and training, and either its projection (fits), its memory (out of memory) or the
    problems that refuse it. recompute: the granularity searched (RECOMPUTE); zero: the ZeRO stage searched (ZERO)."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    micro_batch_size: int
    recompute: str
    zero: int
    scenario: Scenario | None
    memory: MemoryReport | None = None
    projection: Projection | None = None
    problems: tuple[Problem, ...] = ()

    @property
    def status(self) -> str:
        """"fits", "at risk" (projected, but the reserved peak leaves less than the memory verdict's headroom: the
        memory report's verdict), "out of memory" (not projected) or "refused" (`problems` say why)."""
        if self.problems:
            return "refused"
        if self.projection is None:
            return "out of memory"
        return "at risk" if self.memory is not None and self.memory.verdict == "at risk" else "fits"


def search_layouts(scenario: Scenario, *, tp: Sequence[int] | None = None, pp: Sequence[int] | None = None,
                   vpp: Sequence[int] | None = None, cp: Sequence[int] | None = None, ep: Sequence[int] | None = None,
                   micro_batch_size: Sequence[int] | None = None, recompute: Sequence[str] | None = None,
                   zero: Sequence[int] | None = None, cost_model: CostModel | None = None, engine: Engine = "des",
                   reload: Reload | None = None, progress: Callable[[int, int], None] | None = None
                   ) -> list[Candidate]:
    """Every layout of the given values (the scenario's own for each one not given; a bare value is a list of one)
    on the scenario's cluster and global batch: the projected ones fastest first (status "fits" or "at risk", as
    `projection plan` ranks them), then out-of-memory ones (smallest peak first), then refused ones.
    recompute: granularities of RECOMPUTE; zero: ZeRO stages of ZERO. cost_model: default, each layout's shipped
    calibration (collectives are priced on its own placements). reload: loads the scenario's config again with
    overrides in its own key space, with the arguments the scenario was loaded with (`api.reloader(path, hardware=...,
    nodes=..., overrides=...)`, what `projection plan` does); a candidate it loads on another cluster, device or model,
    or at another sequence length, is refused with ConfigError. TorchTitan and Primus candidates are built with it
    (perf/search_reload.py), and without it TorchTitan jobs and Primus pipeline changes are refused. progress: called
    after each layout with (layouts done, layouts in all), as `projection plan` shows a long search on a terminal."""
    check_arguments("search_layouts", scenario, cost_model)
    tp, pp, vpp, cp, ep, micro_batch_size, recompute, zero = (
        _listed(v) for v in (tp, pp, vpp, cp, ep, micro_batch_size, recompute, zero))
    plan, training = scenario.plan, scenario.training
    axes = {"tp": tp or [plan.tp], "pp": pp or [plan.pp], "vpp": vpp or [plan.vpp_], "cp": cp or [plan.cp],
            "ep": ep or [plan.ep], "micro_batch_size": micro_batch_size or [training.micro_batch_size]}
    bad = [Problem(f"{name} values must be positive whole numbers, got {values!r}", key=name, file="<search>",
                   fix="pass e.g. [1, 2, 4, 8]")
           for name, values in axes.items()
           if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)]
    granularities = list(dict.fromkeys(recompute or [plan.recompute.granularity]))  # each once, in order
    if not all(isinstance(g, str) and g in RECOMPUTE for g in granularities):
        bad.append(Problem(f"recompute values must be among {', '.join(RECOMPUTE)}, got {granularities!r}",
                           key="recompute", file="<search>", fix="pass e.g. ['none', 'selective', 'full']"))
    stages = list(dict.fromkeys(zero or [plan.sharding.zero_stage]))
    if not all(type(z) is int and z in ZERO for z in stages):
        bad.append(Problem(f"zero values must be among {', '.join(map(str, ZERO))}, got {stages!r}", key="zero",
                           file="<search>", fix="pass e.g. [0, 1, 3]"))
    if bad:
        raise ConfigError(bad)
    if reload is None or not needs_reload(scenario):
        _check_supported(scenario, axes)
        reload = None
    given = {"vpp": vpp is not None, "mbs": micro_batch_size is not None, "zero": zero is not None}
    todo = [(combo, g, z) for combo in _combos(axes) for g in granularities for z in stages]
    out = []
    for combo, g, z in todo:
        out.append(_candidate(scenario, *combo, recompute=g, zero=z, cost_model=cost_model, engine=engine,
                              reload=reload, given=given))
        if progress is not None:
            progress(len(out), len(todo))
    projected = sorted((c for c in out if c.projection is not None),
                       key=lambda c: c.projection.step_time_s)  # type: ignore[union-attr]
    oom = sorted((c for c in out if c.status == "out of memory"), key=lambda c: c.memory.peak_bytes)  # type: ignore
    return projected + oom + [c for c in out if c.status == "refused"]


def _listed(values: Any) -> list[Any] | None:
    """An axis' values as a list: None stays None (the scenario's own), a bare value (4, "full") is a list of one."""
    if values is None:
        return None
    return list(values) if isinstance(values, Iterable) and not isinstance(values, str | bytes) else [values]


def _combos(axes: Mapping[str, Sequence[int]]) -> list[tuple[int, ...]]:
    """Every combination of the axes' values (tp, pp, vpp, cp, ep, mbs), except that a searched pp 1 beside pipelines
    takes vpp 1 only: a virtual pipeline needs a pipeline, so `--pp 1,2 --vpp 1,2` means pp 1, pp 2 and pp 2
    interleaved, not refusals of pp 1 with vpp 2 (a search whose every pp is 1 keeps them, saying why)."""
    pipelines = any(p > 1 for p in axes["pp"])
    out = []
    for combo in itertools.product(*axes.values()):
        if pipelines and combo[1] == 1 and combo[2] > 1:
            combo = (*combo[:2], 1, *combo[3:])
        out.append(combo)
    return list(dict.fromkeys(out))


def _candidate(sc: Scenario, tp: int, pp: int, vpp: int, cp: int, ep: int, mbs: int, *, recompute: str, zero: int,
               cost_model: CostModel | None, engine: Engine, reload: Reload | None,
               given: Mapping[str, bool]) -> Candidate:
    def refused(problems: Sequence[Problem]) -> Candidate:
        return Candidate(tp, pp, vpp, cp, ep, mbs, recompute, zero, None, problems=tuple(problems))

    world, base = sc.world_size, sc.plan
    divides = world % (tp * cp * pp) == 0
    if reload is not None:
        spec = _recompute(base.recompute, recompute)
        # a vpp the search sets: asked for, or the vpp 1 of a pp-1 layout beside pipelines (_combos)
        asked_vpp = vpp if given["vpp"] or vpp != base.vpp_ else None
        over = layout_overrides(sc, tp, pp, asked_vpp, cp, ep, mbs if given["mbs"] else None,
                                spec, zero if given["zero"] else None)
        if isinstance(over, list):
            return refused(([] if divides else [_world_problem(world, tp, cp, pp)]) + over)
        try:
            cand = reload(over)
        except ProjectionError as err:  # every reason the loader gives, as `projection memory --set` lists them
            return refused([_searched_clash(p) for p in err.problems])
        if not divides:  # a loader that took it anyway: the world-size rule (specs/validate.py) still holds
            return refused([_world_problem(world, tp, cp, pp)])
        _check_reloaded(sc, cand, tp, pp, cp)  # a reload that loads another job would misprice every layout
        derived = derived_vpp_problem(sc, vpp, cand.plan.vpp_) if given["vpp"] else None
        if derived is not None:
            return refused([derived])
        clash = _held_by_overrides(cand, tp, pp, cp, ep, asked_vpp,
                                   mbs if given["mbs"] else None, spec.granularity, zero if given["zero"] else None)
        if clash:
            return refused(clash)
        # the loader derives the stages per rank (TorchTitan), and the micro batch and the ZeRO stage where they were
        # not searched (TorchTitan: no FSDP on one data-parallel rank)
        return _priced(cand, tp, pp, cand.plan.vpp_, cp, ep, cand.training.micro_batch_size, recompute,
                       cand.plan.sharding.zero_stage, cost_model, engine)
    gbs = sc.training.resolved_global_batch(base.dp_())
    fields = base.model_dump()
    same_pipeline = (pp, vpp) == (base.pp, base.vpp_)
    # where tp cp pp do not divide the world there is no dp: layout_problems says so with every other reason
    fields.update(tp=tp, pp=pp, vpp=vpp if vpp > 1 else None, cp=cp, cp_hierarchy=hierarchy_for(base, cp), ep=ep,
                  dp=world // (tp * cp * pp) if divides else None,
                  recompute=_recompute(base.recompute, recompute).model_dump(),
                  sharding=_sharding(base.sharding, zero, sc.framework).model_dump(),
                  overlap={**base.overlap.model_dump(),
                           **({"param_gather": False} if zero == 0 != base.sharding.zero_stage else {})},
                  **({} if same_pipeline else {"pipeline_layout": None, "first_stage_layers": None,
                                               "last_stage_layers": None, "stage_layers": None}),
                  **({"microbatch_group_size": None} if dropped_group_size(base, pp) else {}))
    try:
        plan = ParallelPlan.model_validate(fields)
        training = TrainingSpec.model_validate({**sc.training.model_dump(), "micro_batch_size": mbs,
                                                "global_batch_size": gbs})
    except ValueError as err:
        return refused([Problem(str(err).splitlines()[0], key="plan", fix="choose another layout")])
    plan = _fitting_schedule(sc, plan, training)
    problems = layout_problems(RawScenario(sc.source, sc.framework), sc.model, training, plan, world)
    if not divides:
        problems.insert(0, _world_problem(world, tp, cp, pp))
    if problems:
        return refused(problems)
    cand = sc.model_copy(update={"plan": plan, "training": training})
    return _priced(cand, tp, pp, vpp, cp, ep, mbs, recompute, zero, cost_model, engine)


def _check_reloaded(sc: Scenario, cand: Scenario, tp: int, pp: int, cp: int) -> None:
    """ConfigError when the reload loaded the candidate on another cluster or device (a reload without the scenario's
    hardware / nodes / gpus_per_node, or one that sized its own cluster from a TOML's fixed degrees), or with another
    model or sequence length (without the scenario's overrides): every difference, and how to reload."""
    pairs = [(f"cluster.{k}", getattr(sc.cluster, k), getattr(cand.cluster, k))
             for k in ("nodes", "gpus_per_node", "inter_node_topology", "oversubscription")]
    pairs.insert(0, ("hardware", sc.cluster.device.name, cand.cluster.device.name))
    if sc.cluster.device.name == cand.cluster.device.name and sc.cluster.device != cand.cluster.device:
        pairs.append(("cluster.device", "the searched device's values", "other values (a --set cluster.device.*)"))
    pairs += [(f"model.{k}", getattr(sc.model, k), getattr(cand.model, k)) for k in type(sc.model).model_fields]
    pairs.append(("training.seq_length", sc.training.seq_length, cand.training.seq_length))
    problems = [Problem(f"reload loaded the layout tp {tp} pp {pp} cp {cp} with {key} {got!r}, where the searched "
                        f"scenario has {want!r}"[:300], key="reload", file="<search_layouts>")
                for key, want, got in pairs if want != got]
    if problems:
        problems[-1] = dataclasses.replace(problems[-1], fix="reload with the arguments the scenario was loaded with: "
                                           "reload=api.reloader(path, hardware=..., nodes=..., gpus_per_node=..., "
                                           "overrides=...), or reload=lambda over: api.load(path, hardware=..., "
                                           "nodes=..., overrides={**your_overrides, **over})")
        raise ConfigError(problems)


def _world_problem(world: int, tp: int, cp: int, pp: int) -> Problem:
    return Problem(f"world size {world} is not divisible by tp * cp * pp = {tp} * {cp} * {pp} = {tp * cp * pp}",
                   key="plan", fix="choose tp, cp and pp whose product divides the GPUs")


def _priced(cand: Scenario, tp: int, pp: int, vpp: int, cp: int, ep: int, mbs: int, recompute: str, zero: int,
            cost_model: CostModel | None, engine: Engine) -> Candidate:
    """The candidate's memory, and its projection where it fits."""
    try:
        from projection.memory.estimate import estimate_memory

        memory = estimate_memory(cand)
        if memory.verdict == "out of memory":
            return Candidate(tp, pp, vpp, cp, ep, mbs, recompute, zero, cand, memory)
        proj = project(cand, cost_model if cost_model is not None else default_cost_model(cand), engine=engine)
    except ProjectionError as err:
        return Candidate(tp, pp, vpp, cp, ep, mbs, recompute, zero, None, problems=tuple(err.problems))
    return Candidate(tp, pp, vpp, cp, ep, mbs, recompute, zero, cand, memory, proj)


def _searched_clash(problem: Problem) -> Problem:
    """A loader's refusal of two --set keys that disagree (RawScenario.set), where one is the search's own key for
    the layout: said as the user's --set key holding a searched axis, which is what it is."""
    if problem.fix != CLASH_FIX:
        return problem
    return Problem(f"a --set override of yours holds an axis this layout sets ({problem.message}; the first is the "
                   "search's)", key=problem.key, file=COMMAND_LINE,
                   fix=f"drop --set {problem.key}, or leave its axis out of the search")


def _held_by_overrides(cand: Scenario, tp: int, pp: int, cp: int, ep: int, vpp: int | None, mbs: int | None,
                       granularity: str, zero: int | None) -> list[Problem]:
    """Why a reloaded candidate is not the layout asked for: a --set key of the user's (a projection key such as
    plan.tp, applied after the framework's own) held an axis the search sets. Rows must never carry a layout they
    do not have."""
    plan = cand.plan
    got = {"tp": plan.tp, "pp": plan.pp, "cp": plan.cp, "ep": plan.ep, "vpp": plan.vpp_,
           "mbs": cand.training.micro_batch_size, "recompute": plan.recompute.granularity,
           "zero": plan.sharding.zero_stage}
    want = {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "mbs": mbs, "recompute": granularity, "zero": zero}
    keys = {"mbs": "training.micro_batch_size", "recompute": "plan.recompute.granularity",
            "zero": "plan.sharding.zero_stage"}
    titan_fsdp = "torchtitan" in cand.framework and zero == 3 and got["zero"] == 0
    return [Problem(f"the loaded layout has {axis} {got[axis]}, not {value}: "
                    + ("TorchTitan applies FSDP only where data_parallel_shard_degree x cp > 1, and this layout "
                       "leaves one rank to shard over" if axis == "zero" and titan_fsdp else
                       "a --set override or a rule of the config holds it"), key=f"--{axis}", file=COMMAND_LINE,
                    fix="search zero 0 for this layout, or a layout with more data-parallel ranks"
                    if axis == "zero" and titan_fsdp else
                    f"drop a --set key that fixes {axis} ({keys.get(axis, f'plan.{axis}')}), or leave {axis} "
                    "out of the search")
            for axis, value in want.items() if value is not None and got[axis] != value]


def _recompute(own: RecomputeSpec, granularity: str) -> RecomputeSpec:
    """The file's recompute at its own granularity; otherwise Megatron's defaults for the granularity asked for:
    selective recomputes core_attn (--recompute-modules default), full recomputes every layer
    (--recompute-method uniform --recompute-num-layers 1, as Megatron's own examples run it)."""
    if granularity == own.granularity:
        return own
    if granularity == "selective":
        return RecomputeSpec(granularity="selective", modules=("core_attn",))
    if granularity == "full":
        return RecomputeSpec(granularity="full", method="uniform", num_layers=1)
    return RecomputeSpec()


def _sharding(own: ShardingSpec, zero: int, framework: str) -> ShardingSpec:
    """The file's sharding at its own stage; otherwise the stage asked, the rest kept: 0 plain data parallelism, 1 the
    distributed optimizer, 2 gradients sharded too (Megatron-FSDP's optim_grads in a Megatron job), 3 FSDP with the
    file's implementation (a Megatron job at stage 2 runs Megatron-FSDP, its only way there), else PyTorch FSDP2
    (Megatron's --use-torch-fsdp2, TorchTitan's only one)."""
    if zero == own.zero_stage:
        return own
    fsdp = ("megatron_fsdp" if runs_megatron_fsdp(own, framework) else "torch_fsdp2") if zero == 3 else "none"
    return own.model_copy(update={"zero_stage": zero, "fsdp": fsdp})


def _check_supported(sc: Scenario, axes: Mapping[str, Sequence[int]]) -> None:
    """ConfigError where the search would not re-derive the framework's own layout rules. TorchTitan derives
    sequence parallelism, async TP, expert TP, the layer split, the pipeline microbatch, resharding and its DDP rule
    from tp, pp and ep; Primus's pipeline patches choose the schedule (and refuse layouts) from pp."""
    fix_titan = ("pass reload=lambda over: api.load(path, ..., overrides=over) (what `projection plan` does), so each "
                 "layout is the file loaded with TorchTitan's own keys")
    if "torchtitan" in sc.framework:
        raise ConfigError(Problem("the layout search does not re-derive TorchTitan's layout rules (sequence and "
                                  "async tensor parallelism, expert TP, the layer split, the pipeline microbatch, "
                                  "resharding and DDP depend on tp, pp and ep)", key="--config", file=sc.source,
                                  fix=fix_titan))
    changed = [k for k, own in (("pp", sc.plan.pp), ("vpp", sc.plan.vpp_)) if list(axes[k]) != [own]]
    if sc.framework.startswith("primus") and changed:
        raise ConfigError(Problem("the layout search keeps a Primus experiment's pipeline: Primus's pipeline patches "
                                  "(zero bubble, primus_pipeline) choose the schedule and refuse layouts from pp",
                                  key=f"--{changed[0]}", file=COMMAND_LINE,
                                  fix="pass reload=lambda over: api.load(path, ..., overrides=over) (what "
                                      "`projection plan` does), so each layout is the experiment loaded with its "
                                      "own keys"))


def _fitting_schedule(sc: Scenario, plan: ParallelPlan, training: TrainingSpec) -> ParallelPlan:
    """The file's schedule when it applies to the new pp, vpp and microbatches, else the interleaved one for
    vpp > 1 and 1F1B for vpp 1 (in the plan's style); else the file's, which layout_problems then refuses."""
    probe = sc.model_copy(update={"plan": plan, "training": training})
    try:
        ok = applicable_schedules(probe)
    except (ProjectionError, ValueError):
        ok = []
    if plan.schedule in ok or plan.runs_as(plan.schedule) in ok:
        return plan
    name = "interleaved_1f1b" if plan.vpp_ > 1 else "1f1b"
    if not ok:  # no schedule builds (the layout fails on other counts): still the one for this vpp, so that the
        # refusal gives the layout's reasons, not a stage count the file's schedule never meant to run
        from projection.schedule.registry import stages_per_rank_problem

        if stages_per_rank_problem(plan.schedule, plan.vpp_) is not None:
            return plan.model_copy(update={"schedule": plan.runs_as(name)})
        return plan
    # no GPipe fallback: Megatron has no such schedule; a layout neither fits is refused with the schedule's reason
    return plan.model_copy(update={"schedule": plan.runs_as(name)}) if name in ok else plan
