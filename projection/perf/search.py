"""`search_layouts`: the parallel layouts of one cluster and global batch, memory first, then time.

For each combination of tp, pp, vpp, cp, ep and micro batch size (the scenario's own value of any not given), the
layout is built from the scenario's plan: dp = world / (tp cp pp); a pipeline layout, stage split or group size the
file fixed for its own pp is dropped; for another pp, TorchTitan's own layer split (default less-layers counts), its
pipeline microbatch of 1 and its "default" resharding (not under PP) are taken; the schedule is the file's where it
fits, else interleaved_1f1b for vpp > 1 and 1f1b for vpp 1 (or their torch equivalents), else gpipe. The layout is
checked with the rules a config file is checked with (specs.validate.layout_problems, TorchTitan's FSDP rules), its
memory estimated (projection.memory), and only a layout that fits is projected (perf.project). Candidates come back
fastest first, then the out-of-memory ones, then the refused ones with every reason. Nothing here is new arithmetic:
each number is what `projection memory` and `projection performance` print for that layout loaded with its --set
overrides at the same global batch (tests/unit/test_search_layouts.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from projection.cost.model import CostModel
from projection.errors import ConfigError, Problem, ProjectionError
from projection.memory.report import MemoryReport
from projection.perf.costmodel import default_cost_model
from projection.perf.project import Engine, applicable_schedules, project
from projection.perf.result import Projection
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import RawScenario, Scenario
from projection.specs.training import TrainingSpec
from projection.specs.validate import layout_problems, torchtitan_ddp_problem, torchtitan_without_fsdp


@dataclass(frozen=True)
class Candidate:
    """One layout: its plan and training, and either its projection (fits), its memory (out of memory) or the
    problems that refuse it."""

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    micro_batch_size: int
    scenario: Scenario | None
    memory: MemoryReport | None = None
    projection: Projection | None = None
    problems: tuple[Problem, ...] = ()

    @property
    def status(self) -> str:
        if self.problems:
            return "refused"
        return "fits" if self.projection is not None else "out of memory"


def search_layouts(scenario: Scenario, *, tp: Sequence[int] | None = None, pp: Sequence[int] | None = None,
                   vpp: Sequence[int] | None = None, cp: Sequence[int] | None = None, ep: Sequence[int] | None = None,
                   micro_batch_size: Sequence[int] | None = None, cost_model: CostModel | None = None,
                   engine: Engine = "des") -> list[Candidate]:
    """Every layout of the given values (the scenario's own for each one not given) on the scenario's cluster and
    global batch: fitting ones fastest first, then out-of-memory ones (smallest peak first), then refused ones.
    cost_model: default, each layout's shipped calibration (collectives are priced on its own placements)."""
    plan, training = scenario.plan, scenario.training
    axes = {"tp": tp or [plan.tp], "pp": pp or [plan.pp], "vpp": vpp or [plan.vpp_], "cp": cp or [plan.cp],
            "ep": ep or [plan.ep], "micro_batch_size": micro_batch_size or [training.micro_batch_size]}
    bad = [Problem(f"{name} values must be positive whole numbers, got {values!r}", key=name, file="<search>",
                   fix="pass e.g. [1, 2, 4, 8]")
           for name, values in axes.items()
           if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)]
    if bad:
        raise ConfigError(bad)
    out = [_candidate(scenario, *combo, cost_model=cost_model, engine=engine, mbs_given=micro_batch_size is not None)
           for combo in itertools.product(*axes.values())]
    fits = sorted((c for c in out if c.status == "fits"), key=lambda c: c.projection.step_time_s)  # type: ignore
    oom = sorted((c for c in out if c.status == "out of memory"), key=lambda c: c.memory.peak_bytes)  # type: ignore
    return fits + oom + [c for c in out if c.status == "refused"]


