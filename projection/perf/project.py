"""`project`: the projected training step of a scenario (step time, tokens/s/GPU, MFU, breakdown, memory verdict),
and `compare_schedules` over every schedule the plan's pp / vpp / microbatches admit.

Flow: price the stages (pricing.py) -> build the schedule -> data-parallel tasks (dp.py) -> simulate (the event loop
by default: compute and comm streams, transfers queued on the sender's NIC when any traffic crosses nodes, else on
the rank pair) -> optimizer step (optimizer.py) and exposed parameter all-gather -> Projection (result.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from projection.cost.model import CostModel
from projection.cost.roofline import peak_dtype
from projection.errors import ConfigError, PlanError, Problem
from projection.memory.report import MemoryReport
from projection.perf.calibration_notes import calibration_notes
from projection.perf.costmodel import check_arguments, default_cost_model, nic_gpus
from projection.perf.dp import DPComm, dp_comm_tasks, param_gather_exposed_s
from projection.perf.optimizer import optimizer_step_seconds
from projection.perf.pricing import PricedStages, price_stages
from projection.perf.result import BREAKDOWN_KEYS, COMM_GROUPS, Projection, category_key
from projection.perf.rounds import repeat
from projection.schedule.action import Schedule
from projection.schedule.registry import (
    SCHEDULE_NAMES,
    TOO_MANY_MICROBATCHES_FIX,
    TORCH_SCHEDULES,
    ScheduleTooLarge,
    build_schedule,
)
from projection.schedule.timesteps import lockstep_steps
from projection.sim.api import simulate
from projection.sim.des import Links
from projection.sim.lockstep import lockstep_walk
from projection.sim.p2p_walk import megatron_walk, torch_1f1b_walk
from projection.sim.result import SimResult, uncovered_length, union_intervals
from projection.specs.accumulation import one_round, rounds, schedule_microbatches
from projection.specs.plan import MEGATRON_SCHEDULES, ScheduleName
from projection.specs.scenario import Scenario
from projection.specs.validate import FP8_WITHOUT_AMP, torchtitan_fp8_without_amp
from projection.workload.model_flops import model_flops_per_step

Engine = Literal["des", "dag"]


def with_schedule(scenario: Scenario, schedule: str) -> Scenario:
    """The scenario with another pipeline schedule (same pp, vpp, microbatches)."""
    if schedule not in SCHEDULE_NAMES:
        raise ConfigError(Problem(f"unknown schedule {schedule!r}", key="plan.schedule",
                                  fix=f"use one of {', '.join(SCHEDULE_NAMES)}"))
    name: ScheduleName = scenario.plan.runs_as(schedule)  # type: ignore[assignment]
    return scenario.model_copy(update={"plan": scenario.plan.model_copy(update={"schedule": name})})


def build_plan_schedule(scenario: Scenario) -> Schedule:
    """The plan's schedule for its pp, vpp and microbatches per DP rank; ConfigError when it does not apply."""
    p = scenario.plan
    m = schedule_microbatches(scenario)
    try:
        return build_schedule(p.schedule, p.pp, m, p.vpp_, microbatch_group_size=p.microbatch_group_size,
                              combined_1f1b=p.megatron_combined_1f1b,
                              style=p.schedule_style)
    except ScheduleTooLarge as e:
        raise ConfigError(Problem(str(e), key="training.global_batch_size", file=scenario.source,
                                  fix=TOO_MANY_MICROBATCHES_FIX)) from e
    except ValueError as e:
        raise ConfigError(Problem(str(e), key="plan.schedule", fix="pick a schedule that accepts this pp, vpp and "
                                  f"number of microbatches ({m})")) from e


