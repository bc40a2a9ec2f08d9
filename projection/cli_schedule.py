"""`projection schedule`: simulate a pipeline schedule with uniform per-rank costs (quick what-ifs).

    projection schedule --pp 8 --vpp 2 --microbatches 32 --schedule interleaved_1f1b \\
        --fwd-s 0.06 --bwd-s 0.12 --p2p-s 1ms --trace out.json --png out.png
    projection schedule --csv my_schedule.csv --fwd-s 0.06 --bwd-s 0.12 --format json

Times are seconds per microbatch for one rank's share of the model (a number, or "60ms", "1.5s"); a rank holding
several virtual stages splits them evenly. `--csv` loads a custom schedule in torch.distributed.pipelining CSV
notation instead of building one by name. Prints the step time, bubble ratio and per-rank busy / bubble / exposed
communication; the closed form next to it when one exists. Wiring (cli.py): `add_parser(subparsers)`, then
`run(args)` returns the exit code (2 on a user error, message on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from projection.cli_args import input_problems, output_problems, write_outputs
from projection.errors import COMMAND_LINE, ConfigError, Problem, ProjectionError
from projection.fileio import protect_jobs, same_file_problems
from projection.schedule.action import Schedule
from projection.schedule.checks import check_schedule
from projection.schedule.csv import load_csv
from projection.schedule.registry import SCHEDULE_NAMES, build_schedule
from projection.sim import closed_form
from projection.sim.api import rank_costs, simulate
from projection.sim.result import SimResult
from projection.units import parse_duration

PNG_MAX_ACTIONS = 300_000  # --png: about 10 s of drawing (1F1B at pp 100 x 500 microbatches, 100,000 actions: 3 s)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `schedule` to the top-level sub-parsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "schedule", help="simulate a pipeline schedule: step time, bubble, per-rank timeline",
        description="Simulate a pipeline schedule with uniform per-rank costs (seconds per microbatch).")
    p.add_argument("--schedule", choices=SCHEDULE_NAMES, help="built-in schedule (or give --csv)")
    p.add_argument("--csv", metavar="FILE", help="custom schedule in torch.distributed.pipelining CSV notation")
    p.add_argument("--pp", type=int, help="pipeline ranks")
    p.add_argument("--vpp", type=int, default=1, help="virtual stages per rank (2 for zbv, v_half, v_min, dualpipev)")
    p.add_argument("--microbatches", type=int, help="microbatches per step")
    p.add_argument("--microbatch-group-size", type=int, help="interleaved_1f1b: Megatron's group size (default pp)")
    p.add_argument("--fwd-s", default="1.0", help="forward seconds per microbatch per rank (default 1.0)")
    p.add_argument("--bwd-s", default="2.0", help="full backward seconds per microbatch per rank (default 2.0)")
    p.add_argument("--w-s", help="weight-gradient part of the backward (default half of --bwd-s)")
    p.add_argument("--p2p-s", default="0", help="p2p seconds per stage boundary (default 0)")
    p.add_argument("--engine", choices=("dag", "des", "megatron"), default="dag",
                   help="exact walk (default), event loop, or Megatron-LM's blocking p2p (1f1b, interleaved_1f1b)")
    p.add_argument("--links", choices=("none", "pair", "nic"), default="none",
                   help="event loop: transfers share a link per rank pair or per sending NIC")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace (open in ui.perfetto.dev)")
    p.add_argument("--png", metavar="OUT.png", help="write a timeline picture (needs matplotlib)")
    p.add_argument("--pp-vis", metavar="DIR", help="write Primus pp_vis JSON to DIR/<schedule>/")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return p


MAX_ACTION_S = 3600.0  # an hour per forward or backward of one microbatch on one rank: far past any real job


def _seconds(value: str | None, flag: str) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as e:
        raise ConfigError(Problem(str(e), key=flag, file=COMMAND_LINE, fix="give seconds, e.g. 0.06 or 60ms")) from e
    if not seconds <= MAX_ACTION_S:  # 1e308 s per action summed over a pipeline overflows to inf
        raise ConfigError(Problem(f"{value} is more than the {MAX_ACTION_S:.0f} s one action may take", key=flag,
                                  file=COMMAND_LINE, fix="give seconds per microbatch per rank, e.g. 0.06 or 60ms"))
    return seconds


def _schedule(args: argparse.Namespace) -> Schedule:
    if args.csv is not None:  # an empty path too: it would otherwise run a built-in schedule without a word
        conflicts = input_problems([("--csv", args.csv)], missing_ok=True) + _csv_conflicts(args)
        if conflicts:
            raise ConfigError(conflicts)
        try:
            sched = load_csv(args.csv)
        except (OSError, ValueError) as e:
            raise ConfigError(Problem(f"cannot load the schedule: {e}", file=args.csv, key="--csv",
                                      fix="one row per rank of actions like 0F0,0I0,0W0")) from e
        problems = check_schedule(sched)
        if problems:
            raise ConfigError([Problem(p, file=args.csv, key="--csv", fix="fix the per-rank action lists")
                               for p in problems[:10]])
        return sched
    missing = [f for f, v in (("--schedule", args.schedule), ("--pp", args.pp), ("--microbatches",
                                                                                  args.microbatches)) if v is None]
    bad = [Problem(f"missing {', '.join(missing)}", key=missing[0], file=COMMAND_LINE,
                   fix="give --schedule NAME --pp P --microbatches M (or --csv FILE)")] if missing else []
    bad += [Problem(f"must be a positive whole number (got {v})", key=flag, file=COMMAND_LINE,
                    fix="give a whole number of at least 1")
            for flag, v in (("--pp", args.pp), ("--microbatches", args.microbatches), ("--vpp", args.vpp),
                            ("--microbatch-group-size", args.microbatch_group_size)) if v is not None and v < 1]
    if missing:  # every problem of the flags given, with what is missing (the rest needs a schedule to check)
        raise ConfigError(bad)
    if args.microbatch_group_size is not None and args.schedule != "interleaved_1f1b":
        bad.append(Problem(f"Megatron's microbatch group size applies to interleaved_1f1b only, not to "
                           f"{args.schedule}", key="--microbatch-group-size", file=COMMAND_LINE,
                           fix="drop it, or use --schedule interleaved_1f1b"))
    if bad:
        raise ConfigError(bad)
    try:
        return build_schedule(args.schedule, args.pp, args.microbatches, args.vpp,
                              microbatch_group_size=args.microbatch_group_size)
    except ValueError as e:
        # the registry speaks Megatron's flag; this command's is --microbatch-group-size
        text = str(e).replace("--microbatch-group-size-per-virtual-pipeline-stage", "--microbatch-group-size")
        raise ConfigError(Problem(text, key="--schedule", file=COMMAND_LINE, fix="pick --pp, --vpp and "
                                  "--microbatches that the schedule accepts")) from e


def _spelled(text: str | None, flags: dict[str, str]) -> str | None:
    """`text` with the cost model's argument names written as this command's flags."""
    for name, flag in flags.items():
        text = text.replace(name, flag) if text else text
    return text


def _csv_conflicts(args: argparse.Namespace) -> list[Problem]:
    """Flags that a --csv schedule holds itself (its name, ranks, stages, microbatches): given beside it they would
    be ignored, or, for --schedule, name the file's schedule after a built-in one it need not be."""
    named = [Problem(f"--csv runs the schedule in the file, --schedule builds the built-in {args.schedule}: give one "
                     "of them", key="--schedule", file=COMMAND_LINE,
                     fix="drop --schedule (the CSV's schedule is named after its file), or drop --csv")
             ] if args.schedule is not None else []
    held = [Problem("the CSV schedule holds its own ranks, stages and microbatches", key=flag, file=COMMAND_LINE,
                    fix=f"drop {flag} (or drop --csv and use a built-in --schedule)")
            for flag, v in (("--pp", args.pp), ("--microbatches", args.microbatches),
                            ("--vpp", None if args.vpp == 1 else args.vpp),
                            ("--microbatch-group-size", args.microbatch_group_size)) if v is not None]
    return named + held


