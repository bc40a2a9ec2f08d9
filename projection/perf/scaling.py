"""Scaling at fixed global batch (strong scaling: the same job, its batch split over more or fewer nodes).

`extrapolate(scenario, nodes)` keeps the model, the batch and tp / cp / pp / ep / etp, and gives the data-parallel
axis the rest of the world: dp = nodes x GPUs per node / (tp x cp x pp), so each DP rank runs fewer microbatches
(global batch / (micro batch x dp)). Under FSDP the replicas grow where the file gives the shard degree (HSDP,
or a replicate degree of 1, which becomes HSDP), the shard group where it leaves it to the world size (TorchTitan's
-1). Every collective is priced from the new cluster by
`project` (projection/perf/placement.py recomputes the placement of each group: DP and FSDP groups that span more
nodes, EP / TP / PP groups that become inter-node), so nothing is carried over from the original cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from projection.cost.model import CostModel
from projection.errors import COMMAND_LINE, ConfigError, PlanError, Problem, count_of
from projection.perf.costmodel import check_arguments
from projection.perf.project import Engine, project
from projection.perf.result import Projection
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import RawScenario, Scenario
from projection.specs.training import TrainingSpec
from projection.specs.validate import layout_problems, torchtitan_ddp_problem, torchtitan_without_fsdp

# the keys of the rules a global batch can break: its split into microbatches and the schedule's microbatch rules
BATCH_KEYS = ("training.global_batch_size", "plan.schedule", "plan.microbatch_group_size", "plan.pipeline_runtime")


def _n(nodes: int) -> str:
    return count_of(nodes, "node")


def _layout(scenario: Scenario, nodes: int) -> tuple[list[Problem], ParallelPlan | None, TrainingSpec]:
    """The plan (None when no dp fits) and training at `nodes` nodes, and what breaks there (canonical keys)."""
    plan, training, cluster = scenario.plan, scenario.training, scenario.cluster
    gbs = training.resolved_global_batch(plan.dp_())
    if scenario.as_loaded is not None:  # a world-size-dependent framework rule is re-applied at the new size,
        loaded_plan, loaded_training = scenario.as_loaded  # unless the plan was edited since it was loaded
        same = loaded_plan.model_copy(update={"dp": plan.dp})
        if torchtitan_without_fsdp(scenario.framework, same, loaded_training) == (plan, training):
            plan, training = loaded_plan, loaded_training
    new_training = training.model_copy(update={"global_batch_size": gbs})
    if nodes < 1:
        return [Problem(f"{_n(nodes)}: give at least one", key="cluster.nodes")], None, new_training
    world = nodes * cluster.gpus_per_node
    mp = plan.tp * plan.cp * plan.pp
    if world % mp:
        return [Problem(f"{_n(nodes)} x {cluster.gpus_per_node} GPUs = {world} is not a multiple of tp * cp * pp = "
                        f"{plan.tp} * {plan.cp} * {plan.pp} = {mp}", key="cluster.nodes")], None, new_training
    asked = plan.model_copy(update={"dp": world // mp})
    rep = plan.sharding.dp_replicate
    if plan.dp is not None and plan.sharding.zero_stage == 3 and \
            "data_parallel_shard_degree" in scenario.origins.get("plan.dp", ""):
        # the shard degree given (HSDP, or FSDP with one replica): TorchTitan derives only a shard degree of -1 from
        # the world size (its ParallelDims asserts replicate x shard x cp x tp x pp = world), so a layout that fixes
        # the shard group (often a node, to keep FSDP's traffic on the intra-node fabric) grows by replicas
        shard = plan.dp // rep
        if (world // mp) % shard:
            return [Problem(f"{_n(nodes)}: dp = {world // mp} is not a multiple of the shard degree {shard} the file "
                            f"gives (HSDP scales by replicas: data_parallel_replicate_degree x {shard})",
                            key="cluster.nodes")], None, new_training
        asked = asked.model_copy(update={"sharding": plan.sharding.model_copy(
            update={"dp_replicate": world // mp // shard})})
    if "torchtitan" in scenario.framework:
        new_training = _torchtitan_local_batch(new_training, plan.pp, gbs, world // mp)
    new_plan, new_training = torchtitan_without_fsdp(scenario.framework, asked, new_training)
    problems = layout_problems(RawScenario(scenario.source, scenario.framework), scenario.model, new_training,
                               new_plan, world)
    ddp = torchtitan_ddp_problem(scenario.framework, asked, new_plan)
    return problems + ([ddp] if ddp is not None else []), new_plan, new_training


def _torchtitan_local_batch(training: TrainingSpec, pp: int, gbs: int, dp: int) -> TrainingSpec:
    """TorchTitan at a fixed global batch on more (or fewer) ranks: each rank's share gbs / dp runs as
    gbs / (local x dp) accumulation steps of `local_batch_size` sequences, and TorchTitan refuses a global batch that
    is not a multiple of local x dp. Where the share is no longer a multiple of the local batch, the local batch
    becomes the largest divisor of the share not above it (a multiple of the pipeline microbatch under PP; without
    PP the microbatch is the local batch), so no rank holds more at once than the file asked for. Unchanged where
    the share is not a whole number of sequences (the layout check says so)."""
    local = training.local_batch_size
    share, rest = divmod(gbs, dp)
    if local is None or rest or share < 1 or share % local == 0:
        return training
    step = training.micro_batch_size if pp > 1 else 1
    fits = [n for n in range(min(local, share), 0, -1) if share % n == 0 and n % step == 0]
    if not fits:
        return training
    if pp > 1:
        return training.model_copy(update={"local_batch_size": fits[0]})
    return training.model_copy(update={"local_batch_size": fits[0], "micro_batch_size": fits[0]})


def nearest_node_counts(scenario: Scenario, nodes: int, window: int = 1024) -> list[int]:
    """The closest node count below `nodes` and the two closest above it that the plan and the global batch admit
    (searched within `window` of `nodes`; fewer when none is found), ascending."""
    below = [n for n in range(nodes - 1, max(0, nodes - window), -1) if not _layout(scenario, n)[0]][:1]
    above: list[int] = []
    for n in range(max(nodes, 0) + 1, max(nodes, 0) + window + 1):
        if len(above) == 2:
            break
        if not _layout(scenario, n)[0]:
            above.append(n)
    return below + above


def node_count_problems(scenario: Scenario, nodes: int, *, flag: str = "nodes") -> list[Problem]:
    """Why the scenario cannot run on `nodes` nodes at its global batch ([] when it can). Each problem is located at
    the scenario's file with `flag` (the argument or command-line flag that gave the count) as its key; the message
    names the count and the canonical key at fault, the fix the nearest node counts that work."""
    problems, plan, _ = _layout(scenario, nodes)
    if not problems:
        return []
    near = nearest_node_counts(scenario, nodes)
    counts = ", ".join(str(n) for n in near[:-1]) + (" or " if len(near) > 1 else "") + (str(near[-1]) if near else "")
    unit = "node" if near == [1] else "nodes"
    hint = (f"use {counts} {unit} (the nearest counts that this plan and global batch admit)" if near else
            "no node count nearby fits this plan: change tp, cp, pp or the global batch")
    out = []
    for p in problems:
        if p.key == "cluster.nodes":  # the message starts with the count
            out.append(Problem(p.message, key=flag, file=scenario.source, fix=hint))
        else:
            where = f"at {_n(nodes)}" + (f" (dp {plan.dp})" if plan is not None else "")
            key = _given_as(scenario, p.key or "")
            fix = f"{hint}; or {p.fix} ({key})" if p.fix else hint
            message = p.message
            if p.key == "training.global_batch_size" and plan is not None:
                step = scenario.training.micro_batch_size * plan.dp_()
                gbs = scenario.training.resolved_global_batch(scenario.plan.dp_())
                share, rest = divmod(gbs, plan.dp_())
                if "torchtitan" in scenario.framework and plan.pp > 1 and not rest and share % (
                        mb := scenario.training.micro_batch_size):  # the local batch would become the share
                    message = (f"each rank's share of the global batch, {gbs} / dp {plan.dp_()} = {share}, is not a "
                               f"multiple of the pipeline microbatch size {mb} (the local batch becomes the share, "
                               "split into pipeline microbatches)")
                    fix = f"{hint}; or a global batch that is a multiple of microbatch size * dp = {step}"
                if "torchtitan" in scenario.framework and plan.pp == 1:
                    step = plan.dp_()  # the local batch shrinks to the rank's share (_torchtitan_local_batch)
                    fix = (f"{hint}; or a global batch that is a multiple of dp = {step} (the local batch becomes "
                           f"each rank's share)")
                fix += f", e.g. --set training.global_batch_size={_working_global_batch(scenario, nodes, gbs, step)}"
                mbs = scenario.training.micro_batch_size
                smaller = [m for m in range(mbs - 1, 0, -1) if gbs % (m * plan.dp_()) == 0
                           and not _layout(_with_micro_batch(scenario, m), nodes)[0]]  # the schedule holds too
                if smaller and "torchtitan" not in scenario.framework:  # keeps the recipe's global batch
                    fix += (f"; or a smaller micro batch that keeps the global batch, e.g. --set "
                            f"training.micro_batch_size={smaller[0]} "
                            f"({_microbatches(gbs // (smaller[0] * plan.dp_()))} per rank)")
            out.append(Problem(f"{where}: {message} [{key}]", key=flag, file=scenario.source, fix=fix))
    return out


def _working_global_batch(scenario: Scenario, nodes: int, gbs: int, step: int) -> int:
    """The smallest multiple of `step` from `gbs` up at which no rule about the batch breaks at `nodes`, nor at the
    scenario's own node count, which the job is scaled from at that batch (the schedule's microbatch rules included;
    other problems are the layout's own), within 64 multiples; else the first multiple."""
    first = -(-gbs // step) * step
    for g in range(first, first + 64 * step, step):
        t = scenario.training.model_copy(update={"global_batch_size": g})
        sc = scenario.model_copy(update={"training": t})
        problems = _layout(sc, nodes)[0] + _layout(sc, scenario.cluster.nodes)[0]
        if not any(p.key in BATCH_KEYS for p in problems):
            return g
    return first


def _with_micro_batch(scenario: Scenario, mbs: int) -> Scenario:
    return scenario.model_copy(update={"training": scenario.training.model_copy(update={"micro_batch_size": mbs})})


def _microbatches(n: int) -> str:
    return f"{n} microbatch" + ("" if n == 1 else "es")


def _given_as(scenario: Scenario, key: str) -> str:
    """The command-line flag that gave canonical `key` (plan.schedule from --schedule), else the key itself."""
    origin = scenario.origins.get(key, "")
    return origin[len(COMMAND_LINE) + 2:-1] if origin.startswith(f"{COMMAND_LINE} (--") else key


def extrapolate(scenario: Scenario, nodes: int, *, flag: str = "nodes") -> Scenario:
    """The scenario on `nodes` nodes at the same global batch. PlanError when the world is not a multiple of
    tp x cp x pp, or the global batch is not a multiple of micro batch x the new dp (or any other layout rule of
    projection.specs.validate breaks); the error is located at the scenario's file with key `flag` (the CLI passes
    '--target-nodes' or '--scaling') and suggests the nearest node counts that work."""
    check_arguments("extrapolate", scenario)
    _check_counts([nodes], flag)
    problems = node_count_problems(scenario, nodes, flag=flag)
    if problems:
        raise PlanError(problems)
    _, new_plan, new_training = _layout(scenario, nodes)
    new_cluster = scenario.cluster.model_copy(update={"nodes": nodes})
    return scenario.model_copy(update={"plan": new_plan, "training": new_training, "cluster": new_cluster})


def scaling_table(scenario: Scenario, node_counts: Iterable[int], cost_model: CostModel | None = None, *,
                  engine: Engine = "des", flag: str = "node_counts") -> list[Projection]:
    """A projection per node count (at fixed global batch), in the order given. cost_model: prices
    compute ops and collectives (its fabric must suit the cluster's nodes: same GPUs per node); default: the shipped
    calibration of each extrapolated scenario. PlanError listing every count that does not fit (key `flag`) before
    anything is projected."""
    check_arguments("scaling_table", scenario, cost_model)
    if not isinstance(node_counts, Iterable) or isinstance(node_counts, str | bytes):
        raise ConfigError(Problem(f"node counts must be a list of whole numbers, got {node_counts!r}", key=flag,
                                  file="<api>", fix="pass e.g. [1, 2, 4, 8]"))
    counts = list(node_counts)
    _check_counts(counts, flag)
    problems = [p for n in counts for p in node_count_problems(scenario, n, flag=flag)]
    if problems:
        raise PlanError(problems)
    return [project(extrapolate(scenario, n, flag=flag), cost_model, engine=engine) for n in counts]


def _check_counts(counts: list[Any], flag: str) -> None:
    """ConfigError naming every count that is not a positive whole number (1.5, '4', True)."""
    bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if bad:
        raise ConfigError(Problem(f"node counts must be positive whole numbers, got {', '.join(map(repr, bad))}",
                                  key=flag, file="<api>", fix="pass whole numbers of at least 1, e.g. [1, 2, 4, 8]"))
