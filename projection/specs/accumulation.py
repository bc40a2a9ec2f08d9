"""Gradient accumulation as pipeline schedules: how many schedules run per optimizer step.

TorchTitan with pp > 1 calls `pp_schedule.step()` once per gradient-accumulation step, each over local_batch_size /
pipeline_parallel_microbatch_size microbatches: a step of global batch G on dp ranks of local batch L is G / (L x dp)
rounds of one schedule (perf/rounds.py prices them). Megatron runs every microbatch of the step in one schedule.
"""

from __future__ import annotations

from projection.specs.scenario import Scenario


def rounds(sc: Scenario) -> int:
    """Pipeline schedules per optimizer step (1 unless TorchTitan accumulates gradients under PP)."""
    p, t = sc.plan, sc.training
    if p.schedule_style != "torch" or p.pp == 1 or t.local_batch_size is None:
        return 1
    per_round = t.local_batch_size * p.dp_()
    gbs = t.resolved_global_batch(p.dp_())
    return gbs // per_round if gbs > per_round and gbs % per_round == 0 else 1


def schedule_microbatches(sc: Scenario) -> int:
    """Microbatches in one pipeline schedule of the step."""
    return sc.training.num_microbatches(sc.plan.dp_()) // rounds(sc)


def one_round(sc: Scenario) -> Scenario:
    """The scenario of one accumulation step: its global batch is local batch x dp."""
    t = sc.training
    assert t.local_batch_size is not None
    return sc.model_copy(update={"training": t.model_copy(
        update={"global_batch_size": t.local_batch_size * sc.plan.dp_()})})
