"""The files `projection performance` writes besides its report: the Chrome trace (--trace), Primus pp_vis dumps
(--pp-vis) and the scaling plot (--png), written all or none (fileio.protect_jobs)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from projection.cli_args import write_outputs
from projection.errors import ConfigError
from projection.fileio import protect_jobs, same_file_problems
from projection.report.perf_tables import title

if TYPE_CHECKING:
    from projection.perf.result import Projection
    from projection.specs.scenario import Scenario


def write_all(jobs: Sequence[tuple[str, str, Callable[[], object]]], proj: Projection | None,
               args: argparse.Namespace, pipelines: Sequence[Projection]) -> list[str]:
    """The outputs asked for (the Chrome trace of `proj`, the pp_vis dumps of `pipelines`), all or none of them."""
    trace = args.trace
    if args.pp_vis:
        jobs = [*jobs, *pp_vis_jobs(pipelines, args, [(flag, path) for flag, path, _ in jobs])]
    if trace and proj is not None:
        from projection.report.trace import write_chrome_trace

        sim, tails = proj.sim, trace_tails(proj)
        jobs = [*jobs, ("--trace", trace, lambda: write_chrome_trace(sim, trace, tails, proj.rounds, proj.priced,
                                                                           proj.dp))]
    return write_outputs(protect_jobs(jobs))  # kept until the report is printed (fileio.OutputJournal)


def trace_tails(proj: Projection) -> list[tuple[tuple[str, float], ...]]:
    """Per rank, what the step adds after the simulated pipeline (report/trace.py `tails`)."""
    return [(("optimizer", proj.optimizer_s[r] if r < len(proj.optimizer_s) else 0.0),
             ("param all-gather (exposed)",
              proj.param_gather_exposed_s[r] if r < len(proj.param_gather_exposed_s) else 0.0))
            for r in range(len(proj.sim.timeline))]


def pp_vis_jobs(projs: Sequence[Projection], args: argparse.Namespace,
                 outputs: Sequence[tuple[str, str]]) -> list[tuple[str, str, Callable[[], object]]]:
    """One (flag, folder, writer) per projection: its simulated pipeline as Primus pp_vis JSON in
    <--pp-vis>/<schedule>/, the activation track from the memory estimate's bytes per microbatch and virtual stage.
    ConfigError, before anything is written, where a file it would write is one the command reads or writes too."""
    from projection.report.ppvis import pp_vis_files, write_pp_vis

    files = [("--pp-vis", str(f)) for p in projs for f in pp_vis_files(p.sim, args.pp_vis, p.schedule)]
    inputs = [("a file --config reads", f) for p in projs for f in p.scenario.input_files]
    clash = same_file_problems([*inputs, ("--calibration", args.calibration)],
                               [*outputs, ("--trace", args.trace), *files])
    if clash:
        raise ConfigError(clash)

    def job(p: Projection) -> tuple[str, str, Callable[[], object]]:
        gib = [0.0] * p.sim.schedule.n_stages
        for r in p.memory.ranks if p.memory is not None else ():
            for st, b in r.microbatch_activation_bytes.items():
                gib[st] = b / 2**30
        return ("--pp-vis", str(Path(args.pp_vis) / p.schedule),
                lambda: write_pp_vis(p.sim, args.pp_vis, name=p.schedule, activation_gb=gib))
    return [job(p) for p in projs]


def scaling_png(rows: Sequence[Projection], path: str, scenario: Scenario) -> Path:
    from projection.report.scaling_plot import write_scaling_png

    return write_scaling_png(rows, path, title=title(scenario))