def project(scenario: Scenario, cost_model: CostModel | None = None, *, schedule: str | None = None,
            engine: Engine = "des") -> Projection:
    """Project one training step of `scenario` (its plan's schedule, or `schedule`: one the plan runs at its pp, vpp
    and microbatches; a TorchTitan or Primus pipeline, whose framework loads each schedule its own way, is loaded
    with api.load(..., schedule=NAME) instead, and another name is refused). cost_model: default
    `default_cost_model(scenario)` (shipped calibration over the roofline). engine: "des" (event loop, shared
    links) or "dag" (exact walk, p2p as latency)."""
    from projection.perf.search_reload import schedule_problem

    check_arguments("project", scenario, cost_model)
    problem = schedule_problem(scenario, schedule) if schedule is not None else None
    if problem is not None:
        raise ConfigError(problem)
    sc = with_schedule(scenario, schedule) if schedule is not None else scenario
    cm = cost_model if cost_model is not None else default_cost_model(sc)
    n = rounds(sc)
    if n > 1:  # TorchTitan: one pipeline schedule per gradient-accumulation step (perf/rounds.py)
        return repeat(project(one_round(sc), cm, engine=engine), sc, n)
    sched = build_plan_schedule(sc)
    priced = price_stages(sc, cm)
    dp = dp_comm_tasks(sc, cm, sched, priced)
    crosses = dp.crosses_nodes or any(p.n_nodes > 1 for p in priced.p2p_placements)
    links: Links = "none" if engine == "dag" else ("nic" if crosses else "pair")
    try:
        steps = lockstep_steps(sched.name, sc.plan.pp, sched.n_microbatches, sc.plan.vpp_) \
            if sc.plan.lockstep_pipeline else None
        if steps is not None:
            sim = lockstep_walk(sched, priced.stage_costs(sched, dp.tasks), steps)
        elif sc.plan.megatron_pipeline:
            sim = megatron_walk(sched, priced.stage_costs(sched, dp.tasks), overlap=sc.plan.megatron_p2p_overlap)
        elif sc.plan.torch_1f1b_pipeline:
            sim = torch_1f1b_walk(sched, priced.stage_costs(sched, dp.tasks))
        else:
            sim = simulate(sched, priced.stage_costs(sched, dp.tasks), engine=engine, links=links)
    except ValueError as e:
        if "must be finite" not in str(e):
            raise
        raise _not_finite(sc, str(e)) from None
    opt_sources: dict[str, float] = {}
    opt = optimizer_step_seconds(sc, cm, opt_sources)
    pg = param_gather_exposed_s(dp, priced, sched, sim)
    tails = [o + g for o, g in zip(_per_schedule_rank(opt, sched), pg, strict=True)]
    step = sim.step_time_s + max(tails, default=0.0)
    if not math.isfinite(step):
        raise _not_finite(sc, f"the step takes {step} s")
    notes = _unmodelled(sc) + calibration_notes(sc, cm, {*priced.provenance, *dp.provenance, *opt_sources})
    memory = _memory(sc, notes)
    return _assemble(sc, sched, engine, priced, dp, sim, step, tails, opt, pg, memory, notes, opt_sources)


def _critical_path(sim: SimResult, tails: Sequence[float], pg: Sequence[float]) -> tuple[str, ...]:
    """The simulation's compute actions on its longest path, then what ends the step after them: a communication
    task that outlasts every compute action (the gradient reduction after the last backward), and the slowest
    rank's optimizer step and exposed parameter all-gather (an audit found the step's last 0.13 s unnamed)."""
    path = tuple(str(a) for a in sim.critical_path)
    comm = sim.run.comm
    if comm and max(c[3] for c in comm) > max(sim.run.end, default=0.0):
        rank, name = max(comm, key=lambda c: c[3])[:2]
        path += (f"{name} on rank {rank}",)
    t = max(range(len(tails)), key=lambda r: tails[r], default=-1)
    if t >= 0 and tails[t] > 0:
        path += (("optimizer",) if tails[t] > pg[t] else ()) + (("param all-gather (exposed)",) if pg[t] > 0 else ())
    return path


def _not_finite(sc: Scenario, what: str) -> ConfigError:
    """Seconds that overflow come from a device or calibration value out of any physical range (a time of 1e300 s,
    a rate of 1e-300 B/s): a user error in those files, not a result."""
    return ConfigError(Problem(
        f"the projection's seconds are not finite ({what}): a time or rate of the device "
        f"{sc.cluster.device.name!r} or of the calibration is out of range", key="cluster.hardware",
        file=sc.origins.get("cluster.hardware", sc.source),
        fix="check the device YAML's and the calibration's times and rates (seconds, bytes/s, FLOP/s) for values "
            "far outside what hardware does"))


