"""When a pipeline stage's gradient buckets become ready (projection/perf/dp.py `_tail_s`), from Megatron's DDP:
dense and expert parameters live in buffers of their own (`buffers`, `expert_parallel_buffers`), each bucket ready
once the backward has produced its buffer's gradients up to it. A buffer that is not split into buckets (Megatron
buckets only the first pipeline stage's first model chunk) is ready when the stage's backward ends, whatever the
other buffer holds."""

from __future__ import annotations

import pytest

from projection.perf.dp import Bucket, _tail_s

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
