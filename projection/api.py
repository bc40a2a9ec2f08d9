"""What notebooks and the CLI call. Every function here is pure apart from reading the config files it is given.

    from projection import api
    sc = api.load("exp.yaml", hardware="mi300x", nodes=4)
    report = api.inspect(sc)
    report.params_total, report.per_rank[0].params
    again = api.reloader("exp.yaml", hardware="mi300x", nodes=4)  # the same job loaded again, for
    search_layouts(sc, tp=[2, 4], reload=again); compare_schedules(sc, reload=again.schedule)  # framework files
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from projection.errors import COMMAND_LINE, ConfigError, Problem, ProjectionError, count_of, shown
from projection.formats.common import parse_set
from projection.formats.detect import load_raw
from projection.formats.job_env import READ, job_environment, merged
from projection.memory.report import MemoryReport
from projection.paths import HARDWARE_DIR, MODELS_DIR, is_device_path
from projection.report.inspect import InspectReport, build_inspect_report
from projection.specs.hardware import DeviceSpec, load_device
from projection.specs.plan import torch_pipeline_outputs_kept, torch_pipeline_runtime, torch_release
from projection.specs.scenario import Origin, RawScenario, Scenario, build_scenario, section_specs

DEFAULT_HARDWARE = "mi300x"


def _outputs_kept(raw: RawScenario, pytorch: str, problems: list[Problem]) -> None:
    """--pytorch's `plan.pipeline_outputs_kept` (torch_pipeline_outputs_kept), unless the file or --set states it:
    a stated "none" (the trainer passes step(return_outputs=False)) needs torch 2.10+, which added the argument."""
    held = raw.origins.get("plan.pipeline_outputs_kept")
    if held is None or held.file.startswith("default"):
        raw.set("plan.pipeline_outputs_kept", torch_pipeline_outputs_kept(pytorch),
                Origin(COMMAND_LINE, None, "--pytorch"))
    elif raw.get("plan.pipeline_outputs_kept") == "none" and (torch_release(pytorch) or (0, 0)) < (2, 10):
        problems.append(Problem(f"'none' (step(return_outputs=False)) needs torch 2.10 or later; --pytorch says "
                                f"{pytorch}", key=held.key or "plan.pipeline_outputs_kept", file=held.file,
                                line=held.line, fix="drop it (torch before 2.10 keeps the outputs: last_stage from "
                                "2.8, every_stage before) or give the torch release the job runs"))


def load(config: str | Path, *, hardware: str | None = None, nodes: int | None = None,
         gpus_per_node: int | None = None, overrides: Mapping[str, Any] | Sequence[str] | None = None,
         primus_root: str | Path | None = None, env: Mapping[str, str] | None = None,
         fmt: str | None = None, hardware_dir: Path = HARDWARE_DIR, models_dir: Path = MODELS_DIR,
         default_nodes: int = 1, schedule: str | None = None, pytorch: str | None = None) -> Scenario:
    """Load and validate any supported config file into a Scenario.

    overrides: `KEY=VALUE` strings or a mapping, in the file's own key space (Megatron/Primus argument names,
    TorchTitan `section.key`, canonical `plan.tp` for native and HF files). `env` resolves `${VAR}` in Primus YAML and
    `$VAR` in launch scripts (the CLI passes the process environment; the default is an empty environment; values
    are strings, as a process environment's are: a number is refused, not converted). nodes, gpus_per_node,
    default_nodes: ints ("4" and 8.0 are refused).
    Cluster: hardware / nodes / gpus_per_node given here win over the file; defaults are mi300x, `default_nodes` (1)
    nodes (a Megatron-LM argument dump's `world_size` over the GPUs per node where it records one) and the device's
    usual GPUs per node. schedule: a pipeline schedule name that replaces the file's before the
    plan is checked (the CLI's --schedule NAME). pytorch: the torch release the job runs ("2.9", "2.10.0"; the
    CLI's --pytorch), which decides how torch.distributed.pipelining runs interleaved schedules (ParallelPlan
    .pipeline_runtime); None keeps the file's or the default (torch 2.10+).
    """
    if overrides is not None and not isinstance(overrides, Mapping | str | bytes) and isinstance(overrides, Iterable):
        overrides = list(overrides)  # a generator is read once
    _check_load_args(config, overrides, env, hardware_dir, models_dir, primus_root,
                     {"nodes": nodes, "gpus_per_node": gpus_per_node, "default_nodes": default_nodes}, schedule)
    if primus_root is not None:  # whatever the file's format: a wrong path is a slip
        from projection.formats.primus import check_primus_root

        check_primus_root(primus_root, config)
    hardware_dir, models_dir = Path(hardware_dir), Path(models_dir)
    ov = dict(overrides) if isinstance(overrides, Mapping) else parse_set(list(overrides or ()))
    # `cluster.*` is projection's own key in every format (no Primus, Megatron or TorchTitan file has it): applied
    # after loading, so a Primus experiment does not merge it away and a TorchTitan TOML does not take it for a section
    nested = ov.pop("cluster", None)  # a mapping from Python ({"cluster": {"oversubscription": 4}})
    if isinstance(nested, Mapping):
        ov.update({f"cluster.{k}": v for k, v in nested.items()})
    elif nested is not None:
        raise ConfigError(Problem(f"cluster must be a mapping of cluster keys, got {nested!r}", key="--set cluster",
                                  file=COMMAND_LINE, fix="set one key at a time, e.g. --set cluster.nodes=4"))
    cluster = {str(k): v for k, v in ov.items() if str(k).startswith("cluster.")}
    # `env.NAME` is the training job's environment variable NAME, also projection's own key in every format
    job_env = {str(k): v for k, v in ov.items() if str(k).startswith("env.")}
    ov = {k: v for k, v in ov.items() if str(k) not in cluster and str(k) not in job_env}
    command_line, problems = _job_env_vars(job_env)
    def read(ov: Mapping[str, Any]) -> RawScenario:
        try:
            return load_raw(Path(config), ov, fmt=fmt, primus_root=Path(primus_root) if primus_root else None,
                            models_dir=models_dir, env=env or {})
        except ProjectionError as err:  # the command line's environment problems with the file's, all at once
            raise _with(problems, err) from None
    raw = read(ov)
    if schedule is not None and "torchtitan" in raw.framework and int(raw.get("plan.pp") or 1) > 1:
        raw = _torchtitan_schedule(read, ov, schedule)  # the stages per rank follow the schedule, as in TorchTitan
    elif schedule is not None and raw.framework == "primus-megatron" and int(raw.get("plan.pp") or 1) > 1:
        raw = _primus_schedule(read, ov, schedule, int(raw.get("plan.pp") or 1))  # through Primus's patches
    for key, value in cluster.items():
        raw.set(key, value, Origin(COMMAND_LINE, None, f"--set {key}"))
    if schedule is not None:
        raw.set("plan.schedule", schedule, Origin(COMMAND_LINE, None, "--schedule"))
    if pytorch is not None:
        runtime = torch_pipeline_runtime(pytorch) if isinstance(pytorch, str) else None
        if runtime is None:
            problems.append(Problem(f"cannot read a torch release from {shown(pytorch)}", key="--pytorch",
                                    file=COMMAND_LINE, fix="give the release as torch.__version__ prints it, "
                                    "e.g. --pytorch 2.9 or --pytorch 2.10.0"))
        elif raw.get("plan.pipeline_runtime") != "megatron":  # Megatron's schedules.py runs the same on any torch
            raw.set("plan.pipeline_runtime", runtime, Origin(COMMAND_LINE, None, "--pytorch"))
            _outputs_kept(raw, pytorch, problems)
    if hardware is not None:
        raw.set("cluster.hardware", hardware, Origin(COMMAND_LINE, None, "--hardware"))
    if nodes is not None:
        raw.set("cluster.nodes", nodes, Origin(COMMAND_LINE, None, "--nodes"))
    if gpus_per_node is not None:
        raw.set("cluster.gpus_per_node", gpus_per_node, Origin(COMMAND_LINE, None, "--gpus-per-node"))
    if raw.get("cluster.hardware") is None:
        raw.set("cluster.hardware", DEFAULT_HARDWARE, Origin(f"default ({DEFAULT_HARDWARE}; --hardware to change)"))
    origin = raw.origins.get("cluster.hardware")  # an unknown name is reported where it was written
    if not isinstance(raw.get("cluster.hardware"), str):
        o = origin or Origin(str(config), None, "cluster.hardware")
        raise _with(problems, ConfigError(Problem(
            f"must be a device name or a device YAML's path, got {shown(raw.get('cluster.hardware'))}",
            key=o.key or "cluster.hardware", file=o.file, line=o.line, fix="e.g. hardware: mi300x")))
    try:
        try:
            if origin is None or origin.file.startswith("default"):
                device = load_device(str(raw.get("cluster.hardware")), hardware_dir)
            else:
                device = load_device(str(raw.get("cluster.hardware")), hardware_dir,
                                     key=origin.key or "cluster.hardware", file=origin.file, line=origin.line)
        except ConfigError as err:  # no device: the sections' own problems are still found, with the device's
            raise ConfigError([*err.problems, *section_specs(raw)[1]]) from None
        # the job's environment, as the device's PyTorch build reads it: PYTORCH_HIP_ALLOC_CONF only on ROCm (c10's
        # CUDA allocator config reads it under USE_ROCM); a file's is then ignored, a --set of it refused
        unread = {"PYTORCH_HIP_ALLOC_CONF"} if device.vendor == "nvidia" else set()
        for name in sorted(unread & set(command_line)):
            problems.append(Problem(f"--set env.{name}: the job's PyTorch build for this device does not read {name} "
                                    "(ROCm builds only)", key=f"--set env.{name}", file=COMMAND_LINE,
                                    fix="set PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF for an NVIDIA device"))
        file_env = {k: v for k, v in raw.job_env.items() if k not in unread}
        command_line = {k: v for k, v in command_line.items() if k not in unread}
        for key, (value, where) in job_environment(merged(file_env, command_line), problems).items():
            held = raw.origins.get(key)
            if held is None or held.file not in ("--set", COMMAND_LINE):  # an explicit --set of the key itself wins
                raw.set(key, value, where)
        if raw.get("cluster.nodes") is None and raw.framework == "megatron":  # --nodes, --set cluster.nodes win
            _nodes_from_dump(raw, Path(config), ov, env, device, problems)
        if raw.get("cluster.nodes") is None and "torchtitan" in raw.framework:
            _nodes_from_degrees(raw, device)
        if raw.get("cluster.nodes") is None:
            raw.set("cluster.nodes", default_nodes,
                    Origin(f"default ({count_of(default_nodes, 'node')}; --nodes to change)"))
        scenario = build_scenario(raw, device)
    except ProjectionError as err:  # the job environment's problems with the file's, all at once
        if raw.framework == "megatron-bridge":  # the layout rules' Megatron-LM flags as Bridge's fields
            from projection.formats.bridge_checks import bridge_spelling

            err = type(err)(bridge_spelling(err.problems))
        raise _with(problems, err) from None
    hardware = str(raw.get("cluster.hardware"))
    if is_device_path(hardware):  # a device YAML named by path is read too (Scenario.input_files)
        scenario = scenario.model_copy(update={"input_files": (*scenario.input_files, hardware)})
    if problems:
        raise ConfigError(problems)
    return scenario


_LOAD_ARGUMENTS = ("hardware", "nodes", "gpus_per_node", "overrides", "primus_root", "env", "fmt", "hardware_dir",
                   "models_dir", "default_nodes", "schedule", "pytorch")


@dataclass(frozen=True)
class Reloader:
    """A config and the `load` arguments a scenario was loaded with, to load the same job again (`reloader`):
    `reloader(over)` with the overrides `over` (the file's key space) applied after the arguments' own, as
    `projection plan` reloads each candidate (search_layouts' `reload`); `reloader.schedule(name)` with another
    pipeline schedule, as `projection performance --schedule all` loads each (compare_schedules' `reload`)."""

    config: str | Path
    arguments: Mapping[str, Any]

    def __call__(self, overrides: Mapping[str, Any]) -> Scenario:
        own = self.arguments.get("overrides")
        base = dict(own) if isinstance(own, Mapping) else parse_set(list(own or ()))
        return load(self.config, **{**self.arguments, "overrides": {**base, **overrides}})

    def schedule(self, name: str) -> Scenario:
        return load(self.config, **{**self.arguments, "schedule": name})


def reloader(config: str | Path, **arguments: Any) -> Reloader:
    """The reload for `search_layouts` and `compare_schedules`: give it the config and the keyword arguments the
    scenario was loaded with (hardware, nodes, gpus_per_node, overrides, env, ...), so each candidate runs on the
    searched cluster with the same overrides (a reload that loads another cluster is refused; `projection plan`
    reloads at the searched scenario's node count, so pass nodes= for a file that sizes its own cluster, such as a
    TorchTitan TOML with fixed degrees or a Megatron argument dump):

        sc = api.load(path, hardware="h100-sxm", nodes=2, overrides=["seq_length=8192"])
        again = api.reloader(path, hardware="h100-sxm", nodes=2, overrides=["seq_length=8192"])
        search_layouts(sc, tp=[1, 2, 4], reload=again); compare_schedules(sc, reload=again.schedule)
    """
    unknown = [k for k in arguments if k not in _LOAD_ARGUMENTS]
    if unknown:
        raise ConfigError(Problem(f"api.load takes no argument {', '.join(map(repr, unknown))}", key=unknown[0],
                                  file="<api.reloader>",
                                  fix="pass api.load's arguments: " + ", ".join(_LOAD_ARGUMENTS)))
    own = arguments.get("overrides")
    if own is not None and not isinstance(own, Mapping | str | bytes) and isinstance(own, Iterable):
        arguments["overrides"] = list(own)  # a generator is read once
    _check_load_args(config, arguments.get("overrides"), arguments.get("env"), arguments.get("hardware_dir", "."),
                     arguments.get("models_dir", "."), arguments.get("primus_root"),
                     {k: arguments.get(k) for k in ("nodes", "gpus_per_node", "default_nodes")},
                     arguments.get("schedule"))
    return Reloader(config, dict(arguments))


def _nodes_from_dump(raw: RawScenario, config: Path, ov: Mapping[str, Any], env: Mapping[str, str] | None,
                     device: DeviceSpec, problems: list[Problem]) -> None:
    """cluster.nodes from the world_size a Megatron-LM argument dump records, over the GPUs per node the cluster
    gets (--gpus-per-node or --set cluster.gpus_per_node, else the device's usual node, as build_scenario fills it
    in); a world size that is not whole nodes joins `problems` (projection/formats/megatron_files.py)."""
    from projection.formats.megatron_files import nodes_from_dump

    per_node = raw.get("cluster.gpus_per_node")
    where = raw.origins.get("cluster.gpus_per_node")
    if per_node is None:  # a what-if edit of the device's node (--set cluster.device.gpus_per_node) is its node
        per_node, where = raw.get("cluster.device.gpus_per_node", device.gpus_per_node), None
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        return  # build_scenario reports the GPUs per node themselves
    said = (f"{per_node} GPUs (set by {where.render()})" if where is not None else
            f"{per_node} GPUs (a {device.name} node; --gpus-per-node to change)")
    found = nodes_from_dump(config, ov, env, per_node, said)
    if found is not None:
        nodes, gpus, origin, problem = found
        raw.set("cluster.nodes", nodes, origin)
        if problem is not None:  # refused; the rest is checked at the dump's world size (gpus: a divisor of it)
            problems.append(problem)
            raw.set("cluster.gpus_per_node", gpus, origin)


def _nodes_from_degrees(raw: RawScenario, device: DeviceSpec) -> None:
    """cluster.nodes from a TorchTitan job whose degrees fix its world size: with data_parallel_shard_degree given
    (not -1), ParallelDims asserts replicate x shard x cp x tp x pp = world, so the file names its GPU count; in
    whole nodes of the cluster's GPUs per node (else left to the default, and the layout check says why)."""
    dp, per_node = raw.get("plan.dp"), raw.get("cluster.gpus_per_node") or device.gpus_per_node
    sizes = [dp, *(raw.get(f"plan.{k}") or 1 for k in ("tp", "cp", "pp"))]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in [*sizes, per_node]):
        return
    world = math.prod(sizes)
    if world % per_node == 0:
        o = raw.origins.get("plan.dp")
        raw.set("cluster.nodes", world // per_node, Origin(o.file, o.line, f"{o.key}: {world} GPUs")
                if o is not None else Origin("default (the file's parallel degrees)"))


def _torchtitan_schedule(read: Callable[[Mapping[str, Any]], RawScenario], ov: Mapping[str, Any],
                         schedule: str) -> RawScenario:
    """A TorchTitan job read again with --schedule NAME as its parallelism.pipeline_parallel_schedule; problems
    about that key are --schedule's."""
    from projection.formats.torchtitan_schema import TORCHTITAN_SCHEDULE_NAMES as NAMES

    key = "parallelism.pipeline_parallel_schedule"
    if schedule not in NAMES:
        raise ConfigError(Problem(f"{schedule!r} is not a TorchTitan pipeline schedule", key="--schedule",
                                  file=COMMAND_LINE, fix="use one of " + ", ".join(
                                      f"{k} ({v})" for k, v in NAMES.items())))
    try:
        raw = read({**ov, key: NAMES[schedule]})
    except ProjectionError as err:
        raise type(err)([Problem(f"{schedule} (TorchTitan's {NAMES[schedule]}): {p.message}", key="--schedule",
                                 file=COMMAND_LINE, fix=p.fix) if p.key == key else p for p in err.problems]) from None
    for field, where in list(raw.origins.items()):  # what the schedule set was set by --schedule
        if where.key == key and where.file == "--set":
            raw.origins[field] = Origin(COMMAND_LINE, None, "--schedule")
    return raw


def _primus_schedule(read: Callable[[Mapping[str, Any]], RawScenario], ov: Mapping[str, Any], schedule: str,
                     pp: int) -> RawScenario:
    """A Primus Megatron experiment read again with the keys that make Primus run --schedule NAME (its pipeline
    patches off for 1F1B, `patch_zero_bubble` for the zero-bubble family, primus_set.schedule_overrides), so that
    what Primus refuses for that schedule is refused; the keys it set are --schedule's."""
    from projection.formats.primus_set import schedule_overrides

    keys = schedule_overrides(schedule, pp)
    if keys is None:  # no Primus key runs it: Megatron's runtime refuses it when the plan is checked
        return read(ov)
    raw = read({**ov, **keys})
    for field, where in list(raw.origins.items()):
        if where.key in keys and where.file == "--set":
            raw.origins[field] = Origin(COMMAND_LINE, None, "--schedule")
    return raw


def _with(problems: list[Problem], err: ProjectionError) -> ProjectionError:
    """`err` with `problems` in front; a ConfigError when there are any (they are the config's, not the layout's)."""
    return ConfigError([*problems, *err.problems]) if problems else err


def _job_env_vars(job_env: Mapping[str, Any]) -> tuple[dict[str, tuple[str | None, Origin]], list[Problem]]:
    """`--set env.NAME=VALUE` -> NAME -> (VALUE, where; None for `env.NAME=null`, which unsets it), and a problem for
    each name projection does not read (reported with the values' own problems)."""
    problems: list[Problem] = []
    out: dict[str, tuple[str | None, Origin]] = {}
    for key, value in job_env.items():
        name = key[len("env."):]
        if name not in READ:
            problems.append(Problem(f"--set {key}: projection reads no job environment variable {name!r}",
                                    key=f"--set {key}", file=COMMAND_LINE,
                                    fix=f"the variables it reads: {', '.join(READ)}"))
            continue
        out[name] = (None if value is None else str(value), Origin(COMMAND_LINE, None, f"--set {key}"))
    return out, problems


def _check_load_args(config: Any, overrides: Any, env: Any, hardware_dir: Any, models_dir: Any,
                     primus_root: Any, counts: Mapping[str, Any], schedule: Any) -> None:
    """ConfigError (not a TypeError from deep inside) for arguments of `load` of the wrong kind, all at once. Counts
    must be ints ("4" and 8.0 are refused, not coerced); env values must be strings, as a process environment's are
    (a number is refused, not converted: env={"PRIMUS_TP": "2"})."""
    def problem(key: str, got: Any, want: str) -> Problem:
        return Problem(f"api.load({key}=...) must be {want}, got {type(got).__name__} {got!r}"[:200], key=key,
                       file="<api.load>", fix=f"pass {want}")
    bad = []
    if not isinstance(config, str | os.PathLike):
        bad.append(problem("config", config, "a path (str or pathlib.Path)"))
    if isinstance(overrides, Mapping):
        bad += [problem("overrides", k, "a mapping with str keys") for k in overrides if not isinstance(k, str)]
    elif overrides is not None and (isinstance(overrides, str | bytes) or not isinstance(overrides, list)
                                    or not all(isinstance(x, str) for x in overrides)):
        bad.append(problem("overrides", overrides, "a mapping or a list of 'KEY=VALUE' strings"))
    if env is not None and not isinstance(env, Mapping):
        bad.append(problem("env", env, "a mapping of environment variables"))
    elif env is not None:
        bad += [Problem(f"api.load(env=...): {name!r} must map to a string, as an environment variable holds text, got "
                        f"{type(value).__name__} {value!r}"[:200], key="env", file="<api.load>",
                        fix=f"pass env={{{str(name)!r}: {str(value)!r}}}")
                for name, value in env.items() if not isinstance(name, str) or not isinstance(value, str)]
    for key, value in counts.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            bad.append(problem(key, value, "a positive whole number (an int)"))
    if schedule is not None and not isinstance(schedule, str):
        bad.append(problem("schedule", schedule, "a pipeline schedule's name (a str)"))
    for key, value in (("hardware_dir", hardware_dir), ("models_dir", models_dir), ("primus_root", primus_root)):
        if not isinstance(value, str | os.PathLike) and not (key == "primus_root" and value is None):
            bad.append(problem(key, value, "a folder path (str or pathlib.Path)"))
    if bad:
        raise ConfigError(bad)


def _need(value: Any, kind: type, what: str, name: str) -> None:
    if not isinstance(value, kind):
        raise ConfigError(Problem(f"{name} needs {what}, got {type(value).__name__}", key=name, file="<api>",
                                  fix=f"pass {what}" + (" (from api.load)" if kind is Scenario else
                                                        " (from api.estimate_memory)" if kind is MemoryReport else "")))


def inspect(scenario: Scenario) -> InspectReport:
    """Resolved values with their origins, and parameter counts (total, by component, activated, per rank)."""
    _need(scenario, Scenario, "a Scenario", "inspect")
    return build_inspect_report(scenario)


def estimate_memory(scenario: Scenario) -> MemoryReport:
    """Per-rank memory (weights, gradients, optimizer, activations from the schedule's in-flight microbatches,
    buffers), allocated and reserved peaks, and the verdict against the device's HBM."""
    from projection.memory.estimate import estimate_memory as _estimate

    _need(scenario, Scenario, "a Scenario", "estimate_memory")
    return _estimate(scenario)


def explain_memory(report: MemoryReport) -> str:
    """Each memory term as a sympy formula with the numbers substituted."""
    from projection.memory.explain import explain

    _need(report, MemoryReport, "a MemoryReport", "explain_memory")
    return explain(report)
