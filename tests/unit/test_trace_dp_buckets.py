"""The Chrome trace draws the data-parallel gradient buckets launched inside a stage's last backward (overlapped
gradient reduction), bucket by bucket, where the pricing placed them. An audit found a dp-8 Llama-2-7B trace holding
one 224 us `dp grad s0` event for 0.078 s of reduce-scatters: the overlapped buckets were not drawn at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.cli_perf_outputs import trace_tails
from projection.perf import project
from projection.report.trace import chrome_trace
from projection.report.trace_dp import BUCKET_TID
from tests.unit.test_trace_lanes import partial_overlaps

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"


@pytest.mark.parametrize("pp", [1, 2])
def test_buckets_are_drawn_as_priced_and_end_with_the_simulated_task(pp: int) -> None:
    sc = api.load(EXAMPLE, overrides={"plan.overlap.grad_reduce": True, "plan.pp": pp, "plan.tp": 1})
    p = project(sc)
    assert p.dp.in_backward, "the first pipeline rank's first chunk is bucketed"
    trace = chrome_trace(p.sim, trace_tails(p), p.rounds, p.priced, p.dp)
    assert partial_overlaps(trace) == []
    for rank, stage in p.dp.in_backward:
        mine = [b for b in p.dp.grad_buckets if b.pp_rank == rank and b.stage == stage]
        drawn = sorted((e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank
                        and e["tid"] == BUCKET_TID and e["args"]["stage"] == stage), key=lambda e: e["ts"])
        # each bucket once (no later start on the comm stream here), with its priced seconds, one after another
        assert len(drawn) == len(mine) > (1 if rank == 0 else 0)  # only the first pp rank's chunk is bucketed
        assert sum(e["dur"] for e in drawn) / 1e6 == pytest.approx(sum(b.seconds for b in mine), rel=1e-9)
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in zip(drawn, drawn[1:], strict=False))
        # the first bucket starts inside the stage's last backward, as Megatron launches it when its grads are
        # ready; one bucket (the whole buffer) at its end
        last = max((e for e in p.sim.timeline[rank] if e.stream == "compute" and e.action is not None
                     and e.action.stage == stage and e.action.kind in ("B", "W")), key=lambda e: e.end_s)
        if len(mine) > 1:
            assert last.start_s * 1e6 <= drawn[0]["ts"] < last.end_s * 1e6
        else:
            assert drawn[0]["ts"] == pytest.approx(last.end_s * 1e6)
        # the chain's end is the simulated task's: the part past the backward is what the simulation ran
        task = [e for e in p.sim.timeline[rank] if e.action is None and e.label == f"dp grad s{stage}"]
        end_s = (drawn[-1]["ts"] + drawn[-1]["dur"]) / 1e6
        assert end_s == pytest.approx(task[0].end_s if task else min(end_s, last.end_s), abs=1e-9)
        # and that task is not drawn a second time on the comm thread
        assert not [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank
                    and e["name"] == f"dp grad s{stage}"]


def test_a_bucket_across_the_backward_end_splits_where_the_simulated_task_starts_later() -> None:
    """The chain runs 0.2 s past a 1 s backward that starts at 10 s; the simulation ran that tail from 11.5 s to
    11.9 s (its comm stream busy, then a shared NIC): the part inside the action stays where it ran, the rest is
    mapped onto the task, stretched by its 0.4 / 0.2."""
    from projection.report.trace_dp import _parts
    from projection.sim.result import TimelineEntry

    task = TimelineEntry(None, 11.5, 11.9, "comm", "dp grad s0")
    assert _parts(0.2, 0.5, 1.0, 10.0, 0.2, task) == [(10.2, 10.5)]
    assert _parts(0.9, 1.1, 1.0, 10.0, 0.2, task) == [(10.9, 11.0), (11.5, pytest.approx(11.7))]
    assert _parts(1.1, 1.2, 1.0, 10.0, 0.2, task) == [(pytest.approx(11.7), pytest.approx(11.9))]
    on_time = TimelineEntry(None, 11.0, 11.2, "comm", "dp grad s0")
    assert _parts(0.9, 1.1, 1.0, 10.0, 0.2, on_time) == [(10.9, pytest.approx(11.1))]
