"""The files Megatron-LM arguments come in -> RawScenario (through `projection.formats.megatron.args_to_raw`):
a functional-test `model_config.yaml` (`MODEL_ARGS:` flag -> value, `ENV_VARS:`), a flat YAML of dest names (a
models/ preset), a bash launch script, or a plain file of flags; plus `--set` overrides given as dest names, flag
spellings or dotted canonical keys."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem, count_of, shown
from projection.formats.common import load_yaml, read_text
from projection.formats.job_env import READ, exported_names, launch_assignments
from projection.formats.megatron import SET_ORIGIN, args_to_raw
from projection.formats.megatron_args import (
    DESTS,
    NAME_ONLY_DESTS,
    ArgValueError,
    canonical_dest,
    flag_to_dest,
    to_bool,
)
from projection.formats.megatron_shell import FlagHit, ShellValueTooLong, parse_shell
from projection.formats.megatron_shell_lex import Expander, Var
from projection.formats.shell_quotes import unclosed_quote
from projection.specs.scenario import Origin, RawScenario

# the sections a dotted `--set` key may name on a Megatron file (cluster.* and env.* are taken by api.load first)
CANONICAL_SECTIONS = ("model", "training", "plan", "cluster")


def load_megatron(path: Path, overrides: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> RawScenario:
    """Read Megatron args from `path` (MODEL_ARGS YAML, flat YAML of dests, bash script or file of flags) into a
    RawScenario. `overrides` (from --set) are dest names, flag spellings, or dotted canonical keys, applied last with
    Origin('--set'). `env` is the environment for `$VAR` / `${VAR}` values. A value that still holds an unresolved
    variable is an error only where the loader uses it."""
    path = Path(path)
    text = read_text(path)
    file = str(path)
    cluster: dict[str, tuple[Any, Origin]] = {}
    job_vars: dict[str, tuple[str, Origin]] = {}
    problems: list[Problem] = []
    unread_sources: list[tuple[str, int]] = []  # `source FILE` lines of a script whose FILE could not be read
    case_set: dict[str, int] = {}  # variables a `case` block may set (their value after it is unknown)
    flat = False  # a flat YAML of dests (a models/ preset) rather than a functional test's MODEL_ARGS
    if path.suffix.lower() in (".yaml", ".yml"):
        hits = _yaml_hits(path, text, env or {})
        data, lines = load_yaml(path, text)
        flat = isinstance(data, dict) and "MODEL_ARGS" not in data
        env_vars = _env_vars(data.get("ENV_VARS") if isinstance(data, dict) else None)  # the harness exports them
        job_vars = {k: (v, Origin(file, lines.get(("ENV_VARS", k)), k)) for k, v in env_vars.items() if k in READ}
    else:
        unclosed = unclosed_quote(text)
        if unclosed is not None:
            line, quote = unclosed
            raise ConfigError(Problem(f"the {quote} quote opened on this line is never closed, so bash would read the "
                                      "rest of the script as one word", file=file, line=line, key=quote,
                                      fix=f"close the quote with a matching {quote}"))
        try:
            shell = parse_shell(text, env, path.parent)
        except ShellValueTooLong as err:
            raise ConfigError(Problem(f"{err}: bash would build it, but it is not a launch setting", file=file,
                                      line=err.line, key=err.name, fix=f"assign {err.name} its value directly")) \
                from None
        hits, unread_sources, case_set = shell.flags, shell.unread_sources, shell.case_set
        problems += [Problem(f"{flag} is a switch and takes no value: argparse stops at {word!r} (unrecognized "
                             "arguments) and the job does not start", key=flag, file=file, line=line,
                             fix=f"write {flag} alone to turn it on, or leave it out to keep it off")
                     for flag, word, line in shell.switch_values]
        cluster = dict(_cluster_from_vars(shell.variables, shell.assigned_at, file))
        cluster.update(_cluster_from_launcher(hits, file, problems))
        exported = exported_names(text)
        job_vars = {k: (v.text(), Origin(file, shell.assigned_at.get(k), k)) for k, v in shell.variables.items()
                    if k in READ and k in shell.assigned_at and k in exported}
        job_vars.update({k: (value, Origin(file, line, k)) for k, (value, line) in launch_assignments(text).items()
                         if k in READ})
        if not any(h.dest == "tokenizer_model" for h in hits) and "TOKENIZER_MODEL" in shell.assigned_at:
            tok = shell.variables["TOKENIZER_MODEL"]  # modelopt conf scripts name the tokenizer only in a variable
            hits.append(FlagHit("TOKENIZER_MODEL", "tokenizer_model", False, tok.text(),
                                shell.assigned_at["TOKENIZER_MODEL"], tok.unresolved))
    args: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    unresolved: dict[str, FlagHit] = {}
    for h in hits:
        value: Any = h.value
        if h.inverted:
            value = _invert(h, file, problems)
        args[h.dest] = value
        origins[h.dest] = Origin(file, h.line, h.flag)
        unresolved.pop(h.dest, None)
        if h.unresolved and h.dest in DESTS and h.dest not in NAME_ONLY_DESTS:
            unresolved[h.dest] = h
    canonical: dict[str, Any] = {}
    # --set keys that name nothing are dropped and reported with the layout's problems (build_scenario), so a
    # misspelt key does not hide them; a file's own problems are reported with them
    unknown: list[Problem] = []
    for key, value in (overrides or {}).items():
        if "." in key:
            section = key.split(".", 1)[0]
            if section in CANONICAL_SECTIONS:
                canonical[key] = value
            else:  # `trainig.seq_length`, `tensor_model_parallel_size.x`: neither a dest nor a canonical key
                close = difflib.get_close_matches(section, CANONICAL_SECTIONS, n=1)
                unknown.append(Problem(
                    f"--set {key}: {section!r} is not a section of projection's canonical keys "
                    f"({', '.join(CANONICAL_SECTIONS)})", key=key, file=SET_ORIGIN,
                    fix=f"did you mean {close[0]}.{key.split('.', 1)[1]}?" if close else
                    "use a Megatron argparse dest name (e.g. tensor_model_parallel_size) or a dotted canonical key "
                    "(e.g. plan.tp)"))
            continue
        dest, inverted = flag_to_dest(key) if "-" in key else (canonical_dest(key), False)
        if dest not in DESTS and dest in args:
            if dest == WORLD_SIZE:  # a dump's world size, which api.load reads (nodes_from_dump)
                args[dest], origins[dest] = value, Origin(SET_ORIGIN, None, key)
            continue  # a Megatron argument the file itself sets that nothing here reads (--lr): accepted, unused
        if dest not in DESTS:
            close = difflib.get_close_matches(dest, list(DESTS), n=3)
            unknown.append(Problem(f"--set {key}: not a Megatron argument this projection reads", key=key,
                                    file=SET_ORIGIN, fix=f"did you mean {', '.join(close)}?" if close else
                                    "use a Megatron argparse dest name (e.g. tensor_model_parallel_size) or a "
                                    "dotted canonical key (e.g. plan.tp)"))
            continue
        hit = FlagHit(key, dest, inverted, value, None)
        args[dest] = _invert(hit, SET_ORIGIN, problems) if inverted else value
        origins[dest] = Origin(SET_ORIGIN, None, key)
        unresolved.pop(dest, None)
    if flat and args.get(WORLD_SIZE) is not None and _whole(args[WORLD_SIZE]) is None:
        o = origins[WORLD_SIZE]
        problems.append(Problem(f"world_size must be the run's number of GPUs, a whole number >= 1, got "
                                f"{shown(args[WORLD_SIZE])}", key=o.key or WORLD_SIZE, file=o.file, line=o.line,
                                fix="write the number of GPUs the run had, or leave world_size out and give --nodes N"))
    training = ("seq_length", "micro_batch_size", "global_batch_size", "bf16", "fp16")
    if flat and not any(d in args for d in training) and not any(k.startswith("training.") for k in canonical):
        raise ConfigError([*unknown, *problems, Problem(
            "this file describes a model only (a flat preset of model arguments: no sequence length, batch sizes "
            "or precision), so there is no training step to project", file=file,
            fix=f"name it from a scenario (model: {path.stem}, with training, plan and cluster; see "
                "examples/llama3_8b_inline.yaml), or add seq_length, micro_batch_size, global_batch_size and bf16: "
                "true to the file (or --set them)")])
    for dest, h in unresolved.items():
        commands = sorted(n for n in h.unresolved if n.startswith(("$(", "`", "(")))
        if commands:  # `TP=$(nproc)`: a command's output, which nothing here runs
            problems.append(Problem(f"{h.flag} takes the output of {', '.join(commands)}, a command projection does "
                                    "not run", key=h.flag, file=file, line=h.line,
                                    fix=f"pass the value it has in your job with --set {dest}=VALUE"))
        elif any(n in case_set for n in h.unresolved):  # a `case` block may set it: its value is not known
            cased = sorted(n for n in h.unresolved if n in case_set)
            problems.append(Problem(f"{h.flag} uses {', '.join(f'${n}' for n in cased)}, which the case block at line "
                                    f"{case_set[cased[0]]} may set: projection does not evaluate case patterns",
                                    key=h.flag, file=file, line=h.line,
                                    fix=f"pass the value your job runs with --set {dest}=VALUE"))
        else:
            names = ", ".join(f"${n}" for n in sorted(h.unresolved))
            unread = "; ".join(f"line {line} sources {name}, which projection could not read"
                               for name, line in unread_sources)
            problems.append(Problem(f"{h.flag} uses {names}, which is not set in the file or the environment"
                                    + (f" ({unread})" if unread else ""),
                                    key=h.flag, file=file, line=h.line,
                                    fix=f"set {sorted(h.unresolved)[0]} in the script or environment, or pass "
                                        f"--set {dest}=VALUE"))
        args.pop(dest, None)
    try:
        raw = args_to_raw(args, origins, source=file)
    except ConfigError as e:
        bad = {h.flag for h in unresolved.values()}
        problems += [p for p in e.problems if p.key not in bad]
        raise ConfigError([*unknown, *problems]) from None
    if problems:
        raise ConfigError([*unknown, *problems, *raw.placeholders.values()])
    raw.deferred += unknown
    for key, (value, origin) in cluster.items():
        raw.set(key, value, origin)
    raw.job_env.update(job_vars)
    for key, value in canonical.items():
        raw.set(key, value, Origin(SET_ORIGIN, None, key))
    return raw


def _invert(h: FlagHit, file: str, problems: list[Problem]) -> Any:
    """The dest value of a store_false flag (`--disable-bias-linear` -> add_bias_linear False)."""
    try:
        return not to_bool(h.value)
    except ArgValueError as e:
        problems.append(Problem(f"{h.flag}: {e}", key=h.flag, file=file, line=h.line,
                                fix=f"write {h.flag} as a bare flag (or true/false in YAML)"))
        return None


def _yaml_hits(path: Path, text: str, env: Mapping[str, str]) -> list[FlagHit]:
    """MODEL_ARGS (flag -> value, `true` = bare flag) of a functional-test YAML, or a flat map of dests / flags."""
    data, lines = load_yaml(path, text)
    prefix: tuple[str, ...] = ()
    if isinstance(data, dict) and isinstance(data.get("MODEL_ARGS"), dict):
        prefix, variables = ("MODEL_ARGS",), {**_env_vars(data.get("ENV_VARS")), **env}
        data = data["MODEL_ARGS"]
    elif isinstance(data, dict) and "MODEL_ARGS" in data:
        raise ConfigError(Problem("MODEL_ARGS must be a mapping of Megatron flags", key="MODEL_ARGS", file=str(path),
                                  line=lines.get(("MODEL_ARGS",)),
                                  fix="write one indented `--flag: value` line per argument under MODEL_ARGS:"))
    else:
        variables = dict(env)
    if not isinstance(data, dict):
        raise ConfigError(Problem("expected a mapping of Megatron arguments (or a MODEL_ARGS: mapping)",
                                  file=str(path), fix="write one `--flag: value` or `dest: value` per line"))
    table = {k: Var(v) for k, v in variables.items()}
    hits = []
    for key, value in data.items():
        key = str(key)
        dest, inverted = flag_to_dest(key) if key.startswith("-") else (canonical_dest(key), False)
        unresolved: frozenset[str] = frozenset()
        if value is None:
            if not key.startswith("-"):
                continue  # a dest set to null keeps Megatron's default (Primus/preset convention)
            value = True  # `--flag:` with no value in MODEL_ARGS is a bare flag
        if isinstance(value, str) and "$" in value:
            ex = Expander(table, keep_unresolved=True)
            value = ex.string_no_quotes(value)
            unresolved = frozenset(ex.unresolved)
        hits.append(FlagHit(key, dest, inverted, value, lines.get((*prefix, key)), unresolved))
    return hits


def _env_vars(block: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in block.items()} if isinstance(block, dict) else {}


def _cluster_from_vars(variables: Mapping[str, Var], lines: Mapping[str, int], file: str
                       ) -> dict[str, tuple[int, Origin]]:
    """GPUS_PER_NODE / NNODES / NUM_NODES assignments of a launch script -> cluster.gpus_per_node / cluster.nodes."""
    out: dict[str, tuple[int, Origin]] = {}
    for name, key in (("GPUS_PER_NODE", "cluster.gpus_per_node"), ("NUM_NODES", "cluster.nodes"),
                      ("NNODES", "cluster.nodes")):
        var = variables.get(name)
        if name in lines and var is not None and isinstance(var.value, str) and var.value.strip().isdecimal():
            out[key] = (int(var.value), Origin(file, lines[name], name))
    return out


def _cluster_from_launcher(hits: list[FlagHit], file: str, problems: list[Problem]) -> dict[str, tuple[int, Origin]]:
    """torchrun's `--nproc_per_node N` / `--nproc-per-node N` and `--nnodes N` (a whole number; an elastic range
    `1:4`, torchrun's `auto`/`gpu` GPU count or an unset variable is left to the script's variables, the device's
    node or --nodes) -> the cluster; the launcher's flags are what the job runs with, so they win over
    GPUS_PER_NODE / NNODES assignments. A value torchrun refuses (`2.5`, `0`) is a problem."""
    out: dict[str, tuple[int, Origin]] = {}
    for h in hits:
        key = {"nproc_per_node": "cluster.gpus_per_node", "nnodes": "cluster.nodes"}.get(h.dest)
        # the words after the flag up to the next flag: its value, then the script torchrun runs
        value = h.value[0] if isinstance(h.value, list) and h.value else h.value
        if not key or h.unresolved or not isinstance(value, str):
            continue
        text = value.strip()
        if text.isdecimal() and int(text) > 0:
            out[key] = (int(text), Origin(file, h.line, h.flag))
        elif not (text in _TORCHRUN_COUNTS if h.dest == "nproc_per_node" else _ELASTIC.fullmatch(text)):
            # torchrun: --nproc-per-node is "auto", "cpu", "gpu", "xpu" or an int; --nnodes is N or MIN:MAX
            problems.append(Problem(
                f"{h.flag} {text}: torchrun takes a whole number of "
                + ("processes per node (or auto / gpu)" if h.dest == "nproc_per_node" else "nodes (or MIN:MAX)"),
                key=h.flag, file=file, line=h.line,
                fix=f"give {h.flag} the run's {'GPUs per node' if h.dest == 'nproc_per_node' else 'nodes'}, "
                    "a whole number >= 1"))
    return out


_TORCHRUN_COUNTS = ("auto", "cpu", "gpu", "xpu")  # torch.distributed.run: --nproc-per-node's named counts
_ELASTIC = re.compile(r"[1-9][0-9]*:[1-9][0-9]*")  # --nnodes MIN:MAX (an elastic range: left to --nodes)


# Megatron-LM's parse_args takes the run's size from the launcher (megatron/training/arguments.py, "Args from
# environment": args.world_size is the launcher's WORLD_SIZE variable, 1 when unset), so no flag sets it but every
# argument dump (the rank-0 `print_args` block, `world_size ..... 64`) records it
WORLD_SIZE = "world_size"


def nodes_from_dump(path: Path, overrides: Mapping[str, Any] | None, env: Mapping[str, str] | None,
                    gpus_per_node: int, per_node: str) -> tuple[int, int, Origin, Problem | None] | None:
    """(nodes, GPUs per node, where, problem) of a Megatron-LM argument dump (a flat YAML of dests, as projection
    reads a logged `args` block) that records `world_size`: world_size / gpus_per_node nodes (`per_node` says where
    that count comes from) at the world_size line; a `--set world_size=N` replaces the file's (`=null` drops it).
    None for any other file (a MODEL_ARGS YAML, a script, a file of flags: no Megatron flag sets it) or a dump
    without it. A world size that is not whole nodes is a Problem, returned with the world size cut into nodes of the
    GCD of the two (GPUs per node changed), so the rest of the job is still checked at the run's own size."""
    path = Path(path)
    if path.suffix.lower() not in (".yaml", ".yml"):
        return None
    text = read_text(path)
    data, _ = load_yaml(path, text)
    if not isinstance(data, dict) or "MODEL_ARGS" in data:
        return None
    found: tuple[Any, Origin] | None = None
    for h in _yaml_hits(path, text, env or {}):  # the keys as load_megatron reads them
        if h.dest == WORLD_SIZE:
            found = (h.value, Origin(str(path), h.line, h.flag))
    for key, value in (overrides or {}).items():  # load_megatron refuses a --set world_size the file does not hold
        if found is not None and (flag_to_dest(key)[0] if "-" in key else canonical_dest(key)) == WORLD_SIZE:
            found = None if value is None else (value, Origin(SET_ORIGIN, None, key))
    world = None if found is None else _whole(found[0])
    if found is None or world is None:  # a malformed one is load_megatron's problem
        return None
    origin = found[1]
    if world % gpus_per_node == 0:
        return world // gpus_per_node, gpus_per_node, origin, None
    # the cluster is whole nodes of gpus_per_node GPUs (specs/hardware.py ClusterSpec: world = nodes * gpus_per_node)
    common = math.gcd(world, gpus_per_node)
    example = f" (e.g. --gpus-per-node {common}: {count_of(world // common, 'node')})" if common > 1 else ""
    return world // common, common, origin, Problem(
        f"world_size {world} is not a whole number of nodes of {per_node}", key=origin.key or WORLD_SIZE,
        file=origin.file, line=origin.line,
        fix=f"give --gpus-per-node G with G dividing world_size{example}, or --nodes N")


def _whole(value: Any) -> int | None:
    """A count >= 1 written as a number or digits (a `${WORLD_SIZE}` the environment gave), else None."""
    number = int(value) if isinstance(value, str) and value.strip().isdecimal() else value
    return number if isinstance(number, int) and not isinstance(number, bool) and number >= 1 else None


__all__ = ["WORLD_SIZE", "load_megatron", "nodes_from_dump"]
