"""Scenario: model + training + plan + cluster, validated once, with the provenance of every value.

Loaders (projection/formats) produce a `RawScenario`: a nested dict in the canonical key space plus, for each dotted
canonical key, the `Origin` (file, line, native key) that set it. `build_scenario` turns it into a `Scenario`,
collecting every schema problem and every layout violation before raising one error that lists them all.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from projection.errors import ConfigError, PlanError, Problem, shown
from projection.specs.base import Spec
from projection.specs.hardware import ClusterSpec, DeviceSpec, model_error_key, value_example
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec

T = TypeVar("T")


@dataclass(frozen=True)
class Origin:
    """Where a value came from: file (or 'default (...)', '--set', '<command line>'), 1-based line if known, and the
    key as written there."""

    file: str
    line: int | None = None
    key: str | None = None

    def render(self) -> str:
        s = self.file
        if self.line is not None:
            s += f":{self.line}"
        if self.key:
            s += f" ({self.key})"
        return s


SET = "--set"  # the Origin.file of a value a --set key gave (projection.formats.megatron.SET_ORIGIN is this)
CLASH_FIX = "give one of them (or the same value to both)"  # the fix of two --set keys that disagree (RawScenario.set)


@dataclass
class RawScenario:
    """What a loader hands over: canonical nested dict + provenance. Mutable only while a loader builds it."""

    source: str
    framework: str
    data: dict[str, Any] = field(default_factory=lambda: {"model": {}, "training": {}, "plan": {}, "cluster": {}})
    origins: dict[str, Origin] = field(default_factory=dict)
    # the training job's environment variables the file sets (name -> value, where), resolved by api.load together
    # with `--set env.NAME` (projection.formats.job_env)
    job_env: dict[str, tuple[str, Origin]] = field(default_factory=dict)
    # problems a loader found that leave the scenario whole (unknown keys it dropped): reported by build_scenario
    # together with the layout's own, so a misspelt key does not hide them
    deferred: list[Problem] = field(default_factory=list)
    # values a loader stood in for one it could not tell (an unknown vocabulary), so the rest is still checked: the
    # problem holds until something else sets that key (`--set`), and build_scenario reports it with the layout's
    placeholders: dict[str, Problem] = field(default_factory=dict)

    def set(self, dotted: str, value: Any, origin: Origin) -> None:
        """Set canonical key `dotted` (e.g. 'plan.sharding.zero_stage') to value, remembering where it came from."""
        node = self.data
        parts = dotted.split(".")
        for i, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):  # `--set plan.tp.x=1`: plan.tp holds a value, not a table of keys
                held = ".".join(parts[:i + 1])
                raise ConfigError(Problem(f"{held} is a single value, so it has no key {parts[i + 1]!r}",
                                          key=origin.key or dotted, file=origin.file, line=origin.line,
                                          fix=f"set {held} itself (e.g. {held}=VALUE)"))
        was, before = node.get(parts[-1]), self.origins.get(dotted)
        if before is not None and before.file == origin.file == SET and before.key != origin.key and was != value:
            # two --set keys of different spellings for one quantity (Bridge's model.tensor_model_parallel_size and
            # plan.tp): which wins would be an accident of the loader's order
            self.deferred.append(Problem(
                f"--set {before.key}={was!r} and --set {origin.key}={value!r} both set {dotted}", key=origin.key,
                file=SET, fix=CLASH_FIX))
        node[parts[-1]] = value
        # what was below `dotted` is replaced: its keys' old origins would blame the file for values --set gave
        below = dotted + "."
        for key in [k for k in self.origins if k.startswith(below)]:
            del self.origins[key]
        self.origins[dotted] = origin
        self.placeholders.pop(dotted, None)

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for p in dotted.split("."):
            if not isinstance(node, dict) or p not in node:
                return default
            node = node[p]
        return node


class Scenario(Spec):
    """One validated training job on one cluster."""

    model: ModelSpec
    training: TrainingSpec
    plan: ParallelPlan
    cluster: ClusterSpec
    framework: str = "native"
    source: str = "<memory>"
    origins: dict[str, str] = {}
    input_files: tuple[str, ...] = Field((), exclude=True, repr=False)
    """Every file the scenario was read from (the config, what it extends or names, a device YAML given as a path):
    an output must not replace one of them (the CLI checks before it writes)."""
    device_as_loaded: DeviceSpec | None = Field(None, exclude=True, repr=False)
    """The device before the `cluster.device.*` what-if edits (None: none made): a calibration measured on it prices
    the edited cluster by the ratio of the two (perf/costmodel.py)."""
    as_loaded: tuple[ParallelPlan, TrainingSpec] | None = Field(None, exclude=True, repr=False)
    """The plan and training the file asked for, where a framework rule that depends on the world size changed
    them (TorchTitan at dp_shard x cp = 1: no FSDP, no mixed precision); `--target-nodes` re-applies the rule."""

    @property
    def world_size(self) -> int:
        return self.cluster.world_size


# origins of defaults whose key is one the config file itself may hold (Megatron's argparse flags, TorchTitan's
# JobConfig keys): a problem about such a value is located at the file, by that key; other defaults (an HF file's
# training settings, the API's node count) keep their own origin, which says how to change them
FILE_KEY_DEFAULTS = ("default (Megatron-LM argparse)", "default (TorchTitan JobConfig)")


def origin_problem(raw: RawScenario, dotted: str, message: str, fix: str | None = None) -> Problem:
    """A Problem located at the file/line/native key that set `dotted` (or at the scenario's source file)."""
    o = closest(raw.origins, dotted)
    if o is None:
        return Problem(message, key=dotted, file=raw.source, fix=fix)
    if o.file.startswith(FILE_KEY_DEFAULTS) and o.key:  # a framework default the file could set by that key
        return Problem(message, key=o.key, file=raw.source, fix=fix)
    return Problem(message, key=o.key or dotted, file=o.file, line=o.line, fix=fix)


def closest(origins: Mapping[str, T], dotted: str) -> T | None:
    """The entry for `dotted`, else for its closest parent key (a.b.c -> a.b -> a), else None."""
    parts = dotted.split(".")
    while parts:
        o = origins.get(".".join(parts))
        if o is not None:
            return o
        parts.pop()
    return None


def _nested_keys(section: str, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the sub-table at `loc` of a section's spec (e.g. training.fp8 -> format, recipe, ...)."""
    cls: Any = {"model": ModelSpec, "training": TrainingSpec, "plan": ParallelPlan}.get(section)
    for part in loc:
        fields = getattr(cls, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            return []
        annotation = fields[part].annotation
        cls = next((a for a in (annotation, *typing.get_args(annotation))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return list(getattr(cls, "model_fields", {}))


_FIELD_IN_MESSAGE = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*) ")  # "num_attention_heads 32 is ..."


def _is_field(section: str, dotted: str) -> bool:
    """Whether `dotted` (e.g. 'num_attention_heads', 'moe.layer_pattern') names a field of the section's spec."""
    cls: Any = {"model": ModelSpec, "training": TrainingSpec, "plan": ParallelPlan}.get(section)
    for part in dotted.split("."):
        field = getattr(cls, "model_fields", {}).get(part)
        if field is None:
            return False
        cls = next((a for a in (field.annotation, *typing.get_args(field.annotation)) if hasattr(a, "model_fields")),
                   None)
    return True


def _pydantic_problems(raw: RawScenario, section: str, err: ValidationError) -> list[Problem]:
    out = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"] if not isinstance(x, int))
        dotted = f"{section}.{loc}" if loc else section
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            fix = "remove it or check its spelling"
            msg = "unknown key"
        elif e["type"] == "missing":
            fix = f"set {dotted}"
        elif e["type"] == "value_error" and not loc:
            # a section's cross-field check ("; "-joined): each problem at the key it names first, so the file's own
            # spelling and line are reported (num_key_value_heads in an HF config, --hidden-size in a launch script)
            for part in msg.removeprefix("Value error, ").split("; "):
                named = _FIELD_IN_MESSAGE.match(part)
                # only a real field of the section ("learned position embeddings need ..." names none)
                key = f"{section}.{named.group(1)}" if named and _is_field(section, named.group(1)) else section
                held = raw.origins.get(key)
                spelled = held.key if held is not None and held.key else key
                out.append(origin_problem(raw, key, part, f"change {spelled} or the values it is checked against "
                                          "so that they agree"))
            continue
        elif e["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            fix = "change the values named above so that they agree"
            named = _FIELD_IN_MESSAGE.match(msg)  # a sub-table's check ("top_k (16) is ..."): at the field it names
            if named and _is_field(section, f"{loc}.{named.group(1)}"):
                dotted = f"{dotted}.{named.group(1)}"
        elif e["type"] in ("model_type", "dict_type") and (keys := _nested_keys(section, e["loc"])):
            msg = f"{dotted} is a table of settings, not a single value (got {e.get('input')!r})"
            fix = (f"give its keys instead, as a nested table in the file or e.g. --set {dotted}.{keys[0]}=... "
                   f"(keys: {', '.join(keys)})")
        else:
            where = raw.origins.get(dotted)
            key = where.key if where is not None and where.key else dotted
            fix = f"give {key} a valid value (got {shown(e.get('input'))})"
        out.append(origin_problem(raw, dotted, msg, fix))
    return out


def _edited_device(raw: RawScenario, device: DeviceSpec, edits: Any) -> tuple[DeviceSpec, list[Problem]]:
    """The device with the fields `cluster.device.*` sets (a what-if on the loaded part: fewer NICs, a slower
    link), each cited in `sources` as an assumption set where it was given; problems at their keys."""
    from projection.specs.hardware import _source_keys

    if not isinstance(edits, dict):
        return device, [origin_problem(raw, "cluster.device", "cluster.device is a table of device fields, not a "
                                       "single value", "set its fields, e.g. --set cluster.device.nic.count_per_node=4 "
                                       "(or choose another device with --hardware)")]
    data = device.model_dump()
    known = set(_source_keys())

    def put(node: dict[str, Any], edit: dict[str, Any], at: str) -> None:
        for key, value in edit.items():
            path = f"{at}{key}"
            if isinstance(value, dict) and isinstance(node.get(key), dict):
                put(node[key], value, f"{path}.")
                continue
            node[key] = value
            if path in known:
                o = raw.origins.get(f"cluster.device.{path}")
                data["sources"][path] = f"A: set by {o.render() if o is not None else '--set'} (what-if)"

    put(data, edits, "")
    try:
        return DeviceSpec.model_validate(data), []
    except ValidationError as err:
        out = []
        for e in err.errors():
            loc = ".".join(str(x) for x in e["loc"] if not isinstance(x, int))
            named, detail = model_error_key(e) if not loc else (None, "")
            if named is not None:  # a rule over several fields (DeviceSpec's mesh), said at the field it names
                out.append(origin_problem(raw, f"cluster.device.{named}", detail,
                                          f"give cluster.device.{named} a value the rule allows"))
                continue
            unknown = e["type"] == "extra_forbidden"
            out.append(origin_problem(raw, f"cluster.device.{loc}", "unknown device field" if unknown else
                                      e["msg"].removeprefix("Value error, "),
                                      "use a field of the device YAML (hardware_specs/README.md), e.g. "
                                      "cluster.device.nic.count_per_node" if unknown else
                                      f"give cluster.device.{loc} a valid value"
                                      + (f" with its unit, e.g. {ex}" if (ex := value_example(
                                          tuple(loc.split(".")))) else "")))
        return device, out


def section_specs(raw: RawScenario) -> tuple[dict[str, Any], list[Problem]]:
    """The model, training and plan sections validated (those that could be: where the only problems are unknown
    keys or the model's own cross-field checks, the spec without them, so that the layout can still be checked),
    and every problem found in them, with the keys deferred from the loaders and the placeholders left unset."""
    problems: list[Problem] = [*raw.deferred, *raw.placeholders.values()]
    specs: dict[str, Any] = {}
    for name, cls in (("model", ModelSpec), ("training", TrainingSpec), ("plan", ParallelPlan)):
        data = raw.data.get(name, {})
        try:
            specs[name] = cls.model_validate(data)
        except ValidationError as err:
            problems += _pydantic_problems(raw, name, err)
            loose = _without_unknown_keys(data, err)
            if loose is not None:
                # a model whose only problems are its own cross-field checks (heads and hidden size disagree): the
                # layout is still checked against it, so those do not hide the layout's problems either
                context = {"skip_cross_checks": name == "model"}
                with contextlib.suppress(ValidationError):  # other problems too: the layout is not checked
                    specs[name] = cls.model_validate(loose, context=context)
    return specs, problems


def build_scenario(raw: RawScenario, device: DeviceSpec) -> Scenario:
    """Validate the raw scenario into a Scenario. Raises ConfigError (schema) or PlanError (layout), listing every
    problem found at once: where the only schema problems are unknown keys, the layout is still checked without
    them, so a misspelt key does not hide the layout's own problems."""
    specs, problems = section_specs(raw)
    cluster_data = dict(raw.data.get("cluster", {}))
    cluster_data.pop("hardware", None)
    unedited = None
    if "device" in cluster_data:  # --set cluster.device.nic.count_per_node=4: the loaded device, edited
        unedited = device
        device, wrong = _edited_device(raw, device, cluster_data.pop("device"))
        problems += wrong
    cluster_data.setdefault("gpus_per_node", device.gpus_per_node)
    cluster: ClusterSpec | None = None
    try:
        cluster = ClusterSpec.model_validate({**cluster_data, "device": device})
    except ValidationError as err:
        problems += _pydantic_problems(raw, "cluster", err)
    if problems:
        if cluster is not None and len(specs) == 3:
            problems += _layout(raw, specs, cluster, device)[3]
        raise ConfigError(problems)
    assert cluster is not None
    plan, training, as_loaded, problems = _layout(raw, specs, cluster, device)
    if problems:
        raise PlanError(problems)
    origins = {k: o.render() for k, o in raw.origins.items()}
    files = tuple(f for f in dict.fromkeys([raw.source, *(o.file for o in raw.origins.values())]) if os.path.isfile(f))
    return Scenario(model=specs["model"], training=training, plan=plan, cluster=cluster,
                    framework=raw.framework, source=raw.source, origins=origins, as_loaded=as_loaded,
                    device_as_loaded=unedited,
                    input_files=files)


def _without_unknown_keys(data: Any, err: ValidationError) -> dict[str, Any] | None:
    """`data` with the keys pydantic called unknown removed, or None when it found anything else wrong (a section's
    own cross-field check, a value_error at no key, is not something wrong with a key)."""
    if not isinstance(data, dict) or any(e["type"] != "extra_forbidden" and (e["type"], e["loc"]) != ("value_error", ())
                                         for e in err.errors()):
        return None
    out = copy.deepcopy(data)
    for e in err.errors():
        if e["type"] != "extra_forbidden":
            continue
        *path, last = e["loc"]
        node: Any = out
        for p in path:
            node = node.get(p) if isinstance(node, dict) else node[p] if isinstance(node, list) and \
                isinstance(p, int) and p < len(node) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def _layout(raw: RawScenario, specs: dict[str, Any], cluster: ClusterSpec, device: DeviceSpec
            ) -> tuple[ParallelPlan, TrainingSpec, tuple[ParallelPlan, TrainingSpec] | None, list[Problem]]:
    """The plan and training after the data-parallel size and the framework's world-size rules, the plan and
    training the file asked for where a rule changed them, and every layout problem."""
    from projection.specs.validate import layout_problems, resolve_dp, torchtitan_ddp_problem, torchtitan_without_fsdp

    training: TrainingSpec = specs["training"]
    plan, dp_problems = resolve_dp(raw, specs["plan"], cluster.world_size)
    as_loaded = None
    if not dp_problems:
        ruled = torchtitan_without_fsdp(raw.framework, plan, training)
        if ruled != (plan, training):
            as_loaded = (plan, training)
            plan, training = ruled
    problems = dp_problems + layout_problems(raw, specs["model"], training, plan, cluster.world_size)
    ddp = torchtitan_ddp_problem(raw.framework, as_loaded[0], plan) if as_loaded is not None else None
    if ddp is not None:
        problems.append(origin_problem(raw, ddp.key or "", ddp.message, ddp.fix))
    if cluster.gpus_per_node > device.gpus_per_node:
        # the device YAML's node is what its intra-node fabric (NVLink / xGMI island) joins; more GPUs per node would
        # be priced as one island that the part does not build
        problems.append(origin_problem(
            raw, "cluster.gpus_per_node", f"{cluster.gpus_per_node} GPUs per node: a {device.name} node holds "
            f"{device.gpus_per_node} (the device YAML's gpus_per_node; its intra-node fabric joins no more)",
            f"use at most {device.gpus_per_node} GPUs per node (--gpus-per-node) and more nodes, or a device YAML "
            "describing the larger node"))
    f8 = training.fp8
    if f8 is not None and f8.recipe == "mxfp8" and not device.mx_formats:
        problems.append(origin_problem(
            raw, "training.fp8", f"MXFP8 needs matrix cores that run microscaled fp8 (Blackwell, CDNA4); "
            f"{device.name}'s device YAML says it has none (mx_formats)",
            "use a tensorwise, delayed or blockwise fp8 recipe on this device, or an MX-capable one (b200, mi355x)"))
    if f8 is not None and "fp8" not in device.peak_flop_per_s:  # no FP8 tensor cores (A100)
        problems.append(origin_problem(
            raw, "training.fp8", f"{device.name} has no fp8 peak in its device YAML (the part does not run fp8 GEMMs)",
            f"train in {training.params_dtype} without fp8, or choose a device that runs fp8"))
    return plan, training, as_loaded, problems


# Scenario.framework values whose jobs run Megatron-Core's code (Megatron-LM launches, Primus's Megatron trainer and
# Megatron-Bridge); "primus-torchtitan" runs TorchTitan's. The one list every framework-dependent rule reads.
MEGATRON_FRAMEWORKS = ("megatron", "primus-megatron", "megatron-bridge")


def runs_megatron(framework: str) -> bool:
    return framework in MEGATRON_FRAMEWORKS


def origin_of(scenario: Scenario, dotted: str) -> str:
    """Where a resolved value came from: its own origin, the closest parent's, or 'default'."""
    return closest(scenario.origins, dotted) or "default"
