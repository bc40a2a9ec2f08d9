"""When a pipeline stage's gradient buckets become ready (projection/perf/dp.py `_tail_s`), from Megatron's DDP:
dense and expert parameters live in buffers of their own (`buffers`, `expert_parallel_buffers`), each bucket ready
once the backward has produced its buffer's gradients up to it. A buffer that is not split into buckets (Megatron
buckets only the first pipeline stage's first model chunk) is ready when the stage's backward ends, whatever the
other buffer holds."""

from __future__ import annotations

import pytest

from projection.perf import default_cost_model
from projection.perf.dp import Bucket, _tail_s, dp_comm_tasks, last_backward
from projection.perf.pricing import price_stages
from projection.perf.project import build_plan_schedule
from tests.unit.test_perf_core import scenario

ACTION_S = 0.0322


def bucket(group: str, params: int, seconds: float, order: int = 0) -> Bucket:
    return Bucket(1, 2, "reduce_scatter", group, params, params * 4, seconds, order)


def test_an_unbucketed_dense_buffer_is_reduced_after_the_backward_whatever_the_experts_hold() -> None:
    dense = bucket("dp", 247_234_560, 0.00454)
    experts = bucket("edp", 352_321_536, 0.0)  # expert data parallelism 1: nothing to reduce
    assert _tail_s([dense], ACTION_S) == pytest.approx(0.00454)
    assert _tail_s([dense, experts], ACTION_S) == pytest.approx(0.00454)  # was 0: ready at 41 % of the backward
    assert _tail_s([dense, bucket("edp", 352_321_536, 0.002)], ACTION_S) == pytest.approx(0.00654)


def test_buckets_of_each_buffer_become_ready_along_its_own_parameters() -> None:
    """Two dense buckets (the second ready at the end) and one expert bucket (ready at the end): the first dense
    bucket runs during the backward, the other two after it, back to back on one stream."""
    dense = [bucket("dp", 100, 0.010, 0), bucket("dp", 100, 0.003, 1)]
    experts = [bucket("edp", 1000, 0.004, 0)]
    # dense 0 ready at half the backward (0.0161 s) and done at 0.0261 s, before the end: only 0.003 + 0.004 remain
    assert _tail_s(dense + experts, ACTION_S) == pytest.approx(0.007)


def test_interleaved_chunks_reduce_whole_and_r_steps_late_with_align_grad_reduce() -> None:
    """Megatron's interleaved schedule with --overlap-grad-reduce and align_grad_reduce (its default): grad sync is
    off during every backward; the chunk whose last microbatch backward was virtual microbatch k - r is launched
    whole from the postprocess of backward k on pp rank r (schedules.py backward_step_helper_postprocess), the rest
    after the loop. With --no-align-grad-reduce the first rank's first chunk overlaps its buckets with its last
    backward (the DDP hooks)."""

    def tasks(align: bool):  # type: ignore[no-untyped-def]
        sc = scenario(hidden=2048, layers=16, pp=2, vpp=4, schedule="interleaved_1f1b", zero=1, gbs=32, nodes=4,
                      overlap={"grad_reduce": True, "align_grad_reduce": align})
        cm = default_cost_model(sc)
        sched = build_plan_schedule(sc)
        return sched, dp_comm_tasks(sc, cm, sched, price_stages(sc, cm))

    sched, dp = tasks(True)
    for r, acts in enumerate(sched.actions):
        backward = [a for a in acts if a.kind in ("B", "W")]
        for s in sched.stages_of(r):
            (task,) = [t for t in dp.tasks if t.rank == r and t.label == f"dp grad s{s}"]
            mine = [b for b in dp.grad_buckets if b.pp_rank == r and b.stage == s]
            assert task.duration_s == pytest.approx(sum(b.seconds for b in mine))  # nothing overlapped its backward
            i = backward.index(last_backward(acts, s)) + r
            if i < len(backward):
                assert task.after is backward[i]
            else:  # after the loop: the rank's last compute
                assert task.after is next(a for a in reversed(acts) if a.kind in ("F", "B", "I", "W"))
    _, loose = tasks(False)
    first = [t for t in loose.tasks if t.rank == 0 and t.label == "dp grad s0"]
    whole = sum(b.seconds for b in loose.grad_buckets if b.pp_rank == 0 and b.stage == 0)
    assert not first or first[0].duration_s < whole  # the buckets overlapped the chunk's last backward
