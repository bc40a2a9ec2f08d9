"""Weak scaling at fixed global batch: the same job on more (or fewer) nodes.

`extrapolate(scenario, nodes)` keeps the model, the batch and tp / cp / pp / ep / etp, and gives the data-parallel
axis the rest of the world: dp = nodes x GPUs per node / (tp x cp x pp), so each DP rank runs fewer microbatches
(global batch / (micro batch x dp)). Every collective is priced from the new cluster by `project`
(projection/perf/placement.py recomputes the placement of each group: DP and FSDP groups that span more nodes, EP /
TP / PP groups that become inter-node), so nothing is carried over from the original cluster.
"""

from __future__ import annotations

from collections.abc import Iterable

from projection.cost.model import CostModel
from projection.errors import PlanError, Problem
from projection.perf.project import Engine, project
from projection.perf.result import Projection
from projection.specs.scenario import RawScenario, Scenario
from projection.specs.validate import layout_problems


def extrapolate(scenario: Scenario, nodes: int) -> Scenario:
    """The scenario on `nodes` nodes at the same global batch. PlanError when the world is not a multiple of
    tp x cp x pp, or the global batch is not a multiple of micro batch x the new dp (or any other layout rule of
    projection.specs.validate breaks)."""
    if nodes < 1:
        raise PlanError(Problem(f"nodes = {nodes}", key="cluster.nodes", fix="give at least one node"))
    plan, training, cluster = scenario.plan, scenario.training, scenario.cluster
    gbs = training.resolved_global_batch(plan.dp_())
    world = nodes * cluster.gpus_per_node
    mp = plan.tp * plan.cp * plan.pp
    if world % mp:
        raise PlanError(Problem(f"{nodes} nodes x {cluster.gpus_per_node} GPUs = {world} is not a multiple of tp * cp "
                                f"* pp = {mp}", key="cluster.nodes", fix="choose a node count whose GPUs tp*cp*pp "
                                "divides"))
    dp = world // mp
    new_plan = plan.model_copy(update={"dp": dp})
    new_training = training.model_copy(update={"global_batch_size": gbs})
    problems = layout_problems(RawScenario(scenario.source, scenario.framework), scenario.model, new_training,
                               new_plan, world)
    if problems:
        raise PlanError([Problem(f"at {nodes} nodes (dp {dp}): {p.message}", key=p.key, file=p.file, fix=p.fix)
                         for p in problems])
    new_cluster = cluster.model_copy(update={"nodes": nodes})
    return scenario.model_copy(update={"plan": new_plan, "training": new_training, "cluster": new_cluster})


def scaling_table(scenario: Scenario, node_counts: Iterable[int], cost_model: CostModel | None = None, *,
                  engine: Engine = "des") -> list[Projection]:
    """A projection per node count (weak scaling at fixed global batch), in the order given. cost_model: prices
    compute ops and collectives (its fabric must suit the cluster's nodes: same GPUs per node); default: the shipped
    calibration of each extrapolated scenario."""
    return [project(extrapolate(scenario, n), cost_model, engine=engine) for n in node_counts]
