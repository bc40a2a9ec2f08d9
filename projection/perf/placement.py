"""Where the communicators of one plan sit on the cluster, computed with numpy (a 16,384-GPU cluster in milliseconds).

Same semantics as projection.cost.collectives.group_placement (Megatron's rank order tp-cp-ep-dp-pp, or
tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping, tp innermost;
node = rank // gpus_per_node; of all the groups along an axis the one spanning the most nodes, then the fewest ranks
per node, sets the pace; rail_aligned when every node of every group holds the same local GPU indices), vectorised,
plus the placements the performance model needs besides the op axes: the data-parallel gradient groups (dp x cp for
dense parameters, the expert-data-parallel group for experts), the whole world (gradient-norm all-reduce), HSDP
shard / replicate groups and the pair of ranks of one pipeline boundary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from projection.cost.collectives import AXES, GroupPlacement
from projection.errors import PlanError, Problem
from projection.specs.hardware import ClusterSpec
from projection.specs.plan import ParallelPlan


def grid_placement(cluster: ClusterSpec, sizes: Sequence[int], axes: str,
                   order: str = "tp-cp-ep-dp-pp") -> GroupPlacement:
    """Placement of the groups along `axes` ('dp', 'dp-cp', 'tp-cp-dp-pp' ...) of the grid `sizes` = (tp, cp, ep, dp,
    pp) in Megatron's rank order `order` (innermost first; ParallelPlan.rank_order). Raises PlanError when the grid
    does not fill the cluster."""
    names = [a for a in axes.replace("_", "-").split("-") if a]
    bad = [a for a in names if a not in AXES]
    world = math.prod(sizes)
    if bad or not names:
        raise PlanError(Problem(f"unknown parallel axes {axes!r}", key="axis", fix=f"join {', '.join(AXES)} with '-'"))
    if world != cluster.world_size:
        raise PlanError(Problem(f"tp*cp*ep*dp*pp = {world} but the cluster has {cluster.world_size} GPUs",
                                key="plan", fix="make the product of the parallel sizes equal the number of GPUs"))
    axes_in_order = tuple(order.split("-"))
    by_axis = dict(zip(AXES, sizes, strict=True))
    return _grid(cluster.gpus_per_node, tuple(by_axis[a] for a in axes_in_order), frozenset(names), axes_in_order)


@lru_cache(maxsize=1024)
def _grid(gpn: int, sizes: tuple[int, ...], names: frozenset[str], order: tuple[str, ...] = AXES) -> GroupPlacement:
    """Pure in its integer arguments, so cached (a sweep or a scaling table asks for the same grids again); `sizes`
    in `order`, innermost first."""
    world = math.prod(sizes)
    rank = np.arange(world, dtype=np.int64)
    key = np.zeros(world, dtype=np.int64)
    stride, n_ranks = 1, 1
    for axis, size in zip(order, sizes, strict=True):
        coord = (rank // stride) % size
        if axis in names:
            n_ranks *= size
        else:
            key = key * size + coord
        stride *= size
    return _worst(rank, key, gpn, n_ranks)


def _worst(rank: np.ndarray, key: np.ndarray, gpn: int, n_ranks: int) -> GroupPlacement:
    """The slowest group of ranks grouped by `key`: most nodes, then fewest ranks on its busiest node."""
    node = rank // gpn
    local = rank % gpn
    order = np.lexsort((node, key))
    k, nd, lc = key[order], node[order], local[order]
    first = np.ones(len(k), dtype=bool)
    first[1:] = (k[1:] != k[:-1]) | (nd[1:] != nd[:-1])
    starts = np.flatnonzero(first)
    pair_key = k[starts]
    counts = np.diff(np.append(starts, len(k)))
    one = np.int64(1)
    low = np.bitwise_or.reduceat(np.where(lc < 62, np.left_shift(one, lc % 62), 0), starts)
    high = np.bitwise_or.reduceat(np.where(lc >= 62, np.left_shift(one, (lc - 62) % 62), 0), starts)
    group_first = np.ones(len(pair_key), dtype=bool)
    group_first[1:] = pair_key[1:] != pair_key[:-1]
    gstarts = np.flatnonzero(group_first)
    n_nodes = np.diff(np.append(gstarts, len(pair_key)))
    max_per_node = np.maximum.reduceat(counts, gstarts)
    aligned = all(bool(np.all(np.minimum.reduceat(m, gstarts) == np.maximum.reduceat(m, gstarts)))
                  for m in (low, high))  # local GPU index sets as two 62-bit masks: up to 124 GPUs per node
    most = int(n_nodes.max())
    per_node = int(max_per_node[n_nodes == most].min())
    return GroupPlacement(n_ranks=n_ranks, ranks_per_node=per_node, n_nodes=most, rail_aligned=aligned)


def dense_sizes(plan: ParallelPlan) -> tuple[int, int, int, int, int]:
    """(tp, cp, ep, dp, pp) of the dense grid (ep folded into dp)."""
    return plan.tp, plan.cp, 1, plan.dp_(), plan.pp


def expert_sizes(plan: ParallelPlan) -> tuple[int, int, int, int, int]:
    """(etp, 1, ep, edp, pp) of the expert grid (Megatron parallel folding)."""
    return plan.etp_, 1, plan.ep, plan.edp(), plan.pp


def op_placements(cluster: ClusterSpec, plan: ParallelPlan) -> dict[str, GroupPlacement]:
    """Placement of every group axis an op names (projection.cost.model.group_placements, fast): tp, cp, dp, pp on
    the dense grid; ep, etp and etp_ep (the tensor-and-expert group) on the expert grid."""
    dense, expert, order = dense_sizes(plan), expert_sizes(plan), plan.rank_order
    out = {axis: grid_placement(cluster, dense, axis, order) for axis in ("tp", "cp", "dp", "pp")}
    out["ep"] = grid_placement(cluster, expert, "ep", order)
    out["etp"] = grid_placement(cluster, expert, "tp", order)
    out["etp_ep"] = grid_placement(cluster, expert, "tp-ep", order)
    if plan.cp_levels is not None:
        # a2a+p2p's levels: cp split in place into an all-to-all group of a consecutive cp ranks (inner) and the ring
        # over the ranks of stride a (Megatron-Core create_hierarchical_groups)
        axes = order.split("-")
        at = axes.index("cp")
        split = (*axes[:at], "cp_a2a", "cp_ring", *axes[at + 1:])
        by_axis = {**dict(zip(AXES, dense, strict=True)), "cp_a2a": plan.cp_levels[0], "cp_ring": plan.cp_levels[1]}
        for level in ("cp_a2a", "cp_ring"):
            out[level] = _grid(cluster.gpus_per_node, tuple(by_axis[a] for a in split), frozenset({level}), split)
    return out


def strided_placement(cluster: ClusterSpec, stride: int, n: int, n_groups: int, offset: int = 0) -> GroupPlacement:
    """Groups {offset + base + i * stride : i < n} for base in [0, n_groups): e.g. the two ranks of a pipeline
    boundary (stride = distance of the two pp ranks x pp stride), or an HSDP replicate group."""
    base = offset + np.arange(n_groups, dtype=np.int64)
    rank = (base[:, None] + stride * np.arange(n, dtype=np.int64)[None, :]).ravel()
    key = np.repeat(base, n)
    return _worst(rank, key, cluster.gpus_per_node, n)


def boundary_placement(cluster: ClusterSpec, plan: ParallelPlan, rank_a: int, rank_b: int) -> GroupPlacement:
    """The pair of GPUs that exchange activations between pipeline ranks rank_a and rank_b (worst over tp/cp/dp)."""
    lo, hi = sorted((rank_a, rank_b))
    if plan.rank_order == "tp-cp-ep-pp-dp":  # pp inside dp: the pair is tp*cp*(hi - lo) apart within a dp block
        inner, block = plan.tp * plan.cp, plan.tp * plan.cp * plan.pp
        if hi == lo:
            return GroupPlacement(1, 1, 1)
        base = (np.arange(plan.dp_(), dtype=np.int64)[:, None] * block + lo * inner
                + np.arange(inner, dtype=np.int64)[None, :]).ravel()
        rank = (base[:, None] + np.array([0, (hi - lo) * inner], dtype=np.int64)[None, :]).ravel()
        return _worst(rank, np.repeat(base, 2), cluster.gpus_per_node, 2)
    pp_stride = plan.tp * plan.cp * plan.dp_()
    # node crossings repeat with period gpus_per_node in the base rank: checking lo's ranks of one node suffices
    bases = min(pp_stride, cluster.gpus_per_node)
    if hi == lo:
        return GroupPlacement(1, 1, 1)
    return strided_placement(cluster, (hi - lo) * pp_stride, 2, bases, offset=lo * pp_stride)


def shard_placements(cluster: ClusterSpec, plan: ParallelPlan) -> tuple[GroupPlacement, GroupPlacement | None]:
    """(shard group, replicate group or None) of dense data-parallel sharding: dp x cp, or with HSDP the inner
    dp / dp_replicate ranks (x cp) and the dp_replicate replicas (outermost inside dp, TorchTitan's mesh)."""
    rep = plan.sharding.dp_replicate
    tp, cp, _, dp, pp = dense_sizes(plan)
    if rep <= 1:
        return grid_placement(cluster, dense_sizes(plan), "dp-cp", plan.rank_order), None
    shard = grid_placement(cluster, (tp, cp, 1, dp // rep, pp * rep), "dp-cp")
    stride = tp * cp * (dp // rep)
    return shard, strided_placement(cluster, stride, rep, stride)


def expert_shard_placements(cluster: ClusterSpec, plan: ParallelPlan
                            ) -> tuple[GroupPlacement, GroupPlacement | None]:
    """(shard group, replicate group or None) of the experts' FSDP sharding: the expert-data-parallel group, or with
    HSDP its edp / dp_replicate ranks and the replicas (TorchTitan shards experts over (dp_replicate,
    dp_shard_mod_ep), the replicate dimension outermost, as for the dense parameters)."""
    rep = plan.sharding.dp_replicate
    if rep <= 1:
        return expert_dp_placement(cluster, plan), None
    etp, _, ep, edp, pp = expert_sizes(plan)
    shard = grid_placement(cluster, (etp, 1, ep, edp // rep, pp * rep), "dp")
    stride = etp * ep * (edp // rep)
    return shard, strided_placement(cluster, stride, rep, stride)


def expert_dp_placement(cluster: ClusterSpec, plan: ParallelPlan) -> GroupPlacement:
    """The expert-data-parallel group (expert gradients and expert optimizer shards)."""
    return grid_placement(cluster, expert_sizes(plan), "dp", plan.rank_order)


def world_placement(cluster: ClusterSpec, plan: ParallelPlan) -> GroupPlacement:
    """Every rank (the gradient-norm all-reduce of the distributed optimizer)."""
    return grid_placement(cluster, dense_sizes(plan), "tp-cp-dp-pp")
