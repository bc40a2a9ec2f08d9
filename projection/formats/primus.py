"""AMD Primus experiment YAML -> RawScenario, following Primus's own merge exactly (config-formats.md §2.2).

Order (AMD-AGI/Primus @fd1eeab: core/config/yaml_loader.py, core/launcher/parser.py, core/utils/yaml_utils.py):
1. each file: safe-load, `${VAR}` / `${VAR:default}` substituted from `env` (a string where one was replaced is
   coerced whole: bool/int/float), then `extends` (paths relative to the including file) deep-merged left to right
   with the file's own keys on top; deep merge = dicts merge, anything else (lists too) is replaced whole;
2. module config `primus/configs/modules/<fw>/<config>` + model preset `primus/configs/models/<fw>/<model>`, the
   **module winning** (a model key already in the module config is skipped silently);
3. the experiment's `overrides`, then `--set` overrides, deep-merged on top ("null" becomes None on this path).
Without a Primus checkout, module configs come from `primus_defaults` and model presets from our `models/`. The
result goes to the Megatron loader (flat argparse dests) or the TorchTitan loader (JobConfig sections), with the
Origin (file, line, key) of every final key.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem
from projection.formats.common import load_yaml, set_nested
from projection.formats.megatron import args_to_raw
from projection.formats.primus_defaults import (
    MODEL_BASE,
    MODULE_CONFIGS,
    ORIGIN_PREFIX,
    TORCHTITAN_MODEL_PRESETS,
    Layer,
)
from projection.formats.primus_env import substitute_env
from projection.formats.primus_set import set_dest, split_set, unknown_override_keys, unknown_set_keys
from projection.formats.torchtitan import job_config_to_raw
from projection.paths import MODELS_DIR
from projection.specs.scenario import Origin, RawScenario

KeyPath = tuple[str, ...]

# Primus module `framework` values and the preset folder each reads (parser.py get_model_format).
_FRAMEWORKS = {"megatron": "megatron", "light-megatron": "megatron", "torchtitan": "torchtitan"}
_UNSUPPORTED = ("maxtext", "megatron_bridge")
# Primus logging bookkeeping (primus/configs/modules/module_base.yaml): not JobConfig sections, so not for TorchTitan.
_MODULE_BASE_KEYS = frozenset({"trainable", "sink_level", "file_sink_level", "stderr_sink_level"})
CLI = "--set"  # the Origin file of --set values, as the Megatron and TorchTitan loaders name it


@dataclass
class Tracked:
    """A config tree and the Origin of every key path in it (dict nodes included)."""

    data: dict[str, Any]
    origins: dict[KeyPath, Origin]


@dataclass(frozen=True)
class PrimusExperiment:
    """The resolved trainer config of one experiment: what the Primus trainer would receive. framework: 'megatron'
    (params = flat argparse dests) or 'torchtitan' (nested JobConfig sections); module: e.g. 'pre_trainer';
    origins: dotted key path -> where its value was set."""

    framework: str
    module: str
    params: dict[str, Any]
    origins: dict[str, Origin]
    source: str
    deferred: tuple[Problem, ...] = ()  # unknown override keys of a Megatron module: reported with the layout's


def is_primus_experiment(data: Any) -> bool:
    """True for a Primus experiment: a mapping with `modules`, one of whose keys contains "trainer" and holds
    `framework`, `config` or `model` (Primus parse_modules accepts only module names containing "trainer")."""
    modules = data.get("modules") if isinstance(data, dict) else None
    if not isinstance(modules, dict):
        return False
    return any("trainer" in str(name) and isinstance(m, dict) and any(k in m for k in ("framework", "config", "model"))
               for name, m in modules.items())


def load_primus_yaml(path: Path, env: Mapping[str, str], _active: tuple[Path, ...] = ()) -> Tracked:
    """One Primus YAML file with `${VAR}` substitution and its `extends` chain resolved (Primus parse_yaml)."""
    data, lines = load_yaml(path)
    file = str(path)
    if data is None:
        raise ConfigError(Problem("the YAML file is empty", file=file, fix="give it a mapping of keys"))
    if not isinstance(data, dict):
        raise ConfigError(Problem(f"expected a mapping of keys at the top level, got {type(data).__name__}",
                                  file=file, fix="write the config as `key: value` lines"))
    data = _substitute(data, env, file, lines, ())
    extends = data.pop("extends", None)
    own = Tracked(data, {p: Origin(file, n, ".".join(p)) for p, n in lines.items() if p[0] != "extends"})
    _fill_origins(own.data, own.origins, file, ())
    if extends is None:
        return own
    here = path.resolve()
    merged = Tracked({}, {})

    def bad(message: str, fix: str) -> ConfigError:
        return ConfigError(Problem(message, key="extends", file=file, line=lines.get(("extends",)), fix=fix))

    for ext in extends if isinstance(extends, list) else [extends]:
        if not isinstance(ext, str):
            raise bad(f"extends entry {ext!r} is not a file name", "list YAML file names under extends")
        target = Path(os.path.normpath(path.parent / ext))
        if not target.is_file():
            raise bad(f"extends names {ext!r}, but {target} does not exist",
                      "extends paths are relative to the file that contains them")
        if target.resolve() in (*_active, here):
            raise bad(f"extends loop: {target} includes itself", "remove the circular extends")
        merge_into(merged, load_primus_yaml(target, env, (*_active, here)))
    merge_into(merged, own)
    return merged


def _substitute(value: Any, env: Mapping[str, str], file: str, lines: Mapping[KeyPath, int], path: KeyPath) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v, env, file, lines, (*path, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, env, file, lines, path) for v in value]
    if isinstance(value, str):
        return substitute_env(value, env, file=file, line=_nearest(lines, path), key=".".join(path) or None)
    return value


def _nearest(table: Mapping[KeyPath, Any], path: KeyPath) -> Any:
    """The entry of `path` or of its closest ancestor (None if there is none)."""
    while path and path not in table:
        path = path[:-1]
    return table[path] if path else None


def _fill_origins(data: Any, origins: dict[KeyPath, Origin], file: str, prefix: KeyPath) -> None:
    """Give keys without a line of their own (e.g. from YAML merge keys) the line of their closest ancestor."""
    if not isinstance(data, dict):
        return
    for k, v in data.items():
        path = (*prefix, str(k))
        if path not in origins:
            near = _nearest(origins, prefix)
            origins[path] = Origin(file, near.line if near else None, ".".join(path))
        _fill_origins(v, origins, file, path)


def merge_into(dst: Tracked, src: Tracked, *, null_to_none: bool = False) -> None:
    """Deep-merge `src` onto `dst` in place (Primus merge_utils.deep_merge): dicts merge, anything else is replaced
    whole. With `null_to_none` (the override path) non-dict values equal to "null" become None."""
    _merge(dst.data, dst.origins, src.data, src.origins, (), null_to_none)


def _merge(dst: dict[str, Any], dorg: dict[KeyPath, Origin], src: Mapping[str, Any], sorg: Mapping[KeyPath, Origin],
           prefix: KeyPath, null_to_none: bool) -> None:
    for key, value in src.items():
        path = (*prefix, str(key))
        current = dst.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            if path not in dorg and path in sorg:
                dorg[path] = sorg[path]
            _merge(current, dorg, value, sorg, path, null_to_none)
            continue
        if isinstance(current, dict):
            for p in [p for p in dorg if p[:len(path)] == path]:
                del dorg[p]
        dst[key] = _nulls_to_none(value) if null_to_none else copy.deepcopy(value)
        _copy_origins(sorg, dorg, path, value)


def _copy_origins(sorg: Mapping[KeyPath, Origin], dorg: dict[KeyPath, Origin], path: KeyPath, value: Any) -> None:
    if path in sorg:
        dorg[path] = sorg[path]
    if isinstance(value, dict):
        dorg.update({p: o for p, o in sorg.items() if len(p) > len(path) and p[:len(path)] == path})


def _nulls_to_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _nulls_to_none(v) for k, v in value.items()}
    return None if value == "null" else copy.deepcopy(value)


def combine_module_and_model(module: Tracked, model: Tracked) -> Tracked:
    """Module config + model preset, the module winning: a model key that already exists in the module config is
    dropped whole (Primus parser.py: merge_namespace(module_config, model_config, allow_override=False))."""
    out = Tracked(copy.deepcopy(module.data), dict(module.origins))
    for key, value in model.data.items():
        if key not in out.data:
            out.data[key] = copy.deepcopy(value)
            _copy_origins(model.origins, out.origins, (str(key),), value)
    return out


def from_layers(layers: tuple[Layer, ...]) -> Tracked:
    """Built-in preset layers (primus_defaults) as a Tracked config, later layers winning."""
    out = Tracked({}, {})
    for file, entries in layers:
        src = ORIGIN_PREFIX + file
        merge_into(out, _flat_layer([(k, v, Origin(src, n, k)) for k, (v, n) in entries.items()], src))
    return out


def _flat_layer(entries: list[tuple[str, Any, Origin]], node_file: str) -> Tracked:
    """(dotted key, value, origin) triples as a nested Tracked config; dotted keys nest."""
    out = Tracked({}, {})
    for dotted, value, origin in entries:
        set_nested(out.data, dotted, copy.deepcopy(value))
        parts = tuple(dotted.split("."))
        for i in range(1, len(parts)):
            out.origins.setdefault(parts[:i], Origin(node_file, None, ".".join(parts[:i])))
        out.origins[parts] = origin
    return out


def check_primus_root(primus_root: str | Path | None, config: str | Path) -> None:
    """ConfigError, located at the config, when a Primus root is given and is not a folder."""
    if primus_root is not None and not Path(primus_root).is_dir():
        what = "is not a directory" if Path(primus_root).exists() else "does not exist"
        raise ConfigError(Problem(f"Primus root {primus_root} {what}", key="--primus-root", file=str(config),
                                  fix="give the root of a Primus checkout (the folder that holds primus/configs), or "
                                  "drop --primus-root to use the built-in Primus defaults"))


def resolve_experiment(path: Path, overrides: Mapping[str, Any] | None = None, *, primus_root: Path | None = None,
                       models_dir: Path = MODELS_DIR, env: Mapping[str, str] | None = None) -> PrimusExperiment:
    """Merge a Primus experiment into the trainer config Primus would build (module docstring, steps 1-3).
    `overrides` are `--set` values: already typed, dotted keys nest (a leading `modules.<trainer>.` is optional)."""
    env = env or {}
    check_primus_root(primus_root, path)
    exp = load_primus_yaml(Path(path), env)
    if "modules" not in exp.data:  # a model preset given directly: detect_format sent it here for its `extends:`
        from projection.formats.primus_preset import resolve_preset

        return resolve_preset(exp, Path(path), overrides or {}, primus_root=primus_root, env=env)
    name = _pick_trainer(exp, str(path))
    at: KeyPath = ("modules", name)
    module = exp.data["modules"][name]
    raw_fw = _required_str(exp, module, at, "framework", "framework: megatron")
    fw = _FRAMEWORKS.get(raw_fw)
    if fw is None:
        what = "is not supported yet" if raw_fw in _UNSUPPORTED else "is not a Primus framework"
        fix = "projection reads Primus experiments with framework megatron or torchtitan; describe other jobs in " \
              "a native scenario YAML"
        if raw_fw == "megatron_bridge":  # Primus names a recipe (a Python function); its result is in the run's YAML
            fix = "give the run_config.yaml Megatron-Bridge writes in each checkpoint (or the 'Task Configuration' " \
                  "it logs), which projection reads as a Megatron-Bridge config; a Primus megatron_bridge module " \
                  "names a Python recipe, which projection does not run"
        raise ConfigError(_problem(exp, (*at, "framework"), f"framework {raw_fw!r} {what}", fix))
    config = _yaml_name(_required_str(exp, module, at, "config", "config: pre_trainer.yaml"))
    model_name = _yaml_name(_required_str(exp, module, at, "model", "model: llama3.1_8B.yaml"))
    block = module.get("overrides")
    if block is not None and not isinstance(block, dict):
        raise ConfigError(_problem(exp, (*at, "overrides"), "overrides must be a mapping of keys",
                                   "write overrides as indented `key: value` lines"))
    prefix = (*at, "overrides")
    sub = None if block is None else Tracked(block, {p[len(prefix):]: o for p, o in exp.origins.items()
                                                     if len(p) > len(prefix) and p[:len(prefix)] == prefix})
    return assemble(_module_config(exp, at, fw, config, primus_root, env),
                    _model_preset(exp, at, fw, model_name, primus_root, models_dir, env),
                    model_name, exp.origins[(*at, "model")], fw, name, overrides or {}, str(path), sub,
                    # only a checkout's own files say which keys its Primus holds: the built-in defaults carry what
                    # projection reads, and Primus versions add and rename keys (an override a newer Primus holds
                    # must not be refused by an older list)
                    check_overrides=primus_root is not None)


def assemble(module: Tracked, model: Tracked, model_name: str, name_origin: Origin, framework: str, trainer: str,
             overrides: Mapping[str, Any], source: str, block: Tracked | None = None,
             check_overrides: bool = False) -> PrimusExperiment:
    """Steps 2-3 of the module docstring: the model preset under the module config, then the experiment's
    `overrides` block and `--set` values. Primus names the model after its preset file when the preset does not.
    With `check_overrides` (a Primus checkout's files, which alone list its version's keys), an override key that
    neither the module config nor the model preset holds is refused, as Primus refuses it."""
    if "model" not in model.data:
        model.data["model"] = model_name
        model.origins[("model",)] = name_origin
    merged = combine_module_and_model(module, model)
    if block is not None:
        unknown = unknown_override_keys(block.data, block.origins, merged.data, trainer, source) \
            if check_overrides else []
        if unknown and framework != "megatron":  # TorchTitan's own schema check would name them again
            raise ConfigError(unknown)
        merge_into(merged, block, null_to_none=True)
    else:
        unknown = []
    merge_into(merged, cli_layer(overrides, trainer), null_to_none=True)
    # a Megatron module's unknown keys are argparse dests nothing reads: the layout is still checked, and they are
    # reported with its problems (RawScenario.deferred)
    return PrimusExperiment(framework=framework, module=trainer, params=merged.data, source=source,
                            origins={".".join(p): o for p, o in merged.origins.items()}, deferred=tuple(unknown))


def load_primus(path: Path, overrides: Mapping[str, Any] | None = None, *, primus_root: Path | None = None,
                models_dir: Path = MODELS_DIR, env: Mapping[str, str] | None = None) -> RawScenario:
    """Load a Primus experiment YAML into a RawScenario (framework 'primus-megatron' or 'primus-torchtitan').

    primus_root: a Primus checkout to read module configs and model presets from; without it, module configs are
    the built-in Primus defaults and model presets come from `models_dir`. env: the environment for `${VAR}`."""
    primus_keys, canonical = split_set(overrides or {})
    exp = resolve_experiment(path, primus_keys if canonical else overrides, primus_root=primus_root,
                             models_dir=models_dir, env=env)
    if exp.framework == "megatron":
        # `--set` keys that name nothing are dropped and reported with the layout's problems, like the experiment's
        # own unknown keys, so a misspelt key does not hide them
        unknown_set = unknown_set_keys(primus_keys, exp.module, lambda: resolve_experiment(
            path, {}, primus_root=primus_root, models_dir=models_dir, env=env).params, primus_root is not None)
        dropped = {set_dest(str(p.key), exp.module) for p in unknown_set}
        params = {k: v for k, v in exp.params.items() if k not in dropped}
        try:
            raw = args_to_raw(params, exp.origins, source=exp.source, framework="primus-megatron")
        except ConfigError as err:
            raise ConfigError([*exp.deferred, *unknown_set, *err.problems]) from None
        raw.deferred += [*exp.deferred, *unknown_set]
        for key, value in canonical.items():
            raw.set(key, value, Origin("--set", None, key))
        return raw
    if canonical:  # TorchTitan's JobConfig has its own model. and training. sections: the keys are its own
        exp = resolve_experiment(path, overrides, primus_root=primus_root, models_dir=models_dir, env=env)
    sections = {k: v for k, v in exp.params.items() if k not in _MODULE_BASE_KEYS}
    return job_config_to_raw(sections, exp.origins, source=exp.source, framework="primus-torchtitan")


def _problem(t: Tracked, path: KeyPath, message: str, fix: str, file: str | None = None) -> Problem:
    o = _nearest(t.origins, path)
    return Problem(message, key=".".join(path), file=o.file if o else file, line=o.line if o else None, fix=fix)


def _pick_trainer(exp: Tracked, file: str) -> str:
    """The trainer module: the only one, else pre_trainer, else post_trainer (Primus aliases the two)."""
    modules = exp.data.get("modules")
    names = [str(k) for k in modules if "trainer" in str(k)] if isinstance(modules, dict) else []
    if len(names) == 1:
        return names[0]
    for preferred in ("pre_trainer", "post_trainer"):
        if preferred in names:
            return preferred
    if not names:
        raise ConfigError(_problem(exp, ("modules",), "no trainer module: expected `modules:` with a key such as "
                                   "pre_trainer", "add modules: {pre_trainer: {framework: ..., config: ..., "
                                   "model: ...}}", file))
    raise ConfigError(_problem(exp, ("modules",), f"several trainer modules ({', '.join(names)}); cannot tell which "
                               "one to project", "keep one trainer module, or name it pre_trainer", file))


def _required_str(exp: Tracked, module: Any, at: KeyPath, key: str, example: str) -> str:
    value = module.get(key) if isinstance(module, dict) else None
    if not isinstance(value, str) or not value:
        raise ConfigError(_problem(exp, (*at, key), f"module {at[-1]} needs a `{key}` (a name), got {value!r}",
                                   f"add `{example}` under modules.{at[-1]}"))
    return value


def _yaml_name(name: str) -> str:
    """Primus PresetLoader: a preset name without .yaml/.yml gets .yaml appended."""
    return name if name.endswith((".yaml", ".yml")) else name + ".yaml"


def _module_config(exp: Tracked, at: KeyPath, fw: str, config: str, root: Path | None,
                   env: Mapping[str, str]) -> Tracked:
    if root is not None:
        folder = Path(root) / "primus" / "configs" / "modules" / fw
        if (folder / config).is_file():
            return load_primus_yaml(folder / config, env)
        raise _missing(exp, (*at, "config"), "module config", config, _yaml_files(folder), str(folder), root=True)
    layers = MODULE_CONFIGS.get((fw, config))
    if layers is None:
        known = sorted(c for f, c in MODULE_CONFIGS if f == fw)
        raise _missing(exp, (*at, "config"), "module config", config, known, "the built-in Primus defaults")
    return from_layers(layers)


def _model_preset(exp: Tracked, at: KeyPath, fw: str, model: str, root: Path | None, models_dir: Path,
                  env: Mapping[str, str]) -> Tracked:
    if root is not None:
        folder = Path(root) / "primus" / "configs" / "models" / fw
        if (folder / model).is_file():
            return load_primus_yaml(folder / model, env)
        raise _missing(exp, (*at, "model"), "model preset", model, _yaml_files(folder), str(folder), root=True)
    folders = [models_dir / fw, models_dir] if fw == "megatron" else [models_dir / fw]
    for folder in folders:
        if (folder / model).is_file():
            # Our presets are self-contained; Primus's all sit on language_model.yaml, so lay that base under them.
            merged = from_layers(MODEL_BASE.get(fw, ()))
            merge_into(merged, load_primus_yaml(folder / model, env))
            return merged
    if fw == "torchtitan" and model in TORCHTITAN_MODEL_PRESETS:
        return from_layers((TORCHTITAN_MODEL_PRESETS[model],))
    known = sorted({n for f in folders for n in _yaml_files(f)}
                   | (set(TORCHTITAN_MODEL_PRESETS) if fw == "torchtitan" else set()))
    where = " and ".join(str(f) for f in folders) + (" or the built-in presets" if fw == "torchtitan" else "")
    raise _missing(exp, (*at, "model"), "model preset", model, known, where)


def _yaml_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.y*ml")) if folder.is_dir() else []


def _missing(exp: Tracked, path: KeyPath, what: str, name: str, known: list[str], where: str,
             root: bool = False) -> ConfigError:
    listing = ", ".join(known) if known else "none"
    fix = (f"use one of the {what}s there" if root else
           f"use one of these {what}s, or pass --primus-root PATH (a Primus checkout) to read Primus's own")
    return ConfigError(_problem(exp, path, f"{what} {name!r} not found in {where}; available: {listing}", fix))


def cli_layer(overrides: Mapping[str, Any], module: str) -> Tracked:
    """`--set` values as a Tracked layer; dotted keys nest, `modules.<module>.[overrides.]` prefixes are dropped."""
    entries = []
    for dotted, value in overrides.items():
        key = str(dotted)
        for prefix in (f"modules.{module}.overrides.", f"modules.{module}."):
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        entries.append((key, value, Origin(CLI, None, str(dotted))))
    return _flat_layer(entries, CLI)
