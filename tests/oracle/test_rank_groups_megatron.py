"""Where projection places every communicator group on the nodes, against Megatron-Core's own group construction.

The oracle is megatron.core.parallel_state.RankGenerator as `initialize_model_parallel` builds it: the dense
generator RankGenerator(tp, ep=1, dp, pp, cp, order) and the expert one RankGenerator(tp=etp, ep, dp=expert dp, pp,
cp=1, order), in both of Megatron's rank orders (tp-cp-ep-dp-pp, and tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping).
Their groups, by the tokens initialize_model_parallel asks for ('tp', 'cp', 'dp', 'pp', 'dp-cp' on the dense
generator; 'ep', 'tp', 'tp-ep', 'dp', 'tp-ep-pp' on the expert one), are placed on nodes of gpus_per_node GPUs
(node = rank // gpus_per_node) and the slowest of each kind (most nodes, then fewest ranks on its busiest node;
rail-aligned when each group holds the same local GPU indices on all its nodes) is compared with projection's:
op_placements and group_placements (tp, cp, dp, pp, ep, etp, etp_ep), shard_placements (the dp x cp gradient group,
no HSDP), expert_dp_placement, world_placement (the intra-distributed-optimizer-instance group of one instance: the
'tp-ep-pp' groups joined) and boundary_placement (the pair of ranks at positions a and a+1 mod pp of every pipeline
group: p2p's next/previous rank, and with a = pp-1 the first-last pair of the embedding group).
Megatron-Core refuses (asserts) the mapping order with pp > 1 unless the expert dp equals the dense dp; those layouts
are left out in that order (projection refuses them at load too: specs/validate.py layout_problems)."""

from __future__ import annotations

from collections import Counter

import pytest

from projection.cost.collectives import GroupPlacement
from projection.cost.model import group_placements
from projection.perf.placement import (
    boundary_placement,
    expert_dp_placement,
    op_placements,
    shard_placements,
    world_placement,
)
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.plan import ParallelPlan

parallel_state = pytest.importorskip("megatron.core.parallel_state")

ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
# (tp, cp, pp, ep, etp, gpus_per_node, nodes); dp = world / (tp cp pp), expert dp = world / (etp ep pp)
LAYOUTS = [
    (2, 1, 2, 1, 2, 8, 2),    # dense: dp 4 inside a node, pp across
    (8, 1, 4, 1, 8, 8, 4),    # tp = one node, dp 1
    (4, 2, 2, 1, 4, 8, 4),    # tp x cp = one node
    (1, 4, 2, 1, 1, 4, 4),    # cp = one node of 4
    (2, 2, 3, 1, 2, 4, 6),    # pp 3
    (2, 1, 4, 1, 2, 2, 8),    # 2 GPUs per node
    (4, 1, 1, 1, 4, 2, 4),    # tp across nodes
    (1, 1, 8, 1, 1, 8, 2),    # pp 8, dp 2
    (2, 1, 2, 4, 1, 8, 2),    # MoE: etp 1 < tp, expert dp 2 != dp 4
    (4, 1, 2, 8, 1, 8, 4),    # ep 8 over a node's worth of experts, expert dp 2 != dp 4
    (2, 2, 2, 4, 1, 8, 4),    # ep = tp x cp ranks: expert dp = dp = 4
    (1, 1, 1, 8, 2, 8, 4),    # etp 2 > tp 1, ep x etp = 16 across two nodes
    (4, 1, 2, 2, 2, 4, 4),    # etp 2 < tp 4, expert dp = dp
    (2, 1, 1, 4, 4, 4, 4),    # etp 4 > tp 2, expert dp 1
    (2, 1, 2, 2, 1, 2, 8),    # MoE on 2 GPUs per node
    (1, 2, 2, 8, 1, 8, 2),    # ep 8 with cp 2, expert dp 1
    (8, 1, 2, 16, 1, 8, 8),   # ep 16 across nodes, expert dp 2
    (2, 4, 2, 8, 1, 8, 8),    # cp 4, ep 8 = tp x cp, expert dp = dp
    (4, 2, 4, 2, 2, 4, 16),   # pp 4, expert dp 4 != dp 2
    (2, 1, 3, 2, 1, 4, 6),    # pp 3 MoE, expert dp = dp
    (1, 1, 8, 1, 1, 8, 5),    # dp 5 on nodes of 8: groups straddle nodes unevenly (3+2 against 1+4)
    (1, 1, 1, 5, 1, 8, 5),    # ep 5 straddling nodes, expert dp 8
    (3, 1, 2, 1, 3, 4, 3),    # tp 3 on nodes of 4
]