def compare_schedules(scenario: Scenario, cost_model: CostModel | None = None, *, engine: Engine = "des",
                      reload: Callable[[str], Scenario] | None = None) -> list[Projection]:
    """A projection per schedule applicable to the plan's pp, vpp and microbatches (interleaved_1f1b only with
    vpp > 1), fastest first; each carries its memory verdict (`.memory.verdict`). A TorchTitan or Primus pipeline
    is loaded again for each of its framework's schedules, as `projection performance --schedule all` does:
    `reload(name)` loads it (`api.reloader(path, <sc's load arguments>).schedule`), those the framework refuses are
    left out (search_reload.framework_schedule_runs). cost_model: default, each job's `default_cost_model`."""
    from projection.perf.search_reload import framework_schedule_runs

    check_arguments("compare_schedules", scenario, cost_model)
    runs = framework_schedule_runs(scenario, reload)
    if runs is None:
        out = [project(scenario, cost_model, schedule=name, engine=engine) for name in applicable_schedules(scenario)]
    else:
        out = [project(sc, cost_model, engine=engine) for sc in runs]
    return sorted(out, key=lambda p: p.step_time_s)


def applicable_schedules(scenario: Scenario) -> list[str]:
    p = scenario.plan
    if p.pp == 1:
        return [p.runs_as(p.schedule)]  # no pipeline, no schedule to choose
    m = schedule_microbatches(scenario)
    names = []
    for name in SCHEDULE_NAMES:
        if name == "interleaved_1f1b" and p.vpp_ == 1:
            continue
        if p.schedule_style == "torch" and name not in TORCH_SCHEDULES:
            continue  # torch.distributed.pipelining has no such schedule
        if p.pipeline_runtime == "megatron" and name not in MEGATRON_SCHEDULES:
            continue  # Megatron-LM's schedules.py has no such schedule (specs/validate_schedule.py)
        try:
            build_schedule(name, p.pp, m, p.vpp_, microbatch_group_size=p.microbatch_group_size,
                           style=p.schedule_style)
        except ValueError:
            continue
        names.append(name)
    return names


def _per_schedule_rank(values: Sequence[float], sched: Schedule) -> list[float]:
    return [values[r] if r < len(values) else 0.0 for r in range(sched.n_ranks)]


