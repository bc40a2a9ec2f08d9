"""Arguments shared by the sub-commands that load one scenario (inspect, memory, shapes), and the output-file
handling of the sub-commands that write files (schedule, performance): check every path first, leave nothing
half-written."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from projection.errors import COMMAND_LINE, ConfigError, Problem
from projection.fileio import existing_entries, not_regular_problem, remove_paths
from projection.paths import is_device_path

if TYPE_CHECKING:
    from projection.specs.scenario import Scenario


def count(text: str) -> int | str:
    """argparse type of a node or GPU count: the integer, or the text as given when it is not one, so the command
    reports it in its own error format (file, key, fix) instead of argparse's usage line; see count_problems."""
    try:
        return int(text)
    except ValueError:
        return text


def count_problems(args: argparse.Namespace, flags: Sequence[str]) -> list[Problem]:
    """A problem per count flag (dest names) that is not a positive whole number."""
    out = []
    for flag in flags:
        value = getattr(args, flag, None)
        if value is not None and (not isinstance(value, int) or value < 1):
            out.append(Problem(f"must be a positive whole number (got {value!r})", key="--" + flag.replace("_", "-"),
                               file=COMMAND_LINE, fix="give a whole number of at least 1"))
    return out


def name_items(wrong: Sequence[str]) -> str:
    """'x', 'y' and the empty items of a comma list, each named once, with the verb that agrees: "'x' is",
    "'x', 'y' and 2 empty items are"."""
    shown = [repr(x) for x in dict.fromkeys(x for x in wrong if x)]
    empty = sum(1 for x in wrong if not x)
    if empty:
        shown.append("an empty item" if empty == 1 else f"{empty} empty items")
    if len(shown) == 1:
        return f"{shown[0]} {'are' if empty > 1 else 'is'}"
    return f"{', '.join(shown[:-1])} and {shown[-1]} are"


def whole_numbers(text: str, flag: str, what: str = "values", *,
                  allow_zero: bool = False) -> tuple[list[int], list[Problem]]:
    """The sorted distinct positive (with allow_zero: non-negative) whole numbers of 'a,b,c' (ASCII digits), or a
    problem naming every item that is not one (an empty item, as in '8,,16', included)."""
    items = text.replace(" ", "").split(",")
    least = 0 if allow_zero else 1
    wrong = [x for x in items if not (x.isascii() and x.isdecimal() and int(x) >= least)]
    kind = "non-negative" if allow_zero else "positive"
    example = "0,1,3" if allow_zero else "1,2,4,8"
    if not wrong:
        huge = [x for x in items if int(x) > 2**53]  # no layout's degree (specs.base.MAX_INT, not imported:
        # the CLI's start-up stays light)
        if huge:
            return [], [Problem(f"cannot read {what} {text!r}: {', '.join(huge)} is too large (at most 2**53)",
                                key=flag, file=COMMAND_LINE, fix=f"give {kind} integers separated by commas, e.g. "
                                f"{example}")]
        return sorted({int(x) for x in items}), []
    return [], [Problem(f"cannot read {what} {text!r}: {name_items(wrong)} not a {kind} whole number", key=flag,
                        file=COMMAND_LINE,
                        fix=f"give {kind} integers separated by commas, e.g. {example}")]


def load_scenario(args: argparse.Namespace, env: Mapping[str, str] | None, *, nodes: int | None = None,
                  default_nodes: int = 1, schedule: str | None = None,
                  extra: Mapping[str, Any] | None = None) -> Scenario:
    """api.load with the scenario flags every sub-command shares (add_scenario_args), after their counts and input
    files are checked (count_problems, input_problems). `nodes`: the node count to load at (None: the --nodes
    flag's); `extra`: overrides applied after the --set ones (the layout search's, in the file's key space)."""
    problems = count_problems(args, ("nodes", "gpus_per_node"))
    hardware = args.hardware
    # a device name is looked up in hardware_specs/; a path (the rule of specs/hardware.py) is a file to read
    hardware_file = hardware is not None and is_device_path(hardware)
    problems += input_problems([("--config", args.config), ("--hardware", hardware if hardware_file else None)],
                               missing_ok=True)
    problems += primus_root_problems(getattr(args, "primus_root", None))
    if problems:
        raise ConfigError(problems)
    from projection import api
    from projection.formats.common import parse_set

    overrides = args.set if extra is None else {**parse_set(args.set), **extra}
    return api.load(args.config, hardware=args.hardware, nodes=args.nodes if nodes is None else nodes,
                    gpus_per_node=getattr(args, "gpus_per_node", None), overrides=overrides,
                    primus_root=getattr(args, "primus_root", None), env=env, default_nodes=default_nodes,
                    schedule=schedule, pytorch=getattr(args, "pytorch", None))


