"""`projection performance`: step time, tokens/s/GPU, model TFLOP/s/GPU and MFU of one training job, with the
breakdown, the critical path and the memory verdict (projection/perf).

    projection performance --config F [--nodes N] [--target-nodes N] [--gpus-per-node G] [--hardware NAME]
                           [--calibration FILE] [--schedule NAME|all] [--set KEY=VALUE ...] [--primus-root DIR]
                           [--format table|json] [--trace out.json] [--pp-vis DIR] [--scaling 1,2,4,...]
                           [--png out.png]

`--target-nodes N` scales the job from the config's own node count (or `--nodes`) to N nodes at a fixed global
batch (strong scaling: data parallelism grows, microbatches per rank shrink; every collective is priced on its new
placement).
`--schedule all` compares every applicable pipeline schedule in one table. `--scaling 1,2,4` projects the job at each
node count (each row the job `--target-nodes` N projects, from the same starting point and global batch) and
prints one row per count; `--png` adds a plot of tokens/s/GPU and MFU against nodes. `--trace` writes the
simulated step as a Chrome trace (Perfetto), `--pp-vis` the simulated pipeline as Primus pp_vis JSON.

Wiring (cli.py): `add_parser(subparsers)` adds the sub-command; `run(args, env)` prints and returns the exit code
(2 with the message on stderr for a user error).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from projection.cli_args import (
    add_pytorch_arg,
    count,
    count_problems,
    input_problems,
    load_scenario,
    output_problems,
    whole_numbers,
)
from projection.cli_perf_outputs import scaling_png, write_all
from projection.errors import COMMAND_LINE, ConfigError, PlanError, Problem, ProjectionError
from projection.fileio import same_file_problems
from projection.paths import is_device_path
from projection.report.perf_tables import (
    chosen_schedule,
    scaling_rows,
    scaling_table,
    schedules_table,
)

if TYPE_CHECKING:
    from projection.perf.result import Projection
    from projection.specs.scenario import Scenario


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `performance` to the top-level sub-parsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "performance", help="step time, tokens/s/GPU, MFU, breakdown and critical path of one training step",
        description="Project the step time of a training job: every op priced by the cost model (a calibration, "
        "else the device roofline), every collective on its group's placement, overlap and the pipeline schedule "
        "simulated. Model TFLOP/s follow Megatron-LM's model-FLOPs formula (recompute not counted); MFU = model "
        "TFLOP/s / the device's dense peak.")
    p.add_argument("--config", required=True, help="Primus YAML, Megatron args/script/MODEL_ARGS YAML, TorchTitan "
                   "TOML, HF config.json or a native scenario YAML (format detected from the file)")
    p.add_argument("--nodes", type=count, help="number of nodes (replaces the config's); with --target-nodes or "
                   "--scaling, the node count the job is scaled from")
    p.add_argument("--target-nodes", type=count, metavar="N",
                   help="scale from the config's own nodes (or --nodes; a file without a node count: the fewest "
                   "nodes its plan holds on) to N nodes at a fixed global batch (strong scaling: dp grows, "
                   "microbatches per rank shrink)")
    p.add_argument("--gpus-per-node", type=count, help="GPUs per node (default: the device's usual count)")
    p.add_argument("--hardware", help="device name from hardware_specs/ (e.g. mi300x, h100-sxm) or a YAML path")
    p.add_argument("--calibration", metavar="FILE", help="a Calibration JSON (projection calibrate ...); default: "
                   "the shipped calibration of the device, else the roofline")
    p.add_argument("--schedule", metavar="NAME|all", help="pipeline schedule (default: the config's), or 'all' to "
                   "compare every applicable schedule")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value, in the config file's own key space (repeatable)")
    p.add_argument("--primus-root", help="a Primus checkout whose primus/configs presets resolve the experiment")
    add_pytorch_arg(p)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--trace", metavar="OUT.json", help="write the simulated step as a Chrome trace (ui.perfetto.dev; "
                   "the chosen schedule's with --schedule all, the last count's with --scaling)")
    p.add_argument("--pp-vis", metavar="DIR", help="write the simulated pipeline as Primus pp_vis JSON to "
                   "DIR/<schedule>/ (every schedule's with --schedule all; the last count's with --scaling)")
    p.add_argument("--scaling", metavar="1,2,4,...", help="project at each node count (fixed global "
                   "batch) and print one row per count")
    p.add_argument("--png", metavar="OUT.png", help="with --scaling: plot tokens/s/GPU and MFU against nodes "
                   "(needs matplotlib)")
    p.add_argument("--engine", choices=("des", "dag"), default=None,
                   help="simulator where no framework runtime is walked: event loop with communication streams "
                   "(default) or the exact dependency walk; Megatron's pipelines, torch's Schedule1F1B and its "
                   "lock-step runtime (--pytorch up to 2.9) are walked as they run, and say so")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Project and print; 0 on success, 2 on a user error (message on stderr, no traceback)."""
    try:
        text = _run(args, env)
    except ProjectionError as err:
        print(f"error: {err.render()}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _run(args: argparse.Namespace, env: Mapping[str, str] | None) -> str:
    counts = _check_args(args)
    scenario, start_note = scenario_at(args, env, counts)
    return _project(args, scenario, counts, start_note, env)


def scenario_at(args: argparse.Namespace, env: Mapping[str, str] | None,
                counts: Sequence[int] = ()) -> tuple[Scenario, str]:
    """The scenario at --target-nodes (strong scaling at fixed global batch from the config's nodes, or --nodes), else
    the starting point of the --scaling `counts`, and a note saying where a file without a node count started (the
    fewest nodes its plan fits, as Primus does); `projection memory --target-nodes` takes it too."""
    from projection.perf import extrapolate

    start_note = ""
    target_nodes = getattr(args, "target_nodes", None)
    flag = "--target-nodes" if target_nodes is not None else "--scaling"
    # every --scaling row is the job --target-nodes N projects: one starting point, whose global batch they keep
    try:
        scenario = _load(args, env, args.nodes)
    except PlanError as err:
        target = target_nodes if target_nodes is not None else max(counts, default=None)
        if target is None:
            raise  # not the starting point's problem: no count fixes it
        try:
            at_target = _load(args, env, target)
        except ProjectionError as at_err:  # the target fails too: its problems, not the start's world size
            raise type(at_err)([replace(q, fix=q.fix.replace("change --nodes/", f"change {flag}/")) if q.fix else q
                                for q in at_err.problems]) from None
        smallest = _smallest_start(args, env, at_target) if args.nodes is None else None
        if smallest is not None:  # the file gives no cluster size: start where the plan first fits, as Primus does
            scenario, start_note = smallest, (f"{flag} scaled from {smallest.cluster.nodes} nodes, the smallest count "
                                              "this plan fits (the config gives no node count)")
        else:
            _raise_at_start(err, args)
    if target_nodes is not None:
        try:
            scenario = extrapolate(scenario, target_nodes, flag="--target-nodes")
        except PlanError:  # with --schedule all the file's schedule need not fit the target
            if getattr(args, "schedule", None) != "all" or scenario.plan.schedule == "gpipe":
                raise
            from projection.perf.project import with_schedule

            scenario = extrapolate(with_schedule(scenario, "gpipe"), target_nodes, flag="--target-nodes")
    return scenario, start_note


def _noted(proj: Projection, note: str, engine: str | None = None) -> Projection:
    """`proj` with the start's note, and where --engine was asked for and a framework runtime walk ran instead,
    a note saying so."""
    notes = [note] if note else []
    if engine is not None and proj.engine.split(":")[0] != engine:
        notes.append(f"--engine {engine} not used: this pipeline runs on its framework's own runtime, walked as it "
                     f"runs (engine {proj.engine}); --engine picks the simulator where no framework runtime applies")
    return dataclasses.replace(proj, notes=(*proj.notes, *notes)) if notes else proj


def _smallest_start(args: argparse.Namespace, env: Mapping[str, str] | None, at_target: Scenario) -> Scenario | None:
    """The config loaded at the smallest node count up to the target's (`at_target`, loaded there) where its plan
    holds, where the config itself gives no node count (then every try is at the file's own count and fails alike);
    None if none. The counts tried are those whose GPUs the model-parallel grid (tp x cp x pp) divides, 64 at most."""
    target = at_target.cluster.nodes
    p, gpn = at_target.plan, at_target.cluster.gpus_per_node
    grid = p.tp * p.cp * p.pp
    counts = [n for n in range(1, target + 1) if n * gpn % grid == 0][:64]
    for nodes in counts:
        try:
            return _load(args, env, None, default_nodes=nodes)
        except ProjectionError:
            continue
    return None


def _raise_at_start(err: PlanError, args: argparse.Namespace) -> None:
    """The starting point's problems, said to be the starting point's, with the way round them."""
    flag = "--target-nodes" if getattr(args, "target_nodes", None) is not None else "--scaling"
    raise PlanError([replace(p, message=f"at the starting point {flag} scales from: {p.message}",
                             fix=f"{p.fix}; or give --nodes N, a node count this plan fits, to start from"
                             if p.fix else "give --nodes N, a node count this plan fits, to start from")
                     for p in err.problems]) from None


def _project(args: argparse.Namespace, scenario: Scenario, counts: list[int], start_note: str,
             env: Mapping[str, str] | None = None) -> str:
    from projection.perf import default_cost_model, extrapolate, project
    from projection.perf.scaling import node_count_problems

    # the files the config itself names (a device YAML, a model file, what it extends) are inputs too
    clash = same_file_problems([("a file --config reads", f) for f in scenario.input_files],
                               [("--png", args.png if args.scaling else None), ("--trace", args.trace)])
    if clash:
        raise ConfigError(clash)
    calibration = Path(args.calibration) if args.calibration else None  # checked by _check_args
    engine: Literal["des", "dag"] = "dag" if args.engine == "dag" else "des"  # where no framework runtime is walked
    schedule = None if args.schedule == "all" else args.schedule
    if counts:  # every count and the schedule at every count checked before anything is projected
        problems = [p for n in counts for p in node_count_problems(scenario, n, flag="--scaling")]
        if problems:
            raise PlanError(problems)
        scaled = [extrapolate(scenario, n, flag="--scaling") for n in counts]
        _check_schedule(scaled, schedule, each_count=True)
        # one cost model per node count: its collectives are priced on that count's placements
        rows = [_noted(project(sc, default_cost_model(sc, calibration=calibration), schedule=schedule, engine=engine),
                       start_note, args.engine) for sc in scaled]
        jobs = [] if not args.png else [("--png", args.png, lambda: scaling_png(rows, args.png, scenario))]
        written = write_all(jobs, rows[-1], args, [rows[-1]])
        if args.format == "json":
            return json.dumps({"scaling": scaling_rows(rows), "projections": [p.to_dict() for p in rows],
                               "wrote": written}, indent=2)
        last = f" (the {rows[-1].scenario.cluster.nodes}-node row)"
        return "\n".join([scaling_table(rows, scenario), *[f"wrote {w}{last if w == args.trace else ''}"
                                                          for w in written]])
    _check_schedule([scenario], schedule)
    cost_model = default_cost_model(scenario, calibration=calibration)
    if args.schedule == "all":
        from projection.perf import compare_schedules

        # a TorchTitan or Primus pipeline: the job loaded again under each of its framework's schedules, as
        # --schedule NAME loads it (perf/search_reload.framework_schedule_runs), the same function as the API's
        def reload(name: str) -> Scenario:
            return scenario_at(argparse.Namespace(**{**vars(args), "schedule": name}), env)[0]
        projs = [_noted(p, start_note, args.engine)
                 for p in compare_schedules(scenario, cost_model, engine=engine, reload=reload)]
        chosen = chosen_schedule(projs)
        written = write_all([], chosen, args, projs)
        if args.format == "json":
            return json.dumps({"schedules": [p.to_dict() for p in projs],
                               "chosen": chosen.schedule if chosen else None, "wrote": written}, indent=2)
        return "\n".join([schedules_table(projs, scenario), *[f"wrote {w}" for w in written]])
    proj = _noted(project(scenario, cost_model, schedule=schedule, engine=engine), start_note, args.engine)
    written = write_all([], proj, args, [proj])
    if args.format == "json":
        doc = proj.to_dict()
        doc["wrote"] = written
        return json.dumps(doc, indent=2)
    return "\n".join([proj.to_table(), *[f"wrote {w}" for w in written]])


def _load(args: argparse.Namespace, env: Mapping[str, str] | None, nodes: int | None,
          default_nodes: int = 1) -> Scenario:
    """The scenario, with --schedule NAME in place of the file's schedule before the plan is checked (a name that
    does not fit is refused with the schedules that do). With --schedule all the file's own schedule need not fit
    the plan: when only the plan's check fails (PlanError; a schema error such as an unknown name is still reported)
    and the plan passes with gpipe (any pp, vpp and microbatch count), every applicable schedule is compared."""
    name = getattr(args, "schedule", None)

    def load(schedule: str | None) -> Scenario:
        return load_scenario(args, env, nodes=nodes, default_nodes=default_nodes, schedule=schedule)
    try:
        return load(None if name == "all" else name)
    except PlanError as err:
        if name is None:
            raise
        fallback = _loads_or_none(load, "gpipe") if name == "all" else (
            _loads_or_none(load, None) or _loads_or_none(load, "gpipe"))
        if fallback is None:
            raise
        if name == "all":
            return fallback
        from projection.perf.search_reload import own_schedule_names

        own = own_schedule_names(fallback)
        if own is None:
            from projection.perf import applicable_schedules

            ok = ", ".join(applicable_schedules(fallback))
        else:  # the framework sets the stages per rank (or its runtime) by the name: each loaded as --schedule does
            ok = ", ".join(n for n in own if _loads_or_none(load, n) is not None)
        raise PlanError([replace(p, fix=f"use one of {ok}; or --schedule all to compare them") if p.key == "--schedule"
                         else p for p in err.problems]) from None


def _loads_or_none(load: Callable[[str | None], Scenario], schedule: str | None) -> Scenario | None:
    try:
        return load(schedule)
    except ProjectionError:
        return None


def _check_args(args: argparse.Namespace) -> list[int]:
    """Problems with the flags alone (before the config is read): all at once. Returns the --scaling counts."""
    problems = count_problems(args, ("nodes", "target_nodes", "gpus_per_node"))
    if args.png and not args.scaling:
        problems.append(Problem("--png plots a scaling table", key="--png", file=COMMAND_LINE, fix="add --scaling "
                                "1,2,4,... (or drop --png; `projection schedule --png` draws a timeline)"))
    if args.scaling and args.target_nodes is not None:
        problems.append(Problem("--target-nodes and --scaling cannot be combined: each --scaling count is a target",
                                key="--target-nodes", file=COMMAND_LINE,
                                fix="list the node counts in --scaling (with --nodes as the starting point if needed)"))
    if args.scaling and args.schedule == "all":
        problems.append(Problem("--scaling and --schedule all cannot be combined", key="--schedule",
                                file=COMMAND_LINE, fix="compare schedules at one node count, or scale one schedule"))
    from projection.schedule.registry import SCHEDULE_NAMES

    if args.schedule is not None and args.schedule != "all" and args.schedule not in SCHEDULE_NAMES:
        problems.append(Problem(f"unknown schedule {args.schedule!r}", key="--schedule", file=COMMAND_LINE,
                                fix=f"use one of {', '.join(SCHEDULE_NAMES)}, or all to compare the applicable ones"))
    counts: list[int] = []
    if args.scaling is not None:
        counts, bad = whole_numbers(args.scaling, "--scaling", "node counts")
        problems += bad
    outputs = [("--png", args.png if args.scaling else None), ("--trace", args.trace)]
    problems += output_problems(outputs, [("--pp-vis", args.pp_vis)])
    problems += input_problems([("--calibration", args.calibration)])
    hardware = args.hardware if args.hardware and is_device_path(args.hardware) else None  # else a bundled name
    problems += same_file_problems([("--config", args.config), ("--hardware", hardware),
                                    ("--calibration", args.calibration)], outputs)
    if problems:
        raise ConfigError(problems)
    return counts


def _check_schedule(scenarios: Sequence[Scenario], name: str | None, *, each_count: bool = False) -> None:
    """ConfigError when the schedule (--schedule's, else the plan's) does not apply to a scenario's pp, vpp and
    microbatches: located at the config file, key '--schedule' (or 'plan.schedule'), the applicable ones in the fix."""
    from projection.perf import applicable_schedules
    from projection.schedule.registry import (
        SCHEDULE_NAMES,
        TOO_MANY_MICROBATCHES_FIX,
        ScheduleTooLarge,
        build_schedule,
    )
    from projection.specs.accumulation import schedule_microbatches

    problems = []
    for sc in scenarios:
        plan = sc.plan
        chosen = name or plan.schedule
        m = schedule_microbatches(sc)  # one pipeline schedule's (TorchTitan runs one per accumulation step)
        try:
            if chosen not in SCHEDULE_NAMES:
                raise ValueError(f"unknown schedule {chosen!r}")
            build_schedule(plan.runs_as(chosen), plan.pp, m, plan.vpp_,
                           microbatch_group_size=plan.microbatch_group_size, style=plan.schedule_style)
        except ScheduleTooLarge as e:
            problems.append(Problem(str(e), key="training.global_batch_size", file=sc.source,
                                    fix=TOO_MANY_MICROBATCHES_FIX))
        except ValueError as e:
            at = f"at {sc.cluster.nodes} nodes ({m} microbatches): " if each_count else ""
            ok = applicable_schedules(sc)
            fix = (f"use one that applies to pp {plan.pp}, vpp {plan.vpp_} and {m} microbatches: {', '.join(ok)}"
                   if ok else f"no schedule applies to pp {plan.pp}, vpp {plan.vpp_} and {m} microbatches")
            problems.append(Problem(at + str(e), key="--schedule" if name else "plan.schedule", file=sc.source,
                                    fix=fix + ("; or --schedule all to compare them" if ok and not each_count else "")))
    if problems:
        raise ConfigError(problems)
