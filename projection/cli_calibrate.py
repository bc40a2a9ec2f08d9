"""`projection calibrate ...`: import measurement files into a Calibration JSON, and fit the collective model.

    projection calibrate import FILE... --out CALIBRATION.json [--allow-mixed-devices]
    projection calibrate fit CALIBRATION.json [--format table|json] [--out FIT.json]

Wiring (cli.py): `add_parser(subparsers)` adds the `calibrate` group; `run(args)` runs the chosen sub-command and
returns the exit code (2 for a CalibrationError or another user error). More sub-commands (`calibrate gemm |
attention | collective`) join the same group through `register` hooks: a function taking the group's sub-parsers
action that adds its parser and sets `calibrate_run=<function(args) -> int>` as a default, e.g.
`add_parser(subparsers, hooks=(microbench.register,))`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from projection.calibrate.calibration import load_calibration
from projection.calibrate.cli_checks import out_problems, raise_all
from projection.calibrate.errors import CalibrationError
from projection.calibrate.fit import fit_calibration
from projection.calibrate.importers import import_files
from projection.cli_args import input_problems, primus_root_problems
from projection.errors import Problem, ProjectionError
from projection.fileio import atomic_write_text, same_file_problems
from projection.paths import is_device_path

Hook = Callable[[Any], None]  # receives the `calibrate` group's sub-parsers action (argparse._SubParsersAction)


def add_parser(subparsers: Any, hooks: Sequence[Hook] = ()) -> argparse.ArgumentParser:
    """Add `calibrate` to the top-level sub-parsers; register `import` and `fit`, then each hook's sub-commands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "calibrate", help="import benchmark logs and traces into a calibration, fit the collective model",
        description="Measured GEMM, attention and collective tables (a Calibration JSON) and the fits built on them.")
    calibrate_sub = parser.add_subparsers(dest="calibrate_command", required=True, metavar="SUBCOMMAND")
    register(calibrate_sub)
    for hook in hooks:
        hook(calibrate_sub)
    return parser


def register(calibrate_subparsers: Any) -> None:
    """Add the `import` and `fit` sub-commands to the `calibrate` group."""
    p = calibrate_subparsers.add_parser(
        "import", help="read nccl-tests/rccl-tests logs, hipblaslt-bench output, PyTorch profiler traces or "
        "calibration JSON files (format detected from the content) into one calibration")
    p.add_argument("files", nargs="+", metavar="FILE", help="measurement files")
    p.add_argument("--out", required=True, metavar="CALIBRATION.json", help="where to write the calibration")
    p.add_argument("--allow-mixed-devices", action="store_true",
                   help="accept files measured on different devices in one calibration")
    p.set_defaults(calibrate_run=_run_import)
    p = calibrate_subparsers.add_parser(
        "fit", help="fit piecewise alpha-beta curves per tier and collective kind; report the fit quality")
    p.add_argument("calibration", metavar="CALIBRATION.json")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--out", metavar="FIT.json", help="also write the fit as JSON")
    p.set_defaults(calibrate_run=_run_fit)


def run(args: argparse.Namespace) -> int:
    """Run the chosen `calibrate` sub-command; 2 on a user error (message on stderr), else its own code."""
    runner: Callable[[argparse.Namespace], int] | None = getattr(args, "calibrate_run", None)
    if runner is None:
        print("error: choose a calibrate sub-command (import, fit, ...)", file=sys.stderr)
        return 2
    try:
        # the benchmarks' scenario flags: an empty --config would benchmark the default shapes without a word
        raise_all(input_problems([("--config", getattr(args, "config", None))], missing_ok=True)
                  + primus_root_problems(getattr(args, "primus_root", None)))
        _check_out(args)
        return runner(args)
    except ProjectionError as err:
        print(f"error: {err.render()}", file=sys.stderr)
        return 2


def _check_out(args: argparse.Namespace) -> None:
    """Refuse an --out that is one of the sub-command's input files (`import X.log --out X.log` would replace the
    log with the calibration made from it), for every calibrate sub-command: import's FILEs, fit's CALIBRATION.json,
    the benchmarks' --config and --hardware file. (atomic_write_text notes --out in the output journal when it
    writes it, so that a failure after that, the report or Ctrl-C, puts back the file it replaced; noting it here
    would hold a hidden copy through the whole benchmark, left behind if the process is killed.)"""
    out = getattr(args, "out", None)
    if not out:
        return
    inputs = [("FILE", f) for f in getattr(args, "files", None) or ()]
    inputs += [(flag, getattr(args, attr, None)) for flag, attr in (("CALIBRATION.json", "calibration"),
                                                                    ("--config", "config"))]
    hardware = getattr(args, "hardware", None)
    if hardware and is_device_path(hardware):  # a bundled device's name is no file of the user's
        inputs.append(("--hardware", hardware))
    raise_all(same_file_problems(inputs, [("--out", out)]))


def _run_import(args: argparse.Namespace) -> int:
    raise_all(out_problems(args.out))
    cal = import_files(args.files, allow_mixed_devices=args.allow_mixed_devices)
    cal.save(args.out)
    counts = ", ".join(f"{n} {name}" for name, n in cal.row_counts().items() if n)
    devices = sorted({p.device_name for p in cal.provenance if p.device_name})
    print(f"wrote {args.out}: {counts or 'no rows'} from {len(args.files)} file(s)"
          + (f"; device {', '.join(devices)}" if devices else ""))
    for note in (n for p in cal.provenance for n in p.notes if n.startswith("skipped ")):
        print(f"note: {note}", file=sys.stderr)
    return 0


def _bundled_fabric(cal: Any, path: str) -> Any:
    """The analytic fabric of the bundled device the calibration was measured on (the one device its provenance
    names, as specs/device_names.identify reads it, else the file's name: calibrations/<device>.json), on that
    device's typical node: the latency a
    single-size group is fitted with (calibrate/fit.py); None when neither names a bundled device."""
    from projection.cost.collectives import Fabric
    from projection.errors import ConfigError
    from projection.specs.device_names import identify
    from projection.specs.hardware import ClusterSpec, list_devices, load_device

    names = sorted({p.device_name for p in cal.provenance if p.device_name})
    bundled = [load_device(n) for n in list_devices()]
    # the name a tool printed ("AMD Instinct MI300X", "NVIDIA H100 80GB HBM3") is the bundled device it identifies
    device = identify(names[0], bundled) if len(names) == 1 else None
    if device is None:
        try:
            device = load_device(Path(path).stem)
        except ConfigError:
            return None
    return Fabric.from_specs(device, ClusterSpec(device=device, nodes=1, gpus_per_node=device.gpus_per_node))


def _run_fit(args: argparse.Namespace) -> int:
    raise_all(out_problems(args.out))
    cal = load_calibration(args.calibration)
    fitted = fit_calibration(cal, _bundled_fabric(cal, args.calibration), file=args.calibration)
    doc = json.dumps({"quality": [q.model_dump() for q in fitted.quality()], **fitted.model_dump(mode="json")},
                     indent=2)  # the same document on stdout and in --out
    if args.out:
        try:
            atomic_write_text(args.out, doc + "\n")
        except OSError as err:
            raise CalibrationError(Problem(f"cannot write the fit: {err.strerror or err}", file=args.out,
                                           fix="give a writable path for --out")) from None
    if args.format == "json":
        print(doc)
    else:
        print(fitted.to_table())
    return 0
