"""The two levels of a hierarchical context-parallel group (a2a+p2p) against Megatron-Core's own grouping: its
RankGenerator's cp groups split by `create_hierarchical_groups` (megatron/core/parallel_state.py, with its process
group creation replaced by a recorder), placed on the nodes, the slowest group of each level against projection's
`cp_a2a` and `cp_ring` placements (perf/placement.py op_placements, cost/model.py group_placements)."""

from __future__ import annotations

from collections import Counter

import pytest

from projection.cost.collectives import GroupPlacement
from projection.cost.model import group_placements
from projection.perf.placement import op_placements
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.plan import ParallelPlan

parallel_state = pytest.importorskip("megatron.core.parallel_state")
pytest.importorskip("einops")


def _megatron_levels(tp: int, cp: int, dp: int, pp: int, sizes: tuple[int, int],
                     monkeypatch: pytest.MonkeyPatch) -> list[list[list[int]]]:
    made: list[list[int]] = []
    monkeypatch.setattr(parallel_state, "create_group", lambda ranks, **_: made.append(list(ranks)) or len(made))
    gen = parallel_state.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    levels: list[list[list[int]]] = [[], []]
    for ranks in gen.get_ranks("cp"):
        made.clear()
        parallel_state.create_hierarchical_groups(ranks[0], ranks, list(sizes))
        a = sizes[0]
        n_a2a = len(ranks) // a
        levels[0] += made[:n_a2a]  # level 0 first: len(ranks) / a groups of a
        levels[1] += made[n_a2a:]
    return levels


def _slowest(groups: list[list[int]], gpn: int) -> tuple[int, int, int]:
    worst = max((len({r // gpn for r in g}), -max(Counter(r // gpn for r in g).values())) for g in groups)
    return len(groups[0]), -worst[1], worst[0]


@pytest.mark.parametrize(("tp", "cp", "dp", "pp", "sizes", "gpn"), [
    (2, 8, 1, 1, (2, 4), 8),   # the all-to-all pairs inside a node, the ring across both
    (2, 8, 1, 1, (4, 2), 8),   # a2a groups of 4 x tp 2 = one node each
    (4, 8, 2, 1, (2, 4), 8),   # a2a group = 8 consecutive ranks, ring of stride 8
    (1, 16, 2, 2, (8, 2), 8),  # cp 16 over two nodes, dp and pp outside
    (2, 4, 3, 1, (2, 2), 4),   # 4 GPUs per node
])
def test_levels_are_megatron_cores(tp: int, cp: int, dp: int, pp: int, sizes: tuple[int, int], gpn: int,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    world = tp * cp * dp * pp
    cluster = ClusterSpec(device=load_device("h100-sxm"), nodes=world // gpn, gpus_per_node=gpn)
    plan = ParallelPlan(tp=tp, cp=cp, dp=dp, pp=pp, cp_comm="a2a+p2p", cp_hierarchy=sizes)
    levels = _megatron_levels(tp, cp, dp, pp, sizes, monkeypatch)
    assert [len(g) for g in levels[0][:1] + levels[1][:1]] == list(sizes)
    fast, slow = op_placements(cluster, plan), group_placements(cluster, plan)
    for level, axis in enumerate(("cp_a2a", "cp_ring")):
        want = _slowest(levels[level], gpn)
        for got in (fast[axis], slow[axis]):
            assert isinstance(got, GroupPlacement)
            assert (got.n_ranks, got.ranks_per_node, got.n_nodes) == want, (axis, got)
