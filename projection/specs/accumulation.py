"""Gradient accumulation as pipeline schedules: how many schedules run per optimizer step.

TorchTitan with pp > 1 calls `pp_schedule.step()` once per gradient-accumulation step, each over local_batch_size /
pipeline_parallel_microbatch_size microbatches: a step of global batch G on dp ranks of local batch L is G / (L x dp)
rounds of one schedule (perf/rounds.py prices them). Megatron runs every microbatch of the step in one schedule.
"""

from __future__ import annotations

from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec


def rounds_of(training: TrainingSpec, plan: ParallelPlan) -> int:
    """Pipeline schedules per optimizer step (1 unless TorchTitan accumulates gradients under PP; a global batch that
    is no multiple of local batch x dp is refused by specs/validate, as TorchTitan's train.py asserts)."""
    if plan.schedule_style != "torch" or plan.pp == 1 or training.local_batch_size is None:
        return 1
    per_round = training.local_batch_size * plan.dp_()
    gbs = training.resolved_global_batch(plan.dp_())
    return gbs // per_round if gbs > per_round and gbs % per_round == 0 else 1


def microbatches_per_schedule(training: TrainingSpec, plan: ParallelPlan) -> int:
    """Microbatches in one pipeline schedule of the step."""
    return training.num_microbatches(plan.dp_()) // rounds_of(training, plan)


def rounds(sc: Scenario) -> int:
    return rounds_of(sc.training, sc.plan)


def schedule_microbatches(sc: Scenario) -> int:
    return microbatches_per_schedule(sc.training, sc.plan)


def one_round(sc: Scenario) -> Scenario:
    """The scenario of one accumulation step: its global batch is local batch x dp."""
    t = sc.training
    assert t.local_batch_size is not None
    return sc.model_copy(update={"training": t.model_copy(
        update={"global_batch_size": t.local_batch_size * sc.plan.dp_()})})
