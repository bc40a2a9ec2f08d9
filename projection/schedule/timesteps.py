"""Time steps of torch.distributed.pipelining's multi-stage schedules: the index of each action in torch's
`pipeline_order[rank]`, where None slots pad the ranks onto one clock. Up to torch 2.9 `PipelineScheduleMulti`
runs these steps in lock-step (sim/lockstep.py); 2.10+ runs the same orders with explicit send and receive actions.

  interleaved_1f1b  ScheduleInterleaved1F1B (schedule/interleaved.py torch_time_steps)
  gpipe, vpp > 1    ScheduleLoopedBFS: rank r waits r steps, runs every forward, waits 2 (pp - 1 - r) steps (the
                    first backward trickling up), then every backward
  zbv               ScheduleZBVZeroBubble: rank r waits r steps; the order's actions on microbatches beyond the
                    step's (present when m < 2pp - 1) are empty steps (schedule/vshape.py zbv_padded)
Each is checked against torch's pipeline_order in tests/oracle/test_schedules_vs_torch.py.
"""

from __future__ import annotations

from projection.schedule.interleaved import torch_time_steps
from projection.schedule.vshape import zbv_padded

Steps = tuple[tuple[int, ...], ...]


def lockstep_steps(name: str, pp: int, n_microbatches: int, vpp: int) -> Steps | None:
    """Per rank, the time step of each action of schedule `name` in execution order, as torch up to 2.9 runs it
    in lock-step; None where torch ran `name` on another runtime (one-stage GPipe and 1F1B, DualPipeV)."""
    m = n_microbatches
    if name == "interleaved_1f1b":
        return torch_time_steps(pp, m, vpp)
    if name == "gpipe" and vpp > 1:
        return tuple(tuple(range(r, r + vpp * m)) + tuple(range(r + vpp * m + 2 * (pp - 1 - r),
                                                                 r + 2 * vpp * m + 2 * (pp - 1 - r)))
                     for r in range(pp))
    if name == "zbv":
        return tuple(tuple(r + i for i, a in enumerate(zbv_padded(r, pp, m)) if a.microbatch < m) for r in range(pp))
    return None
