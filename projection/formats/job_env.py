"""The job's environment variables that change what projection computes, wherever they are written: a Megatron
functional test's `ENV_VARS:`, the exported variables of a launch script (and assignments prefixed to its launch
command), TorchTitan's launcher default, or `--set env.NAME=VALUE` in any format. projection's own environment is
read only where a file expands a variable from it (`${VAR:-default}`), as bash would."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from projection.errors import Problem
from projection.specs.scenario import Origin
from projection.units import ALLOC_CONF_VARS, alloc_conf_expandable_segments, parse_cublas_workspace_config

# the names read, and what each sets
READ = {"CUBLAS_WORKSPACE_CONFIG": "training.kernels.gemm_workspace_bytes",
        **{name: "training.kernels.expandable_segments" for name in ALLOC_CONF_VARS}}


def merged(from_file: Mapping[str, tuple[str, Origin]], from_command_line: Mapping[str, tuple[str | None, Origin]]
           ) -> dict[str, tuple[str, Origin]]:
    """The job's variables: the file's, then the command line's by name (None unsets one). An allocator variable on
    the command line states the allocator: it replaces every allocator variable the file (or a launcher default)
    set, so that a default of another name cannot contradict it."""
    out = dict(from_file)
    if any(name in ALLOC_CONF_VARS for name in from_command_line):
        out = {k: v for k, v in out.items() if k not in ALLOC_CONF_VARS}
    for name, (value, origin) in from_command_line.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = (value, origin)
    return out


def job_environment(variables: Mapping[str, tuple[str, Origin]], problems: list[Problem]
                    ) -> dict[str, tuple[Any, Origin]]:
    """The job environment variables projection reads (name -> (value, where it was set)) -> canonical keys:
    CUBLAS_WORKSPACE_CONFIG -> training.kernels.gemm_workspace_bytes; PYTORCH_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF and
    PYTORCH_HIP_ALLOC_CONF -> training.kernels.expandable_segments (a variable that is set without the option means
    the default allocator). Which of those PyTorch reads first has changed between versions (2.9's
    AcceleratorAllocatorConfig reads PYTORCH_ALLOC_CONF first; later c10 code reads the device-specific names
    first), so two of them that disagree are a problem rather than a guess. A value PyTorch would refuse is one too."""
    out: dict[str, tuple[Any, Origin]] = {}
    ws = variables.get("CUBLAS_WORKSPACE_CONFIG")
    if ws is not None:
        parsed = parse_cublas_workspace_config(ws[0])
        if parsed is None:
            value, where = ws
            problems.append(Problem(f"CUBLAS_WORKSPACE_CONFIG {value!r} is not a list of :SIZE_KiB:COUNT pairs "
                                    "(PyTorch would warn and use its default workspace)",
                                    key=where.key or "CUBLAS_WORKSPACE_CONFIG", file=where.file, line=where.line,
                                    fix="write e.g. :4096:8, or leave it unset"))
        else:
            out["training.kernels.gemm_workspace_bytes"] = (parsed, ws[1])
    settings: dict[str, tuple[bool, Origin]] = {}
    for name in ALLOC_CONF_VARS:
        if name not in variables:
            continue
        value, origin = variables[name]
        try:
            settings[name] = (bool(alloc_conf_expandable_segments(value)), origin)
        except ValueError as e:
            problems.append(Problem(f"{name}: {e}", key=origin.key or name, file=origin.file, line=origin.line,
                                    fix="write expandable_segments:True or expandable_segments:False"))
    if len({on for on, _ in settings.values()}) > 1:
        names = ", ".join(f"{n} ({'on' if on else 'off'})" for n, (on, _) in settings.items())
        first = next(iter(settings.values()))[1]
        problems.append(Problem(f"the allocator variables disagree on expandable segments: {names}; which one "
                                "PyTorch reads first depends on its version", key=first.key or "env",
                                file=first.file, line=first.line, fix="set one of them, or give them the same value"))
    elif settings:
        on, origin = next(iter(settings.values()))
        out["training.kernels.expandable_segments"] = (on, origin)
    return out


_EXPORT = re.compile(r"^[ \t]*(?:export|(?:declare|typeset|local)[ \t]+-[a-zA-Z]*x[a-zA-Z]*)[ \t]+(.*)$", re.M)
_BLANK = r"(?:[ \t]|\\\n)+"  # blanks, or a backslash-continued line
_PREFIXED_LAUNCH = re.compile(
    rf"^[ \t]*(?:env{_BLANK})?((?:[A-Za-z_]\w*=\S*{_BLANK})+)(?:\S*/)?(?:torchrun|python3?|deepspeed|srun|mpirun)\b",
    re.M)


def exported_names(text: str) -> set[str]:
    """Names a bash script hands to the processes it launches: `export NAME[=...]` / `declare -x`, every variable
    of a script that turns on `set -a`, and assignments prefixed to a launch command (`NAME=value torchrun ...`,
    `env NAME=value torchrun ...`). A plain `NAME=value` stays in the shell and is not the job's environment;
    a name the script unsets afterwards is dropped by the caller, which keeps only names still assigned at the end
    (megatron_shell follows `unset`)."""
    names = {n for m in _EXPORT.finditer(text) for n in re.findall(r"(?:^|\s)([A-Za-z_]\w*)(?==|\s|$)", m.group(1))}
    if re.search(r"^[ \t]*set[ \t]+(?:-[a-zA-Z]*a|-o[ \t]+allexport)", text, re.M):  # where it is switched on and
        # off is not followed: every assignment of such a script counts
        names |= {m.group(1) for m in re.finditer(r"^[ \t]*([A-Za-z_]\w*)=", text, re.M)}
    names |= {n for m in _PREFIXED_LAUNCH.finditer(text) for n in re.findall(r"([A-Za-z_]\w*)=", m.group(1))}
    return names


def launch_assignments(text: str) -> dict[str, tuple[str, int]]:
    """The assignments prefixed to a launch command (`NAME=value torchrun ...`, `env NAME=value torchrun ...`), name
    -> (value with its quotes removed, 1-based line): what that command's environment holds, whatever the shell
    variables say (an `env` prefix is not a shell assignment at all)."""
    out: dict[str, tuple[str, int]] = {}
    for m in _PREFIXED_LAUNCH.finditer(text):
        line = text.count("\n", 0, m.start(1)) + 1
        for name, value in re.findall(r"([A-Za-z_]\w*)=(\S*)", m.group(1)):
            out[name] = (value.strip("'\""), line)
    return out