def _unmodelled(sc: Scenario) -> list[str]:
    """What the configuration runs that the model prices as something else (said in the projection's notes)."""
    notes = []
    k, plan = sc.training.kernels, sc.plan
    if sc.cluster.oversubscription != 1.0 and sc.cluster.inter_node_topology == "rail_optimized":
        # cost/collectives.Fabric.nic_bandwidth: only cross-rail traffic crosses the upper tier there
        notes.append(f"oversubscription {sc.cluster.oversubscription:g} on a rail-optimised fabric slows only "
                     "traffic between rails (GPUs of different local ranks); same-rail collectives, the data-parallel "
                     "ones among them, are priced as if each rail's switch reached every node (a rail's own upper "
                     "tier, past one switch's ports, is not modelled; --set cluster.inter_node_topology=fat_tree "
                     "applies it to all inter-node traffic)")
    if sc.model.moe is not None:
        # every MoE run with a published measurement is projected fast: the strict xfails of
        # tests/oracle/test_performance_bridge_public.py and test_performance_amd_public.py hold the figures
        notes.append("MoE: projections of published MoE runs have all been fast, the finer the experts the more "
                     "(docs/performance.md): the dispatcher path's host work and the efficiency of small grouped "
                     "GEMMs are not measured here; read the step time as a lower bound")
    dev, gpn = sc.cluster.device, sc.cluster.gpus_per_node
    if gpn != dev.gpus_per_node and nic_gpus(sc) is None:  # perf/costmodel.py, Fabric.from_specs
        notes.append(f"{gpn} GPUs per node, where a {dev.name} node has {dev.gpus_per_node}: each GPU keeps that "
                     f"node's NIC share ({dev.nic.count_per_node} NICs for {dev.gpus_per_node} GPUs); --set "
                     "cluster.device.nic.count_per_node=N states the NICs of your node")
    if sc.model.moe is not None and plan.ep * plan.etp_ > 1 and k.moe_token_dispatcher == "flex":
        notes.append("MoE token dispatcher 'flex' (DeepEP / HybridEP kernels) priced as the NCCL all-to-all "
                     "dispatcher: the same bytes, not the same kernels")
    if k.cuda_graph_impl != "none":
        scope = ", ".join(k.cuda_graph_scope) or "whole layers"
        notes.append(f"CUDA graphs ({k.cuda_graph_impl}, {scope}) not modelled: every kernel keeps its eager host "
                     "launch, so where the host bounds the step (small layers or microbatches) the graphed run is "
                     "faster than projected; the graphs' static buffers and memory pools are not in the memory "
                     "estimate")
    if k.unmodelled:
        notes.append("not modelled, priced as without them: " + "; ".join(k.unmodelled))
    off = plan.offload
    if off.optimizer and off.optimizer_fraction > 0:
        notes.append(f"optimizer offload: the host's optimizer step over {off.optimizer_fraction:.0%} of the state is "
                     "not priced, only its gradient and parameter copies over the host link")
    if off.fsdp_params:
        notes.append("FSDP CPU offload: the host's optimizer step is not priced, only the shards' copies over the "
                     "host link beside each all-gather and reduce-scatter")
    if sc.training.optimizer.name == "muon":
        # Muon orthogonalises each weight matrix's update with Newton-Schulz iterations (Jordan et al. 2024: 5
        # iterations of A = X X^T, B = bA + cA^2, X = aX + BX, about 5 (4 m^2 n + 2 m^3) FLOPs for an m x n matrix)
        notes.append("Muon: the Newton-Schulz orthogonalisation of each weight matrix (about 5 x (4 m^2 n + 2 m^3) "
                     "FLOPs for an m x n matrix, m <= n) is not priced; the optimizer step is priced as its "
                     "elementwise update with one moment")
    if torchtitan_fp8_without_amp(sc.framework, plan, sc.training):
        notes.append(FP8_WITHOUT_AMP)
    elif "torchtitan" in sc.framework and plan.sharding.zero_stage == 0:  # specs/validate.torchtitan_without_fsdp
        notes.append("TorchTitan applies no FSDP at dp_shard x cp = 1"
                     + (", and under TP or PP no mixed precision: the job is priced in fp32"
                        if sc.training.params_dtype == "fp32" else ""))
    if k.compiled:
        notes.append("torch.compile: memory follows the compiled blocks' saved tensors, and each norm, RoPE and "
                     "activation is priced as one fused kernel a direction (uncompiled, TorchTitan's blocks run them "
                     "aten call by call: projection/workload/ops_eager.py); a compiled loss is priced as a fused one")
    if (off.activation_modules or off.activation_layers or off.optimizer or off.fsdp_params) \
            and not sc.cluster.device.host_link_bytes_per_s:
        notes.append(f"offload copies not priced: device '{sc.cluster.device.name}' has no host_link_bytes_per_s")
    return notes


def _memory(sc: Scenario, notes: list[str]) -> MemoryReport | None:
    from projection.memory.estimate import estimate_memory

    try:
        report = estimate_memory(sc)
    except PlanError as e:
        notes.append(f"memory not estimated: {e.problems[0].message}")
        return None
    notes += [n for n in report.notes if n not in notes]  # what the memory verdict leaves out, said here too
    return report


def _peak(sc: Scenario) -> tuple[str, float]:
    """The peak MFU is quoted against: the one the compute dtype's GEMMs are priced at (cost/roofline.peak_dtype)."""
    device = sc.cluster.device
    dtype = peak_dtype(device, "fp8" if sc.training.fp8 is not None else sc.training.params_dtype)
    return dtype, {str(k): v for k, v in device.peak_flop_per_s.items()}[dtype]


