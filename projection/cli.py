"""Command line: argparse -> projection.api. The only module that reads argv and the environment."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from projection import __version__
from projection.cli_args import add_scenario_args, count, count_problems, load_scenario
from projection.errors import ProjectionError
from projection.fileio import OutputJournal, output_journal

_common = add_scenario_args


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error format: the flag and the value on one line and where to look for the fix
    (exit 2), not the usage text; sub-command parsers inherit it (add_subparsers uses the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: <command line>: {message}\n    fix: see `{self.prog} --help` for its options\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="projection", description="Per-rank memory and step-time projection for "
                     "large-model training.")
    parser.add_argument("--version", action="version", version=f"projection {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="resolved config with provenance, and parameter counts per rank")
    _common(p)
    p = sub.add_parser("memory", help="per-rank memory: weights, gradients, optimizer, activations, verdict")
    _common(p)
    p.add_argument("--explain", action="store_true", help="print each term's formula with the numbers substituted, "
                   "and each category's addends at the peak, closed by the table's total")
    p.add_argument("--target-nodes", type=count, metavar="N",
                   help="per-rank memory after scaling to N nodes at the same global batch (strong scaling: dp grows, "
                   "microbatches per rank shrink; as performance)")
    # The other sub-commands live in their own modules, imported only when named (they pull in scipy / torch);
    # otherwise a stub keeps them listed in `projection --help`.
    wanted = next((a for a in (argv or ()) if not a.startswith("-")), None) if argv is not None else None
    for name, help_text in _EXTRA_HELP.items():
        if argv is not None and wanted != name:
            sub.add_parser(name, help=help_text, add_help=False)
        elif name == "calibrate":
            _extra(name).add_parser(sub, hooks=(_benchmark_register(argv),))
        else:
            _extra(name).add_parser(sub)
    return parser


# Sub-commands implemented in their own modules: each has add_parser(subparsers) and run(args) -> int.
_EXTRA = {"calibrate": "projection.cli_calibrate", "shapes": "projection.cli_shapes",
          "schedule": "projection.cli_schedule", "performance": "projection.cli_performance",
          "plan": "projection.cli_plan"}
_EXTRA_HELP = {"calibrate": "microbenchmarks, benchmark-log importers and collective fits",
               "shapes": "GEMM, attention and collective shapes of one training step",
               "schedule": "build a pipeline schedule and simulate its timeline (what-ifs, traces, PNG)",
               "performance": "step time, tokens/s/GPU, MFU and breakdown; scaling at fixed global batch "
                              "(--target-nodes, --scaling)",
               "plan": "search tp / pp / vpp / cp / ep / micro batch layouts: the fastest that fit"}


_BENCHMARKS = ("gemm", "attention", "collective", "memory", "host")


def _benchmark_register(argv: Sequence[str] | None) -> Any:
    """The hook adding the microbenchmark sub-commands to `calibrate`: the real ones (which import torch) unless
    argv names another calibrate sub-command (import, fit), where listed stubs keep `import`/`fit` torch-free."""
    positional = [a for a in (argv or ()) if not a.startswith("-")]
    sub_name = positional[1] if argv is not None and len(positional) > 1 else None
    if sub_name is not None and sub_name not in _BENCHMARKS:
        def stubs(calibrate_subparsers: Any) -> None:
            for name in _BENCHMARKS:
                calibrate_subparsers.add_parser(name, add_help=False)
        return stubs
    from projection.calibrate.cli_bench import register

    return register


def _extra(name: str) -> Any:
    import importlib

    return importlib.import_module(_EXTRA[name])


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A reader that closes the pipe early (`| head`) ends it quietly, as SIGPIPE ends `cat`; any
    other failure to write standard output (a full disk, /dev/full) is one error line and exit code 2; Ctrl-C is one
    line and exit code 130 (128 + SIGINT, what a shell reports for an interrupted command), without a traceback.
    The files a command writes are kept only when it succeeds: a failure after them, its report included, removes
    what it created and puts back what it replaced (fileio.OutputJournal). After a closed pipe they are kept: they
    are whole, and the reader chose to see less of the report, not to undo the command."""
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)  # tells a stdout failure from one of an output file
    keep = False
    handlers = _on_termination()
    try:
        with output_journal() as journal:
            try:
                rc = _main(argv)
                sys.stdout.flush()
                keep = rc == 0
                return rc
            except BrokenPipeError:
                _discard_stdout(stdout)
                keep = True
                return 141  # 128 + SIGPIPE, the status a shell reports for a writer whose reader went away
            except StdoutError as e:
                _discard_stdout(stdout)
                print(f"error: cannot write the output to standard output: {e.strerror or e}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                keep = False  # also when it came after the report was printed: the exit code says it failed
                print("projection: interrupted", file=sys.stderr)
                return 130
            except _Terminated as e:  # kill, a closed terminal: undone like Ctrl-C
                keep = False
                print(f"projection: terminated ({signal.Signals(e.signum).name})", file=sys.stderr)
                return 128 + e.signum
            except RecursionError:  # a parser the loaders do not guard (they report the file themselves)
                _print_too_deep(argv)
                return 2
            except ValueError as e:
                if "integer string conversion" not in str(e):
                    raise
                # Python's limit on the digits of an integer read from text (the parsers meet it before any range
                # check: a number a config would hold has at most ~20)
                _print_too_long_number(argv)
                return 2
            finally:
                _settle(journal, keep)
    finally:
        sys.stdout = stdout
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_termination() -> dict[int, Any]:
    """SIGTERM and SIGHUP raise _Terminated in the main thread, so a command killed that way rolls its output
    files back as Ctrl-C does (SIGKILL cannot be caught: a hidden copy may then stay beside an output). Returns the
    handlers replaced (none off the main thread, where Python cannot set them)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def raise_terminated(signum: int, _frame: object) -> None:
        raise _Terminated(signum)

    return {signum: signal.signal(signum, raise_terminated) for signum in (signal.SIGTERM, signal.SIGHUP)}


def _settle(journal: OutputJournal, keep: bool) -> None:
    """Commit or roll back the command's files with Ctrl-C (and termination) held off, so that a second interrupt
    cannot leave the undo half done (the handlers are restored after; only the main thread may set them)."""
    main_thread = threading.current_thread() is threading.main_thread()
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # _on_termination's too
    handlers = {signum: signal.signal(signum, signal.SIG_IGN) for signum in held} if main_thread else {}
    try:
        if keep:
            journal.commit()
        else:
            journal.rollback()
    finally:
        for signum, handler in handlers.items():
            if handler is not None:
                signal.signal(signum, handler)


def _print_too_deep(argv: Sequence[str] | None) -> None:
    given = (a.partition("=")[2] if a.startswith("--") else a for a in (sys.argv[1:] if argv is None else argv))
    files = [a for a in given if a and os.path.isfile(a)]
    which = "one of these files is" if len(files) > 1 else "the file is"
    print(f"error: {', '.join(files) or '<input>'}: {which} nested too deeply to read (hundreds of levels of lists "
          "or mappings)\n    fix: flatten the nesting (a config needs a few levels); check that this is the file "
          "you meant", file=sys.stderr)


def _print_too_long_number(argv: Sequence[str] | None) -> None:
    """Python refuses to read an integer of more than sys.get_int_max_str_digits() digits; say where it is: the
    --set key or option that gave it, else the file and line (with the key written on that line)."""
    limit = sys.get_int_max_str_digits()
    given = list(sys.argv[1:] if argv is None else argv)
    too_long = re.compile(rf"\d{{{limit + 1},}}")
    where = None
    for i, arg in enumerate(given):
        value = arg.partition("=")[2] if arg.startswith("--") else arg
        if not too_long.search(value) or os.path.isfile(value):
            continue
        flag = arg.partition("=")[0] if arg.startswith("--") else given[i - 1] if i else "<command line>"
        key = value.partition("=")[0] if flag == "--set" else None
        where = f"{flag}: key {key!r}" if key else f"<command line>: key {flag!r}"
        break
    files = [a for a in (x.partition("=")[2] if x.startswith("--") else x for x in given) if a and os.path.isfile(a)]
    for f in files if where is None else ():
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                text = fh.read(1 << 26)
        except OSError:
            continue
        found = too_long.search(text)
        if found:
            line_no = text.count("\n", 0, found.start()) + 1
            # the last key written before the number on its line (YAML `k: v`, TOML `k = v`, JSON `"k": v`)
            before = text[text.rfind("\n", 0, found.start()) + 1:found.start()]
            keys = re.findall(r"[\"']?([A-Za-z_][-\w.]*)[\"']?\s*[:=]", before)
            where = f"{f}:{line_no}" + (f": key {keys[-1]!r}" if keys else "")
            break
    print(f"error: {where or ', '.join(files) or '<command line>'}: a number has more than {limit} digits (a "
          "config's numbers have a few)\n    fix: correct the number (the file or a --set / command-line value)",
          file=sys.stderr)


class StdoutError(OSError):
    """Writing or flushing standard output failed (not a broken pipe)."""


class _Stdout:
    """sys.stdout, raising StdoutError where a write or a flush fails with an OSError other than a broken pipe, so
    that main reports it as a failure of standard output and not of whichever file was being written."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from e

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _discard_stdout(stream: Any) -> None:
    """Point standard output at /dev/null: Python flushes it again at exit, and that flush must not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())


_DASH_VALUE = re.compile(r"-\.?\d")


def _join_dash_values(argv: list[str]) -> list[str]:
    """`--scaling -4,4` as `--scaling=-4,4`: argparse takes a value that starts with a dash and is not one plain
    negative number for an option of its own, and answers with its usage text. Joined, the option's own check names
    the value and the fix."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _DASH_VALUE.match(token) and out[-1] != "--":
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _main(argv: Sequence[str] | None = None) -> int:
    argv = _join_dash_values(list(sys.argv[1:] if argv is None else argv))
    args = build_parser(argv).parse_args(argv)
    if args.command in _EXTRA:
        try:
            if args.command in ("shapes", "performance", "plan"):
                return int(_extra(args.command).run(args, env=dict(os.environ)))
            return int(_extra(args.command).run(args))
        except ProjectionError as e:
            print(f"error: {e.render()}", file=sys.stderr)
            return 2
    try:
        from projection import api  # here, not at start-up: Ctrl-C while it loads is already main()'s

        note = ""
        if getattr(args, "target_nodes", None) is not None:  # memory --target-nodes: performance's scaled scenario
            from projection.cli_performance import scenario_at
            from projection.errors import ConfigError

            wrong = count_problems(args, ("target_nodes",))
            if wrong:
                raise ConfigError(wrong)
            scenario, note = scenario_at(args, dict(os.environ))
        else:
            scenario = load_scenario(args, dict(os.environ))
        if args.command == "inspect":
            report = api.inspect(scenario)
            text = json.dumps(report.to_dict(), indent=2) if args.format == "json" else report.to_table()
        elif args.command == "memory":
            mem = api.estimate_memory(scenario)
            explained = api.explain_memory(mem) if args.explain else None
            if args.format == "json":  # the formulas go inside the JSON, so stdout stays one JSON document
                text = json.dumps({**mem.to_dict(), **({"explain": explained.splitlines()} if explained else {}),
                                   **({"notes": [note]} if note else {})}, indent=2)
            else:
                text = mem.to_table() + (f"\n\n{explained}" if explained else "") + (f"\nnote: {note}" if note else "")
    except ProjectionError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
