"""TorchTitan's gradient accumulation under pipeline parallelism: one pipeline schedule per accumulation step.

With pp > 1 TorchTitan's `train_step` calls `pp_schedule.step()` once per gradient-accumulation step, each over
local_batch_size / pipeline_parallel_microbatch_size microbatches, with its own fill and drain, and (FSDP2 inside
the stages, ParallelPlan.pipelined_fsdp) its own final reduce-scatter and re-gather; the optimizer steps once. So
a step of global batch G on dp ranks of local batch L is G / (L x dp) back-to-back rounds of one schedule, not one
schedule of G / (mbs x dp) microbatches. specs/accumulation.rounds says how many; `repeat` turns the projection of
one round into the step's: every breakdown term and collective total times the rounds except the optimizer step,
which runs once (and the wait for the slowest rank's optimizer, in the bubble, once too); the timeline,
`bubble_ratio`, `bubble_s_per_rank` and `param_gather_exposed_s` stay one schedule's (`rounds` says how many run;
the Chrome trace draws them all, report/trace.py).
"""

from __future__ import annotations

from dataclasses import replace

from projection.perf.result import Projection
from projection.specs.scenario import Scenario


def repeat(proj: Projection, sc: Scenario, n: int) -> Projection:
    """The step of `n` rounds of `proj` (one round of `sc`) with one optimizer step. Every round but the last ends
    when the slowest rank's exposed parameter all-gather does (the next round's pipeline needs every rank); the last
    adds the slowest rank's optimizer step: step = (n - 1) (pipeline + max_r gather_r) + (pipeline + max_r
    (optimizer_r + gather_r)). The breakdown rank's bubble therefore waits for the slowest optimizer once, not in every
    round."""
    opt = proj.breakdown_s.get("optimizer", 0.0)
    b = proj.breakdown_rank
    gather, optim = proj.param_gather_exposed_s, proj.optimizer_s

    def at(values: tuple[float, ...], r: int) -> float:
        return values[r] if r < len(values) else 0.0

    ranks = range(max(len(gather), len(optim), b + 1))
    wait_last = max((at(optim, r) + at(gather, r) for r in ranks), default=0.0) - at(optim, b) - at(gather, b)
    wait_round = max((at(gather, r) for r in ranks), default=0.0) - at(gather, b)
    breakdown = {k: (v if k == "optimizer" else n * v) for k, v in proj.breakdown_s.items()}
    breakdown["bubble"] = breakdown.get("bubble", 0.0) - (n - 1) * (wait_last - wait_round)
    step = sum(breakdown.values())
    world = proj.world_size
    mflops, hflops = n * proj.model_flops_per_step, n * proj.hardware_flops_per_step
    tokens = sc.training.resolved_global_batch(sc.plan.dp_()) * sc.training.seq_length
    peak = proj.peak_flop_per_s
    one_round = proj.step_time_s - opt - wait_last + wait_round  # a round without the optimizer's wait
    assert step > 0 and abs(step - ((n - 1) * one_round + proj.step_time_s)) <= 1e-9 * max(step, 1.0)
    return replace(
        proj, scenario=sc, step_time_s=step, tokens_per_s_per_gpu=tokens / step / world,
        model_flops_per_step=mflops, model_tflops_per_gpu=mflops / step / world / 1e12,
        mfu=mflops / (step * world * peak),
        hardware_flops_per_step=hflops, hardware_tflops_per_gpu=hflops / step / world / 1e12,
        hfu=hflops / (step * world * peak), n_microbatches=n * proj.n_microbatches, breakdown_s=breakdown,
        comm_total_s={k: n * v for k, v in proj.comm_total_s.items()}, rounds=n,
        notes=(*proj.notes, f"TorchTitan accumulates gradients over {n} pipeline schedules of {proj.n_microbatches} "
               f"microbatches each (pp_schedule.step() per accumulation step, each with its own fill, drain and "
               f"gradient reduction); the timeline shows one of them, the trace all {n}"))
