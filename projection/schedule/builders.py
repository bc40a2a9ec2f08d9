"""Shared pieces of the schedule builders: stage placements, argument checks and the Schedule constructor.

Placement conventions (the same as projection/workload/stages.py):
  looped  virtual stage s on rank s % pp (Megatron interleaving, torch "loop" style);
  V       two stages per rank, stage s on rank s for s < pp and on rank 2*pp-1-s otherwise (torch "v" style), so
          rank r holds stages r and 2*pp-1-r and the data flow goes down the ranks and back up.
The per-schedule builders live in basic.py (GPipe, 1F1B), interleaved.py, zero_bubble.py (ZB-H1, ZB-H2),
vshape.py (ZB-V, V-Half, V-Min) and dualpipe.py (DualPipe, DualPipeV); registry.py dispatches by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from projection.schedule.action import Action, Kind, Schedule


def looped_placement(pp: int, vpp: int) -> tuple[int, ...]:
    """stage_to_rank for pp * vpp stages placed round-robin (stage s on rank s % pp)."""
    return tuple(s % pp for s in range(pp * vpp))


def v_placement(pp: int) -> tuple[int, ...]:
    """stage_to_rank for 2 * pp stages placed in a V (stage s on rank s, then back up: 2*pp-1-s)."""
    return tuple(s if s < pp else 2 * pp - 1 - s for s in range(2 * pp))


def require_positive(pp: int, n_microbatches: int, vpp: int) -> None:
    """ValueError unless pp, n_microbatches and vpp are positive integers."""
    for label, value in (("pp", pp), ("n_microbatches", n_microbatches), ("vpp", vpp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")


def act(stage: int, kind: Kind, microbatch: int) -> Action:
    """Shorthand constructor used by the builders."""
    return Action(stage, kind, microbatch)


def make_schedule(name: str, stage_to_rank: Sequence[int], n_microbatches: int,
                  per_rank: Sequence[Iterable[Action]], *, routes: Sequence[Sequence[int]] = (),
                  overlapped: Sequence[Iterable[int]] = (), warmup: Sequence[int] = (),
                  combined: bool = False) -> Schedule:
    """Freeze per-rank action lists into a Schedule (n_ranks = len(per_rank), n_stages = len(stage_to_rank))."""
    frozen_overlap = tuple(tuple(sorted(o)) for o in overlapped)
    if not any(frozen_overlap):
        frozen_overlap = ()
    return Schedule(
        name=name,
        n_ranks=len(per_rank),
        n_stages=len(stage_to_rank),
        n_microbatches=n_microbatches,
        stage_to_rank=tuple(stage_to_rank),
        actions=tuple(tuple(acts) for acts in per_rank),
        routes=tuple(tuple(r) for r in routes),
        overlapped=frozen_overlap,
        warmup=tuple(warmup),
        combined=combined,
    )