def _megatron_refuses(order: str, tp: int, cp: int, pp: int, ep: int, etp: int, world: int) -> bool:
    """initialize_model_parallel: assert order.endswith("pp") or pp == 1 or expert dp == dp."""
    return not (order.endswith("pp") or pp == 1 or world // (etp * ep * pp) == world // (tp * cp * pp))


CASES = [pytest.param(order, *layout, id=f"{order[-5:]}-tp{layout[0]}cp{layout[1]}pp{layout[2]}ep{layout[3]}"
                      f"etp{layout[4]}-{layout[5]}x{layout[6]}")
         for order in ORDERS for layout in LAYOUTS
         if not _megatron_refuses(order, *layout[:5], layout[5] * layout[6])]


def _slowest(groups: list[list[int]], gpn: int) -> GroupPlacement:
    """The group spanning the most nodes, then with the fewest ranks on its busiest node; rail-aligned when every
    group holds the same local GPU indices on each of its nodes."""
    worst = max((len({r // gpn for r in g}), -max(Counter(r // gpn for r in g).values())) for g in groups)
    rail = all(len({frozenset(r % gpn for r in g if r // gpn == n) for n in {r // gpn for r in g}}) == 1
               for g in groups)
    return GroupPlacement(len(groups[0]), -worst[1], worst[0], rail)


def _megatron_groups(order: str, tp: int, cp: int, pp: int, ep: int, etp: int, world: int
                     ) -> dict[str, list[list[int]]]:
    dense = parallel_state.RankGenerator(tp=tp, ep=1, dp=world // (tp * cp * pp), pp=pp, cp=cp, order=order)
    expert = parallel_state.RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
    assert dense.get_ranks("pp") == expert.get_ranks("pp")  # initialize_model_parallel's own check
    out = {axis: dense.get_ranks(axis) for axis in ("tp", "cp", "dp", "pp")}
    out |= {"ep": expert.get_ranks("ep"), "etp": expert.get_ranks("tp"), "etp_ep": expert.get_ranks("tp-ep"),
            "grad": dense.get_ranks("dp-cp"), "expert_grad": expert.get_ranks("dp"),
            "world": [[r for g in expert.get_ranks("tp-ep-pp") for r in g]]}
    return out


@pytest.mark.parametrize(("order", "tp", "cp", "pp", "ep", "etp", "gpn", "nodes"), CASES)
def test_groups_are_placed_as_megatron_core_builds_them(order: str, tp: int, cp: int, pp: int, ep: int, etp: int,
                                                        gpn: int, nodes: int) -> None:
    world = gpn * nodes
    cluster = ClusterSpec(device=load_device("h100-sxm"), nodes=nodes, gpus_per_node=gpn)
    plan = ParallelPlan(tp=tp, cp=cp, pp=pp, dp=world // (tp * cp * pp), ep=ep, etp=etp, rank_order=order)
    groups = _megatron_groups(order, tp, cp, pp, ep, etp, world)
    want = {axis: _slowest(g, gpn) for axis, g in groups.items()}
    fast, slow = op_placements(cluster, plan), group_placements(cluster, plan)
    got = {axis: fast[axis] for axis in ("tp", "cp", "dp", "pp", "ep", "etp", "etp_ep")}
    assert {axis: slow[axis] for axis in got} == got
    got |= {"grad": shard_placements(cluster, plan)[0], "expert_grad": expert_dp_placement(cluster, plan),
            "world": world_placement(cluster, plan)}
    assert shard_placements(cluster, plan)[1] is None
    assert got == want, {axis: (got[axis], want[axis]) for axis in want if got[axis] != want[axis]}
    for a in range(pp if pp > 1 else 0):  # pipeline boundaries, the last one back to the first stage
        pairs = [[g[a], g[(a + 1) % pp]] for g in groups["pp"]]
        assert boundary_placement(cluster, plan, a, (a + 1) % pp) == _slowest(pairs, gpn), (a, (a + 1) % pp)