def primus_root_problems(primus_root: str | None) -> list[Problem]:
    """An empty --primus-root: refused like an empty input path (the loader would take it for the current
    directory, as Path('') is)."""
    return [Problem("the path is empty", key="--primus-root", file=COMMAND_LINE,
                    fix="give a Primus checkout after --primus-root, or drop the flag")] if primus_root == "" else []


def add_pytorch_arg(p: argparse.ArgumentParser) -> None:
    """--pytorch VERSION: the torch release the job runs (api.load's `pytorch`)."""
    p.add_argument("--pytorch", metavar="VERSION", help="the torch release the job runs (default 2.10 or later): up "
                   "to 2.9 torch.distributed.pipelining runs interleaved schedules in lock-step time steps; up to 2.7 "
                   "every stage, from 2.8 the last, keeps each microbatch's output until the next step (a "
                   "plan.pipeline_outputs_kept in the file or --set wins; none, for step(return_outputs=False), needs "
                   "2.10+)")


def add_scenario_args(p: argparse.ArgumentParser, formats: tuple[str, ...] = ("table", "json")) -> None:
    p.add_argument("--config", required=True, help="Primus YAML, Megatron args/script/MODEL_ARGS YAML, TorchTitan "
                   "TOML, HF config.json or a native scenario YAML (format detected from the file)")
    p.add_argument("--hardware", help="device name from hardware_specs/ (e.g. mi300x, h100-sxm) or a YAML path")
    p.add_argument("--nodes", type=count, help="number of nodes")
    p.add_argument("--gpus-per-node", type=count, help="GPUs per node (default: the device's usual count)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value, in the config file's own key space (repeatable)")
    p.add_argument("--primus-root", help="a Primus checkout whose primus/configs presets resolve the experiment")
    add_pytorch_arg(p)
    p.add_argument("--format", choices=formats, default=formats[0])


def input_problems(files: Sequence[tuple[str, str | None]], *, missing_ok: bool = False) -> list[Problem]:
    """What stops reading each (flag, path): an empty path, a missing file (unless missing_ok: the loader reports it
    in its own words), a directory, or anything else that is not a regular file (a device or a named pipe would be
    read forever). A None path is skipped."""
    out = []
    for flag, path in files:
        if path is None:
            continue
        if not path:
            out.append(Problem("the path is empty", key=flag, file=COMMAND_LINE, fix=f"give a file after {flag}"))
        elif not missing_ok and not os.path.lexists(path):
            out.append(Problem("file not found", key=flag, file=path, fix="check the path (relative paths are taken "
                               "from the current directory)"))
        else:
            special = not_regular_problem(path, key=flag)
            out += [special] if special else []
    return out


# ---- output files: checked before anything is written, and removed again when a later one fails

# what matplotlib's savefig writes with the Agg backend (FigureCanvasBase.get_supported_filetypes), by extension
PICTURE_FORMATS = frozenset({"png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp", "raw",
                             "rgba", "gif"})  # not pgf: it needs a LaTeX install


def output_problems(files: Sequence[tuple[str, str | None]] = (), dirs: Sequence[tuple[str, str | None]] = ()
                    ) -> list[Problem]:
    """What stops writing each (flag, path) of `files` (a file; its folder must exist) or `dirs` (a folder, created
    with its parents), checked before any work is done. A None path is skipped; an empty one is a problem (it
    would otherwise turn the output off without a word)."""
    out = [Problem("the path is empty", key=flag, file=COMMAND_LINE, fix=f"give a path after {flag}, or drop the flag")
           for flag, path in (*files, *dirs) if path == ""]
    for flag, path in files:
        if not path:
            continue
        p = Path(path)
        if flag == "--png" and p.suffix.lower().lstrip(".") not in PICTURE_FORMATS:  # matplotlib reads the name
            out.append(Problem(f"a --png picture needs a name ending in a format matplotlib writes (got "
                               f"{p.suffix or 'no extension'})", key=flag, file=path,
                               fix=f"name it {p.with_suffix('.png').name} (or .svg, .pdf, ...)"))
        elif p.is_dir():
            out.append(Problem("is a directory", key=flag, file=path, fix="give a file name"))
        elif not p.parent.is_dir():
            what = "is not a directory" if p.parent.exists() else "does not exist"
            out.append(Problem(f"folder {p.parent} {what}", key=flag, file=path,
                               fix="create the folder first, or choose another path"))
        elif not os.access(p if p.exists() else p.parent, os.W_OK):
            out.append(Problem("not writable", key=flag, file=path, fix="choose a writable path"))
        elif p.is_file() and not os.access(Path(os.path.realpath(p)).parent, os.W_OK):
            # the writers replace a file whole (projection/fileio.py): the new one is written beside it first
            out.append(Problem(f"folder {Path(os.path.realpath(p)).parent} is not writable (a file is replaced by a "
                               "new one written beside it)", key=flag, file=path,
                               fix="choose a path in a writable folder"))
    for flag, path in dirs:
        if not path:
            continue
        same = [f for f, other in files if other and os.path.abspath(other) == os.path.abspath(path)]
        if same:  # a folder of files and a file at one path: whichever is written second cannot be
            out.append(Problem(f"the same path as {same[0]}", key=flag, file=path,
                               fix=f"give {flag} a folder other than {same[0]}'s file"))
            continue
        top = Path(path)
        while not top.exists() and top.parent != top:
            top = top.parent
        if not top.is_dir():
            out.append(Problem(f"{top} is not a directory", key=flag, file=path,
                               fix="give a folder (it is created if missing)"))
        elif not os.access(top, os.W_OK):
            out.append(Problem(f"folder {top} is not writable", key=flag, file=path, fix="choose a writable folder"))
    return out