def _assemble(sc: Scenario, sched: Schedule, engine: str, priced: PricedStages, dp: DPComm, sim: SimResult,
              step: float, tails: list[float], opt: Sequence[float], pg: Sequence[float],
              memory: MemoryReport | None, notes: list[str], opt_sources: Mapping[str, float]) -> Projection:
    plan, training = sc.plan, sc.training
    world = sc.world_size
    m = training.num_microbatches(plan.dp_())
    tokens = training.resolved_global_batch(plan.dp_()) * training.seq_length
    mflops = model_flops_per_step(sc.model, training, plan)
    hflops = mflops + sum(s.recompute_flop for s in priced.stages) * m * world / plan.pp
    dtype, peak = _peak(sc)
    busiest = max(range(sched.n_ranks), key=lambda r: (sim.busy_s[r], r))
    breakdown, comm_total = _breakdown(priced, dp, sched, sim, busiest)
    breakdown["optimizer"] = opt[busiest] if busiest < len(opt) else 0.0
    breakdown["comm.dp"] += pg[busiest]
    breakdown["bubble"] += max(tails, default=0.0) - tails[busiest]
    path = _critical_path(sim, tails, pg)
    # the stages' ops and p2p once per microbatch, the data-parallel buckets and the optimizer step once per step
    # (all over every pp rank); the host's issue time is no cost model's and not among them
    seconds = {k: v * m for k, v in priced.provenance.items()}
    for k, v in (*dp.provenance.items(), *opt_sources.items()):
        seconds[k] = seconds.get(k, 0.0) + v
    total_prov = sum(seconds.values()) or 1.0
    prov = {k: v / total_prov for k, v in seconds.items()}
    return Projection(
        scenario=sc, schedule=plan.schedule, engine=sim.engine, step_time_s=step,
        tokens_per_s_per_gpu=tokens / step / world if step > 0 else 0.0,
        model_flops_per_step=mflops, model_tflops_per_gpu=mflops / step / world / 1e12 if step > 0 else 0.0,
        mfu=mflops / (step * world * peak) if step > 0 else 0.0, hardware_flops_per_step=hflops,
        hardware_tflops_per_gpu=hflops / step / world / 1e12 if step > 0 else 0.0,
        hfu=hflops / (step * world * peak) if step > 0 else 0.0, peak_flop_per_s=peak, peak_dtype=dtype,
        world_size=world, n_microbatches=m, breakdown_s=breakdown, breakdown_rank=busiest, comm_total_s=comm_total,
        critical_path=path, sim=sim, memory=memory, provenance=prov, optimizer_s=tuple(opt),
        param_gather_exposed_s=tuple(pg), priced=priced, dp=dp, notes=tuple(notes))


def _breakdown(priced: PricedStages, dp: DPComm, sched: Schedule, sim: SimResult,
               rank: int) -> tuple[dict[str, float], dict[str, float]]:
    """Per-category seconds of `rank`'s simulated step (compute stream, exposed p2p and comm tasks, bubble) and
    its full communication time per group."""
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    comm = dict.fromkeys((*COMM_GROUPS, "offload"), 0.0)
    for a in sched.actions[rank]:
        if a.kind not in ("F", "B", "I", "W"):
            continue
        t = priced.action_time(sched.model_stage(a.stage), a.kind)
        for k, v in t.by_category.items():
            key = category_key(k)
            if key is not None:
                out[key] += v
        for k, v in t.comm_s.items():
            if k in comm:
                comm[k] += v
    busy = sum(out.values())
    assert abs(busy - sim.busy_s[rank]) <= 1e-6 * max(busy, 1e-3), (busy, sim.busy_s[rank])
    compute: list[tuple[float, float]] = []
    p2p: list[tuple[float, float]] = []
    tasks: list[tuple[float, float]] = []
    for e in sim.timeline[rank]:
        (compute if e.stream == "compute" else p2p if e.stream == "p2p" else tasks).append((e.start_s, e.end_s))
    pp_exposed = _uncovered(union_intervals(p2p), compute)
    all_exposed = _uncovered(union_intervals(p2p + tasks), compute)
    out["comm.pp"] = pp_exposed
    out["comm.dp"] += max(0.0, all_exposed - pp_exposed)
    # idle time of the compute stream that no exposed communication explains; busy and exposed time are disjoint
    # parts of the step, so a negative remainder would be a double count, not rounding
    idle = sim.step_time_s - sim.busy_s[rank] - all_exposed
    assert idle >= -1e-9 * max(sim.step_time_s, 1e-3), (rank, sim.step_time_s, sim.busy_s[rank], all_exposed)
    out["bubble"] = max(0.0, idle)
    comm["pp"] = float(sum(e - s for s, e in p2p))  # 0.0, not the int 0, without a pipeline
    comm["dp"] += dp.grad_s[rank] + dp.param_gather_s[rank]
    return out, comm


def _uncovered(iv: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Length of the disjoint sorted intervals `iv` outside the union of `cover`."""
    return uncovered_length(iv, union_intervals(cover))
