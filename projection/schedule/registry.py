"""Build a schedule by its canonical name (the values of `ParallelPlan.schedule`).

Constraints enforced (ValueError with the reason otherwise); pp, n_microbatches and vpp are positive integers:
  gpipe             any vpp (vpp > 1: looped breadth-first, torch `ScheduleLoopedBFS`)
  1f1b              vpp = 1 (use interleaved_1f1b for vpp > 1); style="torch" also needs m >= pp (`Schedule1F1B`)
  interleaved_1f1b  Megatron (default): vpp = 1 runs plain 1F1B; vpp >= 2 needs the group size G
                    (--microbatch-group-size-per-virtual-pipeline-stage, default pp) in [pp, m] and m % G in {0}
                    or >= pp, so by default m is a multiple of pp. torch: m % max(1, m // pp) == 0 (m < pp allowed)
  zb_h1, zb_h2      vpp = 1
  zbv, v_half, v_min  vpp = 2 (exactly two stages per rank, V placement)
  dualpipev         vpp = 2 and m >= 2pp
  dualpipe          vpp = 1 (each rank holds model stages r and pp-1-r), even pp, even m, m >= 2pp
`microbatch_group_size` only affects interleaved_1f1b (other schedules ignore it, so a plan can always pass it).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from projection.schedule.action import Schedule
from projection.schedule.basic import gpipe, one_f_one_b
from projection.schedule.builders import require_positive
from projection.schedule.dualpipe import dualpipe, dualpipev
from projection.schedule.interleaved import interleaved_1f1b
from projection.schedule.vshape import v_half, v_min, zbv
from projection.schedule.zero_bubble import zb_h1, zb_h2

SCHEDULE_NAMES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2", "zbv", "v_half", "v_min",
                                   "dualpipe", "dualpipev")
_ONE_STAGE = {"1f1b": one_f_one_b, "zb_h1": zb_h1, "zb_h2": zb_h2}
_TWO_STAGES = {"zbv": zbv, "v_half": v_half, "v_min": v_min, "dualpipev": dualpipev}
# The schedules torch.distributed.pipelining runs (GPipe, 1F1B, Interleaved1F1B, LoopedBFS as looped gpipe,
# ZBVZeroBubble, DualPipeV): the ones `--schedule all` compares for a torch-style (TorchTitan) plan.
TORCH_SCHEDULES = frozenset({"gpipe", "1f1b", "interleaved_1f1b", "zbv", "dualpipev"})
# schedules whose backward runs as an input-gradient pass I and a weight-gradient pass W (checked against the built
# action lists in tests/unit/test_perf_core.py)
SPLIT_BACKWARD = frozenset({"zb_h1", "zb_h2", "zbv", "v_half", "v_min", "dualpipe", "dualpipev"})


def stages_per_rank_problem(name: str, vpp: int) -> str | None:
    """Why `name` cannot run `vpp` stages per rank (None when it can): the stage-count rule of build_schedule,
    shared with the config validator so --schedule and plan.schedule accept the same plans. gpipe and
    interleaved_1f1b take any vpp (gpipe with vpp > 1 is looped breadth-first)."""
    if name in _ONE_STAGE and vpp != 1:
        hint = "; use interleaved_1f1b for several stages per rank" if name == "1f1b" else ""
        return f"{name} runs one stage per rank: vpp must be 1 (got {vpp}){hint}"
    if name in _TWO_STAGES and vpp != 2:
        return f"{name} is a V-shaped schedule with exactly two stages per rank: vpp must be 2 (got {vpp})"
    if name == "dualpipe" and vpp != 1:
        return (f"dualpipe splits the model into pp stages and places two of them (r and pp-1-r) on each rank by "
                f"itself: vpp must be 1 (got {vpp}); for a V placement of 2*pp stages use dualpipev")
    return None


# Largest pp x vpp x microbatches a schedule is built for: 256 ranks x 4096 microbatches (about 1M) take ~1 GB and
# ~8 s in `projection schedule` on one core, and a whole `projection performance` of 650k forward actions ~22 s; 1M
# keeps a pathological request (a global batch of 100,000 sequences) from running for minutes or exhausting memory,
# and stays far above real jobs (405B at pp 16, vpp 8 and 2,048 microbatches is 262k).
MAX_STAGE_MICROBATCHES = 1_000_000

TOO_MANY_MICROBATCHES_FIX = ("use fewer microbatches per data-parallel rank (a smaller global batch, a larger micro "
                             "batch or more data-parallel ranks): the pipeline's steady state repeats")


class ScheduleTooLarge(ValueError):
    """pp x vpp x microbatches beyond MAX_STAGE_MICROBATCHES: fixed by the batch, not by another schedule."""


@lru_cache(maxsize=256)
def build_schedule(name: str, pp: int, n_microbatches: int, vpp: int = 1, *,
                   microbatch_group_size: int | None = None,
                   style: Literal["megatron", "torch"] = "megatron", combined_1f1b: bool = False) -> Schedule:
    """The per-rank action lists of schedule `name` for pp ranks, n_microbatches and vpp stages per rank.

    `style` picks whose ordering interleaved_1f1b follows (and, for 1f1b, whose constraints apply): "megatron"
    (default; Megatron-LM and Primus) or "torch" (torch.distributed.pipelining). Deterministic and pure, so results
    are cached (planner sweeps rebuild the same pipeline shape many times); the Schedule is immutable.
    `combined_1f1b`: Megatron's interleaved schedule under the expert-parallel overlap (interleaved_1f1b); ignored by
    the others.
    """
    if name not in SCHEDULE_NAMES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    require_positive(pp, n_microbatches, vpp)
    if pp * n_microbatches * vpp > MAX_STAGE_MICROBATCHES:
        raise ScheduleTooLarge(f"pp x vpp x microbatches = {pp} x {vpp} x {n_microbatches} = "
                         f"{pp * vpp * n_microbatches:,} forward actions: more than the {MAX_STAGE_MICROBATCHES:,} "
                         "this simulator builds (each is a few hundred bytes of action lists and timeline)")
    if style not in ("megatron", "torch"):
        raise ValueError(f"unknown style {style!r} (expected 'megatron' or 'torch')")
    if name == "gpipe":
        return gpipe(pp, n_microbatches, vpp)
    if name == "interleaved_1f1b":
        return interleaved_1f1b(pp, n_microbatches, vpp, microbatch_group_size=microbatch_group_size, style=style,
                                combined_1f1b=combined_1f1b and vpp > 1 and style == "megatron")
    problem = stages_per_rank_problem(name, vpp)
    if problem is not None:
        raise ValueError(problem)
    if name in _ONE_STAGE:
        if name == "1f1b" and style == "torch" and n_microbatches < pp:
            raise ValueError(f"1f1b (torch Schedule1F1B) needs n_microbatches >= pp = {pp} (got {n_microbatches})")
        return _ONE_STAGE[name](pp, n_microbatches)
    if name in _TWO_STAGES:
        return _TWO_STAGES[name](pp, n_microbatches)
    return dualpipe(pp, n_microbatches)
