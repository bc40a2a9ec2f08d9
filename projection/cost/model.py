"""`CostModel`: the interface every pricing backend offers (roofline.py, calibrated.py), and the placement of each
parallel group on the cluster that collective ops are priced with.

A cost model answers three questions about the ops of projection/workload/ops.py:
- `op_seconds(op)`: seconds for all `op.count` invocations of a compute, memory-bound or collective op on one rank;
- `collective_seconds(kind, size_bytes, group)`: seconds for one collective (nccl-tests size convention) over a group
  placed as `group` (projection.cost.collectives.GroupPlacement);
- `provenance(op)`: where the number comes from: "roofline", "calibrated: <source>" or
  "calibrated (out of range -> roofline): <source>" (the table the op fell out of).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from projection.cost.collectives import CollectiveKind, GroupPlacement, group_placement
from projection.specs.hardware import ClusterSpec
from projection.specs.plan import ParallelPlan
from projection.workload.ops import Op

DENSE_AXES = ("tp", "cp", "dp", "pp")
EXPERT_AXES = {"ep": "ep", "etp": "tp", "etp_ep": "tp-ep"}  # op group axis -> axes of the expert grid (etp innermost)


class CostModel(Protocol):
    """Prices ops and collectives in seconds. Implementations are immutable and cheap to call repeatedly."""

    def op_seconds(self, op: Op) -> float:
        """Seconds for the op's `count` invocations (collective ops: over the placement of `op.group`)."""
        ...

    def collective_seconds(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> float:
        """Seconds for one collective of `size_bytes` over `group`."""
        ...

    def provenance(self, op: Op) -> str:
        """'roofline', 'calibrated: <source>' or 'calibrated (out of range -> roofline): <source>'."""
        ...

    def collective_provenance(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> str:
        """provenance of one collective of `size_bytes` over `group` (those priced outside an op: DP, FSDP)."""
        ...


def group_placements(cluster: ClusterSpec, plan: ParallelPlan) -> dict[str, GroupPlacement]:
    """Placement of every group axis an op can name, for Megatron's rank order (plan.rank_order: tp-cp-ep-dp-pp, or
    tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping; tp innermost):
    tp, cp, dp, pp on the dense grid (tp x cp x dp x pp); ep and etp on the expert grid (etp x ep x edp x pp,
    Megatron "parallel folding"); with hierarchical context parallelism the cp group's two levels, cp_a2a and
    cp_ring. Raises PlanError when the plan does not fill the cluster."""
    dp, order = plan.dp_(), plan.rank_order
    out = {axis: group_placement(cluster, plan.tp, plan.cp, 1, dp, plan.pp, axis, order) for axis in DENSE_AXES}
    edp = plan.edp()
    for axis, grid_axis in EXPERT_AXES.items():
        out[axis] = group_placement(cluster, plan.etp_, 1, plan.ep, edp, plan.pp, grid_axis, order)
    if plan.cp_levels is not None:  # a2a+p2p's two levels of the cp group
        for level, axis in enumerate(("cp_a2a", "cp_ring")):
            out[axis] = group_placement(cluster, plan.tp, plan.cp, 1, dp, plan.pp, "cp", order,
                                        cp_level=(plan.cp_levels[0], level))
    return out


def op_label(model: CostModel, op: Op) -> str:
    """The cost source of a compute op, or of a collective op the model cannot place (what `projection performance`
    prints as cost sources)."""
    try:
        return model.provenance(op)
    except (KeyError, ValueError):
        return "alpha-beta (analytic)"


def priced_collective(model: CostModel, kind: CollectiveKind, size_bytes: float, group: GroupPlacement,
                      sources: dict[str, float]) -> float:
    """Seconds of one collective priced outside an op (data-parallel buckets, FSDP units), added to `sources` under
    its cost source (what `projection performance` prints as cost sources)."""
    seconds = model.collective_seconds(kind, size_bytes, group)
    label = model.collective_provenance(kind, size_bytes, group)
    sources[label] = sources.get(label, 0.0) + seconds
    return seconds


def collective_op_seconds(model: CostModel, op: Op, groups: Mapping[str, GroupPlacement]) -> float:
    """Seconds of a collective op: `count` times the collective over the placement of its group axis."""
    assert op.kind == "collective" and op.coll is not None and op.group is not None, op
    if op.group not in groups:
        raise KeyError(f"no placement for group axis {op.group!r}: build the cost model with a cluster and a plan "
                       f"(op {op.name})")
    return op.count * model.collective_seconds(op.coll, op.coll_bytes, groups[op.group])
