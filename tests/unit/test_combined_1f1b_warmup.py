"""Megatron-Core's interleaved schedule under overlap_moe_expert_parallel_comm (the combined 1F1B that hides the
expert-parallel all-to-all) runs one more warm-up forward on every rank (schedules.py get_pp_rank_microbatches:
`num_warmup_microbatches + 1`), so each steady step's forward and backward are independent, and runs each steady
forward layer by layer with its backward: the order and Megatron's p2p calls follow the extra warm-up; the
microbatches in flight count a steady forward with its backward, so the peak stays the plain schedule's."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.perf.project import build_plan_schedule, project
from projection.schedule.inflight import peak_inflight_total
from projection.schedule.interleaved import interleaved_1f1b
from projection.schedule.megatron_calls import megatron_calls
from projection.sim.costs import StageCosts
from projection.sim.dag import walk
from projection.sim.p2p_walk import megatron_walk


def megatron_warmup(rank: int, pp: int, vpp: int, m: int, group: int, ep_overlap: bool) -> int:
    """get_pp_rank_microbatches (megatron-core 0.16.1 schedules.py), transliterated: (pp - rank - 1) * 2 +
    (vpp - 1) * group, + 1 under overlap_moe_expert_parallel_comm, at most every forward."""
    w = (pp - rank - 1) * 2 + (vpp - 1) * group + (1 if ep_overlap else 0)
    return min(w, m * vpp)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 2, 8), (4, 3, 12), (8, 2, 16), (3, 2, 3), (4, 2, 4)])
def test_one_more_warm_up_forward_on_every_rank(pp: int, vpp: int, m: int) -> None:
    sched = interleaved_1f1b(pp, m, vpp, combined_1f1b=True)
    for r, acts in enumerate(sched.actions):
        first_b = next(i for i, a in enumerate(acts) if a.kind == "B")
        w = megatron_warmup(r, pp, vpp, m, pp, ep_overlap=True)
        assert sched.warmup[r] == w
        # the W warm-up forwards, then (with a steady state) one more forward before the first backward
        assert first_b == (w + 1 if w < m * vpp else m * vpp)
        assert max(sum(1 for a in acts[:i + 1] if a.kind == "F") - sum(1 for a in acts[:i + 1] if a.kind == "B")
                   for i in range(len(acts))) == min(w + 1, m * vpp)
    plain = interleaved_1f1b(pp, m, vpp)
    assert all(x == min(y + 1, m * vpp) for x, y in zip(sched.warmup, plain.warmup, strict=True))
    # memory: the extra warm-up forward is the one a combined step no longer adds
    assert sched.combined and peak_inflight_total(sched) == peak_inflight_total(plain)


@pytest.mark.parametrize("overlap", [False, True])
def test_megatron_calls_pair_with_the_extra_warm_up(overlap: bool) -> None:
    for pp, vpp, m in ((4, 2, 8), (4, 3, 12), (3, 2, 6), (8, 2, 8)):
        sched = interleaved_1f1b(pp, m, vpp, combined_1f1b=True)
        calls = megatron_calls(sched, overlap)
        assert all(calls.partner[calls.partner[o]] == o for o in range(len(calls.partner)))
        costs = StageCosts.uniform(pp * vpp, 1.0, 2.0, p2p_s=0.02)
        assert megatron_walk(sched, costs, overlap=overlap).step_time_s >= walk(sched, costs).step_time_s - 1e-9


def test_a_megatron_job_with_the_expert_parallel_overlap(tmp_path: Path) -> None:
    """A Megatron-LM MoE job, pp 4 vpp 2, with and without --overlap-moe-expert-parallel-comm: the overlap's
    schedule has one more warm-up forward per rank, and the memory estimate as many microbatches in flight."""
    args = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --max-position-embeddings "
            "2048 --micro-batch-size 1 --global-batch-size 64 --vocab-size 32000 --bf16 --pipeline-model-parallel-size "
            "4 --num-layers-per-virtual-pipeline-stage 1 --num-experts 8 --moe-router-topk 2 "
            "--expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall")
    path = tmp_path / "args.txt"
    runs = {}
    for name, extra in (("plain", ""), ("overlap", " --overlap-moe-expert-parallel-comm")):
        path.write_text(args + extra + "\n", encoding="utf-8")
        sc = api.load(path, hardware="mi300x", nodes=1)
        runs[name] = (sc, build_plan_schedule(sc), api.estimate_memory(sc))
    (_, plain, mem0), (sc, over, mem1) = runs["plain"], runs["overlap"]
    assert sc.plan.overlap.ep_comm and sc.plan.megatron_combined_1f1b
    assert [w - v for w, v in zip(over.warmup, plain.warmup, strict=True)] == [1, 1, 1, 1]
    assert [sum(b.inflight.values()) for b in mem1.ranks] == [sum(a.inflight.values()) for a in mem0.ranks]
    assert project(sc).engine == "megatron"


def test_pp_vis_memory_track_counts_a_steady_forward_with_its_backward() -> None:
    """The --pp-vis activation track follows the same rule: with one unit per microbatch and stage, each rank's peak
    is its peak in flight, equal for the combined and the plain order."""
    from projection.report.ppvis import pp_vis_dump

    for pp, vpp, m in ((4, 2, 8), (4, 3, 12)):
        peaks = []
        for combined in (False, True):
            sched = interleaved_1f1b(pp, m, vpp, combined_1f1b=combined)
            dump = pp_vis_dump(megatron_walk(sched, StageCosts.uniform(pp * vpp, 1.0, 2.0), overlap=True), 1.0)
            peaks.append([dump[f"pp_rank_{r}.json"]["0"]["memory"] for r in range(pp)])
            assert peaks[-1] == [float(x) for x in peak_inflight_total(sched)]
        assert peaks[0] == peaks[1]


def test_primus_pipeline_runs_no_combined_1f1b() -> None:
    """Primus's own pipeline (patch_primus_pipeline) runs its own interleaved order: Megatron's extra warm-up is
    schedules.py's, so it is not applied there."""
    from projection.specs.plan import ParallelPlan

    plan = ParallelPlan(pp=4, vpp=2, dp=1, ep=2, schedule="interleaved_1f1b", overlap={"ep_comm": True},
                        pipeline_runtime="actions")
    assert not plan.megatron_combined_1f1b
    assert plan.model_copy(update={"pipeline_runtime": "megatron"}).megatron_combined_1f1b
