"""Layout rules of a pipeline schedule that its builder and torch's runtime impose, checked at load so that every
command refuses the plan with the others (specs/validate.py layout_problems)."""

from __future__ import annotations

from collections.abc import Callable

from projection.specs.plan import ParallelPlan

Bad = Callable[[str, str, str], None]


def schedule_problems(plan: ParallelPlan, m: int, bad: Bad) -> None:
    """With pp > 1 and m microbatches per data-parallel rank: the builder's own rules for the schedules without a
    rule of their own in layout_problems (1f1b and interleaved_1f1b have theirs), e.g. DualPipeV's m >= 2 pp, so
    that `--schedule all` leaves out a schedule that cannot run; then torch's lock-step runtime (_lockstep_order)
    and Megatron's interleaved schedule at pp 2 without overlapped p2p."""
    from projection.schedule.registry import ScheduleTooLarge, build_schedule, stages_per_rank_problem

    if plan.schedule not in ("1f1b", "interleaved_1f1b") and stages_per_rank_problem(plan.schedule, plan.vpp_) is None:
        try:
            build_schedule(plan.schedule, plan.pp, m, plan.vpp_, microbatch_group_size=plan.microbatch_group_size,
                           style=plan.schedule_style)
        except ScheduleTooLarge:  # the batch's size, reported where the schedule is built
            pass
        except ValueError as e:
            bad("plan.schedule", f"{e} ({m} microbatches per data-parallel rank)",
                "a larger global batch or a smaller microbatch, or a schedule that accepts this many microbatches")
            return
    if plan.megatron_lacks_schedule:
        # Megatron-Core's get_forward_backward_func: forward_backward_pipelining_without_interleaving, or with
        # interleaving under a virtual pipeline; Primus's zero-bubble schedules are its own runtime (its patches)
        bad("plan.schedule", f"Megatron-LM's pipeline runtime (schedules.py) has no {plan.schedule} schedule: it runs "
            "1F1B, and interleaved 1F1B with a virtual pipeline", "use 1f1b or interleaved_1f1b (in a Primus "
            "experiment, --schedule zb_h1, zb_h2, zbv, v_half or v_min turns on Primus's zero-bubble runtime)")
    if plan.lockstep_pipeline:
        _lockstep_order(plan, m, bad)
    if plan.megatron_pipeline and plan.pp == 2 and plan.vpp_ > 1 and not plan.megatron_p2p_overlap:
        # Megatron-LM validate_args: with a virtual pipeline and not args.overlap_p2p_comm, `assert
        # args.pipeline_model_parallel_size > 2`; Megatron-Core itself (Bridge) does not check, and its batch of
        # sends and receives to the one neighbour would pair them crosswise (p2p_communication._batched_p2p_ops)
        bad("plan.overlap.p2p_comm", "Megatron's interleaved schedule at pipeline size 2 needs overlapped p2p: both "
            "neighbours are one rank, and each blocking batch would pair its sends and receives to it crosswise "
            "(Megatron-LM refuses it: 'pipeline-model-parallel size should be greater than 2')",
            "turn on overlapped p2p communication, or use a pipeline size above 2 or no virtual pipeline")


def _lockstep_order(plan: ParallelPlan, m: int, bad: Bad) -> None:
    """A multi-stage schedule on torch up to 2.9 (ParallelPlan.lockstep_pipeline): torch's own time steps must
    receive every input before the pass that reads it (sim/lockstep.received_too_late); interleaved 1F1B with
    vpp >= 2 and fewer microbatches than pp (and some other counts that are not a multiple of pp), or looped
    breadth-first with fewer microbatches than pp, do not, and that runtime computes on the unfilled receive
    buffer."""
    from projection.schedule.registry import build_schedule
    from projection.schedule.timesteps import lockstep_steps
    from projection.sim.lockstep import received_too_late

    try:
        sched = build_schedule(plan.schedule, plan.pp, m, plan.vpp_, style="torch")
        steps = lockstep_steps(plan.schedule, plan.pp, m, plan.vpp_)
    except ValueError:  # a microbatch count or stage count the schedule refuses: reported by its own rules
        return
    early = received_too_late(sched, steps) if steps is not None else None
    if early is not None:
        bad("plan.pipeline_runtime", f"{plan.schedule} as torch up to 2.9 runs it (lock-step time steps) with pp "
            f"{plan.pp}, vpp {plan.vpp_} and {m} microbatches per data-parallel rank: {early}, so the pass reads a "
            "buffer not yet received", f"use a multiple of pp = {plan.pp} microbatches (TorchTitan's default: one "
            "per stage), or torch 2.10+ (--pytorch)")