def _closed_form(args: argparse.Namespace, sched: Schedule, f: float, b: float, w: float | None,
                 lat: float) -> tuple[float, bool] | None:
    """(closed-form step seconds, whether it is exact here: closed_form.is_exact), or None where the schedule has no
    closed form."""
    name = sched.name
    if args.csv or name not in closed_form.CLOSED_FORMS or (name == "gpipe" and args.vpp != 1):
        return None
    if name == "interleaved_1f1b" and args.microbatch_group_size not in (None, args.pp):
        return None
    per = sched.n_stages / sched.n_ranks
    ww = None if w is None else w / per
    cf = float(closed_form.step_time_s(name, args.pp, args.microbatches, f / per, b / per, vpp=args.vpp, w_s=ww,
                                       p2p_s=lat))
    return cf, closed_form.is_exact(name, args.pp, args.microbatches, f / per, b / per, vpp=args.vpp, p2p_s=lat)


def _table(res: SimResult, cf: tuple[float, bool] | None, written: list[str]) -> str:
    s = res.schedule
    lines = [f"schedule {s.name}  ranks {s.n_ranks}  stages {s.n_stages}  microbatches {s.n_microbatches}  "
             f"engine {res.engine}",
             f"step time     {res.step_time_s:.6g} s",
             f"bubble ratio  {res.bubble_ratio:.2%}"]
    if cf is not None:
        bound = ("the closed forms are the dependency walk's, and Megatron's calls add waits to it"
                 if res.engine == "megatron" else "the interleaved form is exact for m a multiple of pp and p2p <= a "
                 "chunk's f, b")
        lines.append(f"closed form   {cf[0]:.6g} s" + ("" if cf[1] else f"  (a lower bound here: {bound})"))
    lines.append(f"{'rank':>4}  {'busy_s':>12}  {'bubble_s':>12}  {'exposed_comm_s':>14}  {'peak_in_flight':>14}")
    for r in range(res.n_ranks):
        lines.append(f"{r:>4}  {res.busy_s[r]:>12.6g}  {res.bubble_s[r]:>12.6g}  {res.exposed_comm_s[r]:>14.6g}  "
                     f"{res.peak_in_flight[r]:>14}")
    path = [str(a) for a in res.critical_path]
    lines.append("critical path: " + " ".join(path if len(path) <= 24 else [*path[:12], "...", *path[-12:]]))
    lines += [f"wrote {w}" for w in written]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Simulate and print; 0 on success, 2 on a user error."""
    try:
        f, b = _seconds(args.fwd_s, "--fwd-s"), _seconds(args.bwd_s, "--bwd-s")
        w, lat = _seconds(args.w_s, "--w-s"), _seconds(args.p2p_s, "--p2p-s")
        assert f is not None and b is not None and lat is not None
        sched = _schedule(args)
        problems = output_problems([("--trace", args.trace), ("--png", args.png)],
                                   [("--pp-vis", args.pp_vis)])
        problems += same_file_problems([("--csv", args.csv)], _output_files(args, sched))
        n_actions = sum(len(t) for t in sched.actions)
        if args.png and n_actions > PNG_MAX_ACTIONS:  # matplotlib draws ~30 us a bar: a minute at a million
            problems.append(Problem(f"a timeline of {n_actions:,} actions is too many to draw (at most "
                                    f"{PNG_MAX_ACTIONS:,}: a picture of {sched.n_ranks:,} ranks is a few pixels a "
                                    "bar, drawn in minutes)", key="--png", file=COMMAND_LINE,
                                    fix="drop --png and write --trace (Perfetto zooms into any size), or draw "
                                    "fewer ranks or microbatches"))
        if problems:  # before any work, and before anything is written
            raise ConfigError(problems)
        if args.links != "none" and args.engine != "des":
            raise ConfigError(Problem(f"--links {args.links} models shared links in the event loop only",
                                      key="--links", file=COMMAND_LINE, fix="add --engine des, or drop --links"))
        if args.engine == "megatron" and (args.csv or sched.name not in ("1f1b", "interleaved_1f1b")):
            raise ConfigError(Problem(f"--engine megatron walks Megatron-LM's 1F1B and interleaved 1F1B, not "
                                      f"{'a CSV schedule' if args.csv else sched.name}", key="--engine",
                                      file=COMMAND_LINE, fix="use --schedule 1f1b or interleaved_1f1b, or "
                                      "--engine dag"))
        if args.engine == "megatron" and sched.n_ranks == 2 and sched.n_stages > 2:
            raise ConfigError(Problem("--engine megatron runs Megatron's blocking calls, and Megatron's interleaved "
                                      "schedule at pp 2 needs overlapped p2p (Megatron-LM refuses it without)",
                                      key="--pp", file=COMMAND_LINE, fix="use --pp 3 or more, --vpp 1, or --engine "
                                      "dag (overlapped p2p is close to the dependency walk)"))
        try:
            costs = rank_costs(sched, f, b, w, lat)
        except ConfigError as e:  # the costs' own keys are this command's flags
            flags = {"w_s": "--w-s", "bwd_s": "--bwd-s", "fwd_s": "--fwd-s", "p2p_s": "--p2p-s"}
            raise ConfigError([replace(p, key=flags.get(p.key or "", p.key), file=COMMAND_LINE,
                                       fix=_spelled(p.fix, flags)) for p in e.problems]) from None
        res = simulate(sched, costs, engine=args.engine, links=args.links)
        cf = _closed_form(args, sched, f, b, w, lat)
        if cf is not None and args.engine == "megatron" and not math.isclose(cf[0], res.step_time_s, rel_tol=1e-9):
            cf = (cf[0], False)  # the closed forms are the dependency walk's; Megatron's calls only add waits
        written = _write_outputs(args, res)
    except ProjectionError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    if args.format == "json":
        d = res.to_dict()
        d["closed_form_step_time_s"] = None if cf is None else cf[0]
        d["closed_form_exact"] = None if cf is None else cf[1]
        d["wrote"] = written
        print(json.dumps(d, indent=2))
    else:
        print(_table(res, cf, written))
    return 0


def _output_files(args: argparse.Namespace, sched: Schedule) -> list[tuple[str, str | None]]:
    """(flag, path) of every file the outputs asked for write: --pp-vis writes config.json and a file per rank."""
    vis = [] if not args.pp_vis else [Path(args.pp_vis) / sched.name / name for name in
                                      ["config.json", *(f"pp_rank_{r}.json" for r in range(sched.n_ranks))]]
    return [("--trace", args.trace), ("--png", args.png), *(("--pp-vis", str(f)) for f in vis)]


def _write_outputs(args: argparse.Namespace, res: SimResult) -> list[str]:
    """Every output asked for, or none of them (write_outputs removes what it wrote when a later one fails; the
    output journal (fileio.protect) what they wrote when the command fails after them, its report included)."""
    jobs: list[tuple[str, str, Callable[[], object]]] = []
    if args.trace:
        from projection.report.trace import write_chrome_trace

        jobs.append(("--trace", args.trace, lambda: write_chrome_trace(res, args.trace)))
    if args.png:
        from projection.report.timeline_png import write_timeline_png

        jobs.append(("--png", args.png, lambda: write_timeline_png(res, args.png)))
    if args.pp_vis:
        from projection.report.ppvis import write_pp_vis

        jobs.append(("--pp-vis", str(Path(args.pp_vis) / res.schedule.name), lambda: write_pp_vis(res, args.pp_vis)))
    return write_outputs(protect_jobs(jobs))
