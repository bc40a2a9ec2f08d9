"""Arguments shared by the sub-commands that load one scenario (inspect, memory, shapes), and the output-file
handling of the sub-commands that write files (schedule, performance): check every path first, leave nothing
half-written."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from projection.errors import COMMAND_LINE, ConfigError, Problem

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


def whole_numbers(text: str, flag: str, what: str = "values") -> tuple[list[int], list[Problem]]:
    """The sorted distinct positive whole numbers of 'a,b,c' (ASCII digits), or a problem naming every item that is
    not one (an empty item, as in '8,,16', included)."""
    items = text.replace(" ", "").split(",")
    wrong = [x for x in items if not (x.isascii() and x.isdecimal() and int(x) > 0)]
    if not wrong:
        return sorted({int(x) for x in items}), []
    names = ", ".join(repr(x) if x else "an empty item" for x in wrong)
    return [], [Problem(f"cannot read {what} {text!r}: {names} {'is' if len(wrong) == 1 else 'are'} not a positive "
                        "whole number", key=flag, file=COMMAND_LINE,
                        fix="give positive integers separated by commas, e.g. 1,2,4,8")]


def load_scenario(args: argparse.Namespace, env: Mapping[str, str] | None, *, nodes: int | None = None,
                  default_nodes: int = 1, schedule: str | None = None,
                  extra: Mapping[str, Any] | None = None) -> Scenario:
    """api.load with the scenario flags every sub-command shares (add_scenario_args), after their counts are checked
    (count_problems). `nodes`: the node count to load at (None: the --nodes flag's); `extra`: overrides applied
    after the --set ones (the layout search's, in the file's key space)."""
    problems = count_problems(args, ("nodes", "gpus_per_node"))
    if problems:
        raise ConfigError(problems)
    from projection import api
    from projection.formats.common import parse_set

    overrides = args.set if extra is None else {**parse_set(args.set), **extra}
    return api.load(args.config, hardware=args.hardware, nodes=args.nodes if nodes is None else nodes,
                    gpus_per_node=getattr(args, "gpus_per_node", None), overrides=overrides,
                    primus_root=getattr(args, "primus_root", None), env=env, default_nodes=default_nodes,
                    schedule=schedule)


def add_scenario_args(p: argparse.ArgumentParser, formats: tuple[str, ...] = ("table", "json")) -> None:
    p.add_argument("--config", required=True, help="Primus YAML, Megatron args/script/MODEL_ARGS YAML, TorchTitan "
                   "TOML, HF config.json or a native scenario YAML (format detected from the file)")
    p.add_argument("--hardware", help="device name from hardware_specs/ (e.g. mi300x, h100-sxm) or a YAML path")
    p.add_argument("--nodes", type=count, help="number of nodes")
    p.add_argument("--gpus-per-node", type=count, help="GPUs per node (default: the device's usual count)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value, in the config file's own key space (repeatable)")
    p.add_argument("--primus-root", help="a Primus checkout whose primus/configs presets resolve the experiment")
    p.add_argument("--format", choices=formats, default=formats[0])


# ---- output files: checked before anything is written, and removed again when a later one fails



# what matplotlib's savefig writes with the Agg backend (FigureCanvasBase.get_supported_filetypes), by extension
PICTURE_FORMATS = frozenset({"png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp", "raw",
                             "rgba", "gif"})  # not pgf: it needs a LaTeX install


def output_problems(files: Sequence[tuple[str, str | None]] = (), dirs: Sequence[tuple[str, str | None]] = ()
                    ) -> list[Problem]:
    """What stops writing each (flag, path) of `files` (a file; its folder must exist) or `dirs` (a folder, created
    with its parents), checked before any work is done. A None or empty path is skipped."""
    out = []
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
    for flag, path in dirs:
        if not path:
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


def _entries(path: Path) -> set[Path]:
    """What exists of `path`, the folders above it and everything under it: where a writer may create things."""
    seen = {path, *path.parents}
    if path.is_dir():
        seen.update(path.rglob("*"))
    return {p for p in seen if p.exists() or p.is_symlink()}


def write_outputs(jobs: Sequence[tuple[str, str, Callable[[], object]]]) -> list[str]:
    """Run each (flag, path, writer) in order; returns the written paths. If one fails, everything the earlier ones
    and the failing one created is removed (files that existed before are left as they are) and ConfigError names
    the flag and the path: nothing half-written stays behind."""
    before: dict[Path, set[Path]] = {}
    written = []
    try:
        for flag, path, fn in jobs:
            before.setdefault(Path(path), _entries(Path(path)))
            try:
                written.append(str(fn()))
            except OSError as e:
                raise ConfigError(Problem(f"cannot write output: {e.strerror or e}", key=flag,
                                          file=str(getattr(e, "filename", None) or path),
                                          fix="choose a writable path")) from e
            except (ValueError, RuntimeError) as e:  # a picture format this matplotlib cannot write (or its tool)
                raise ConfigError(Problem(f"cannot write output: {e}", key=flag, file=path,
                                          fix="choose another file name (a .png picture always works)")) from e
    except BaseException:  # a user error, or anything else: the run wrote nothing
        for out, old in before.items():
            _remove(sorted(_entries(out) - old, key=lambda p: len(p.parts), reverse=True))
        raise
    return written


def _remove(paths: Sequence[Path]) -> None:
    for p in paths:  # deepest first, so folders are empty when their turn comes
        try:
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()
        except OSError:
            pass