def write_outputs(jobs: Sequence[tuple[str, str, Callable[[], object]]]) -> list[str]:
    """Run each (flag, path, writer) in order; returns the written paths. If one fails, everything the earlier ones
    and the failing one created is removed, the files they overwrote get their old content back, and ConfigError
    names the flag and the path: nothing half-written stays behind, and nothing that was there is lost."""
    before: dict[Path, set[Path]] = {}
    aside: list[tuple[Path, Path]] = []  # (file a writer may overwrite, the hidden name it waits under)
    written = []
    try:
        for flag, path, fn in jobs:
            before.setdefault(Path(path), existing_entries(Path(path)))
            try:
                _set_aside(Path(path), aside)
                written.append(str(fn()))
            except OSError as e:
                raise ConfigError(Problem(f"cannot write output: {e.strerror or e}", key=flag,
                                          file=str(getattr(e, "filename", None) or path),
                                          fix="choose a writable path")) from e
            except (ValueError, RuntimeError) as e:  # a picture format this matplotlib cannot write (or its tool)
                raise ConfigError(Problem(f"cannot write output: {e}", key=flag, file=path,
                                          fix="choose another file name (a .png picture always works)")) from e
        # a file set aside where a writer then made a folder (`--pp-vis rep` writes rep/<schedule>/ beside a file
        # rep/<schedule>): the file would be lost under the folder, so the run is refused and undone
        clashes = [o for o, _ in aside if o.is_dir() and not o.is_symlink()]
        if clashes:
            for c in clashes:  # all of it new (a file stood there): removed here, as the undo below keeps old names
                remove_paths(sorted([*c.rglob("*"), c], key=lambda q: len(q.parts), reverse=True))
            flag = next((f for f, path, _ in jobs if clashes[0].is_relative_to(Path(path).resolve())), jobs[0][0])
            raise ConfigError(Problem(f"cannot write output: {clashes[0]} is a file, and this output needs a folder "
                                      "of that name", key=flag, file=str(clashes[0]),
                                      fix="move or rename that file, or choose another output folder"))
    except BaseException:  # a user error, or anything else: the run wrote nothing
        hidden = {h for _, h in aside}
        for out, old in before.items():
            remove_paths(sorted(existing_entries(out) - old - hidden, key=lambda p: len(p.parts), reverse=True))
        for original, kept in reversed(aside):
            _put_back(original, kept)
        raise
    for original, kept in aside:  # an old file no writer replaced (a pp_vis rank file of a larger run) stays
        if original.exists() or original.is_symlink():
            with contextlib.suppress(OSError):  # the new file keeps the old one's permission bits, as open() would
                os.chmod(original, stat.S_IMODE(kept.stat().st_mode))
            kept.unlink(missing_ok=True)
        else:
            _put_back(original, kept)
    return written


def _set_aside(out: Path, aside: list[tuple[Path, Path]]) -> None:
    """Rename the regular files a writer of `out` may overwrite (`out` itself, or every file under the folder `out`)
    to hidden names beside them, appending (file, hidden name) to `aside`. A writer that truncates in place
    (matplotlib's savefig) or fails halfway then cannot touch the old content. Symlinks are followed: the link is
    left as it is, its target waits aside."""
    files = [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else [out] if out.is_file() else []
    for f in files:
        real = Path(os.path.realpath(f))
        if any(real == done for done, _ in aside):
            continue
        kept = real.with_name(f".{real.name}.{secrets.token_hex(4)}.old")
        os.replace(real, kept)
        aside.append((real, kept))


def _put_back(original: Path, kept: Path) -> None:
    with contextlib.suppress(OSError):  # else the old content stays under the hidden name: better than removing it
        os.replace(kept, original)
