"""Overlap rules of one action (projection/perf/items.py) as known answers: Megatron's expert all-to-all is waited
for unless `overlap.ep_comm` (its combined 1F1B all-to-all overlap) is on; Transformer Engine's context-parallel
ring attention hides each K/V exchange behind one 1/cp chunk of the attention kernel."""

from __future__ import annotations

import pytest

from projection.perf.action_time import run_items
from projection.perf.items import Entry, ItemBuilder, Unit
from projection.specs.plan import ParallelPlan
from projection.workload.ops_base import Op


def _coll(name: str, kind: str, group: str, phase: str = "F") -> Op:
    return Op(name, "collective", phase, coll=kind, coll_bytes=1, group=group)  # type: ignore[arg-type]


def test_expert_all_to_all_is_waited_for_unless_overlap_is_on() -> None:
    """EP dispatch without `overlap.ep_comm`: the 1 s all-to-all sits on the compute stream before the 1 s expert
    GEMM (2 s); with the overlap (Megatron's combined 1F1B all-to-all overlap) it is launched and hidden (1 s)."""
    gemm = Op("moe.fc1", "grouped_gemm", "F", flop=1.0)
    entries = (Entry(_coll("moe.dispatch.a2a", "all_to_all", "ep")), Entry(gemm))
    for overlap, expected in ((False, 2.0), (True, 1.0)):
        plan = ParallelPlan(ep=2, dp=2, overlap={"ep_comm": overlap})
        items = ItemBuilder(plan, lambda op: 1.0, lambda op: 1.0).items([Unit(entries)], backward=False)
        assert run_items(items).seconds == pytest.approx(expected)


def test_ring_attention_exposes_what_each_chunk_cannot_hide() -> None:
    """CP ring attention (Transformer Engine): each of the cp - 1 K/V exchanges overlaps one 1/cp chunk of the
    attention kernel, so with cp 4, a 2 s exchange and a 4 s attention the exposed time is 3 x (2 - 4/4) = 3 s."""
    attn = Op("attn.core", "attention", "F", flop=1.0)
    ring = Op("attn.cp_ring", "collective", "F", coll="send_recv", coll_bytes=1, group="cp", count=3)
    plan = ParallelPlan(cp=4, dp=1)
    costs = {"attn.core": 4.0}
    items = ItemBuilder(plan, lambda op: costs.get(op.name, 0.0), lambda op: 2.0).items(
        [Unit((Entry(ring), Entry(attn)))], backward=False)
    assert run_items(items).seconds == pytest.approx(4.0 + 3.0)
