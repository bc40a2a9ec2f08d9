"""Oracle: with Megatron's distributed optimizer the per-tensor loops of the optimizer step (count-zeros, the copy of
the main parameters, the multi-tensor launches) run over the parameters that overlap the rank's slice of each
gradient bucket. projection.perf.optimizer.shard_tensors gives their mean over the data-parallel ranks; here they are
counted exactly on the parameter list of a real PyTorch model (tests/oracle/gpt_job.py, built on the meta device),
laid out as Megatron-Core 0.16's ParamAndGradBuffer does with the distributed optimizer
(megatron/core/distributed/param_and_grad_buffer.py): parameters in reverse order, each starting at a multiple of 64
elements, a bucket closed once it holds at least `bucket_size` elements, its end padded to a multiple of
lcm(d, 128), then cut into d equal slices, slice r on data-parallel rank r."""

from __future__ import annotations

import math

import pytest

from projection.perf.optimizer import shard_tensors

torch = pytest.importorskip("torch")

from tests.oracle.gpt_job import GPT, Job  # noqa: E402

JOBS = [Job(512, 8, 12, 50304, 1024, 1), Job(256, 4, 2, 4096, 512, 2), Job(1024, 16, 24, 32000, 2048, 1)]


def megatron_layout(sizes: list[int], d: int, bucket: int | None) -> tuple[int, float]:
    """(number of buckets, mean over the d ranks of the tensors that overlap the rank's slices)."""
    pad = math.lcm(d, 128)
    buckets: list[tuple[int, int, list[tuple[int, int]]]] = []
    start = bucket_start = end = 0
    params: list[tuple[int, int]] = []
    for n in reversed(sizes):
        start = math.ceil(start / 64) * 64
        end = start + n
        params.append((start, end))
        if bucket is not None and end - bucket_start >= bucket:
            bucket_end = math.ceil(end / pad) * pad
            buckets.append((bucket_start, bucket_end, params))
            params, bucket_start, start = [], bucket_end, bucket_end
        else:
            start = end
    if params:
        buckets.append((bucket_start, math.ceil(end / pad) * pad, params))
    overlaps = 0
    for lo, hi, members in buckets:
        width = (hi - lo) // d
        for r in range(d):
            a, b = lo + r * width, lo + (r + 1) * width
            overlaps += sum(1 for s, e in members if s < b and e > a)
    return len(buckets), overlaps / d


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j.layers}x{j.h}")
@pytest.mark.parametrize("bucket", [None, 4_000_000, 40_000_000])
def test_mean_shard_tensors_match_megatron_layout(job: Job, bucket: int | None) -> None:
    with torch.device("meta"):
        sizes = [p.numel() for p in GPT(job).parameters()]
    for d in (2, 4, 8, 16, 64, 512):
        n_buckets, exact = megatron_layout(sizes, d, bucket)
        ours = shard_tensors(len(sizes), n_buckets, d)
        # The formula counts every slice boundary as splitting a tensor; with power-of-two tensor sizes a boundary
        # can land exactly on a tensor edge (at most 1.5 of 77.5 tensors here), so it is an upper bound.
        assert exact <= ours <= exact * 1.02, (d, n_buckets, exact, ours)
        assert ours < len(sizes)  # sharding always shortens the loops


def test_shard_tensors_without_sharding_is_every_tensor() -> None:
    assert shard_tensors(148, 1, 1) == 148
    assert shard_tensors(148, 3, 1) == 148
    assert shard_tensors(0, 1, 8) == 0