def _candidate(sc: Scenario, tp: int, pp: int, vpp: int, cp: int, ep: int, mbs: int, *,
               cost_model: CostModel | None, engine: Engine, mbs_given: bool = True) -> Candidate:
    def refused(problems: Sequence[Problem]) -> Candidate:
        return Candidate(tp, pp, vpp, cp, ep, mbs, None, problems=tuple(problems))

    world, base = sc.world_size, sc.plan
    if world % (tp * cp * pp):
        return refused([Problem(f"world size {world} is not a multiple of tp * cp * pp = {tp * cp * pp}",
                                key="plan", fix="choose tp, cp and pp whose product divides the GPUs")])
    gbs = sc.training.resolved_global_batch(base.dp_())
    fields = base.model_dump()
    same_pipeline = (pp, vpp) == (base.pp, base.vpp_)
    fields.update(tp=tp, pp=pp, vpp=vpp if vpp > 1 else None, cp=cp, ep=ep, dp=world // (tp * cp * pp),
                  **({} if same_pipeline else {"pipeline_layout": None, "first_stage_layers": None,
                                               "last_stage_layers": None, "stage_layers": None,
                                               "microbatch_group_size": None}))
    titan = "torchtitan" in sc.framework
    if titan and not same_pipeline and pp > 1:  # TorchTitan splits the layers itself (generate_llm_fqn_per_model_part)
        from projection.formats.torchtitan import stage_layer_counts

        try:
            fields["stage_layers"] = tuple(stage_layer_counts(sc.model.num_layers, pp * vpp))
        except ValueError as err:
            return refused([Problem(str(err), key="plan.pp", fix="choose another pp or vpp")])
    if base.sharding.reshard_policy == "default":
        # TorchTitan's fsdp_reshard_after_forward "default": reshard unless PP is on (parallelize: not pp_enabled)
        fields["sharding"] = {**fields["sharding"], "reshard_after_forward": pp == 1}
    if titan and not mbs_given and (pp > 1) != (base.pp > 1):
        # TorchTitan's pipeline microbatch is pipeline_parallel_microbatch_size (default 1); without a pipeline
        # the whole local batch runs at once
        mbs = 1 if pp > 1 else (sc.training.local_batch_size or mbs)
    try:
        plan = ParallelPlan.model_validate(fields)
        training = TrainingSpec.model_validate({**sc.training.model_dump(), "micro_batch_size": mbs,
                                                "global_batch_size": gbs})
    except ValueError as err:
        return refused([Problem(str(err).splitlines()[0], key="plan", fix="choose another layout")])
    plan = _fitting_schedule(sc, plan, training)
    runs, training = torchtitan_without_fsdp(sc.framework, plan, training)
    problems = layout_problems(RawScenario(sc.source, sc.framework), sc.model, training, runs, world)
    ddp = torchtitan_ddp_problem(sc.framework, plan, runs)
    if problems or ddp is not None:
        return refused([*problems, *([ddp] if ddp is not None else [])])
    cand = sc.model_copy(update={"plan": runs, "training": training})
    try:
        from projection.memory.estimate import estimate_memory

        memory = estimate_memory(cand)
        if memory.verdict == "out of memory":
            return Candidate(tp, pp, vpp, cp, ep, mbs, cand, memory)
        proj = project(cand, cost_model if cost_model is not None else default_cost_model(cand), engine=engine)
    except ProjectionError as err:
        return refused(err.problems)
    return Candidate(tp, pp, vpp, cp, ep, mbs, cand, memory, proj)


def _fitting_schedule(sc: Scenario, plan: ParallelPlan, training: TrainingSpec) -> ParallelPlan:
    """The file's schedule when it applies to the new pp, vpp and microbatches, else the interleaved one for
    vpp > 1 and 1F1B for vpp 1 (in the plan's style), else gpipe; layout_problems still has the last word."""
    probe = sc.model_copy(update={"plan": plan, "training": training})
    try:
        ok = applicable_schedules(probe)
    except (ProjectionError, ValueError):
        ok = []
    if plan.schedule in ok or plan.runs_as(plan.schedule) in ok:
        return plan
    for name in (("interleaved_1f1b",) if plan.vpp_ > 1 else ("1f1b",)) + ("gpipe",):
        if name in ok:
            return plan.model_copy(update={"schedule": plan.runs_as(name)})
    return plan
