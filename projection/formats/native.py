"""Our own scenario YAML: four sections in the canonical key space.

    model: llama3.1_70B            # a preset name from models/, a path to a preset or an HF config.json,
                                   # or an inline mapping of ModelSpec fields
    training: {seq_length: 8192, micro_batch_size: 1, global_batch_size: 256}
    plan: {tp: 8, pp: 4, vpp: 5, sharding: {zero_stage: 1}}
    cluster: {hardware: mi300x, nodes: 4, gpus_per_node: 8}

`model_overrides:` may patch fields of a preset (e.g. `{num_layers: 40}`). `--set` keys are canonical dotted paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem
from projection.fileio import not_regular
from projection.formats.common import KeyPath, load_json, load_yaml
from projection.formats.hf import apply_canonical_overrides, hf_model_fields, is_hf_config
from projection.paths import MODELS_DIR
from projection.specs.scenario import Origin, RawScenario

SECTIONS = ("model", "model_overrides", "training", "plan", "cluster", "name", "description")


def is_native(data: Any) -> bool:
    return isinstance(data, dict) and "model" in data and bool({"training", "plan", "cluster"} & set(data))


def list_presets(models_dir: Path = MODELS_DIR) -> list[str]:
    return sorted(p.stem for p in models_dir.glob("*.yaml"))


def load_native(path: Path, overrides: dict[str, Any] | None = None, models_dir: Path = MODELS_DIR) -> RawScenario:
    data, lines = load_yaml(path)
    file = str(path)
    raw = RawScenario(source=file, framework="native")
    # an unknown top-level key is dropped and reported with the layout's own problems (build_scenario), so a misspelt
    # section does not hide them
    raw.deferred += [Problem("unknown top-level key", key=str(k), file=file, line=lines.get((k,)),
                             fix=f"use only {', '.join(SECTIONS)}") for k in data if k not in SECTIONS]
    model = data.get("model")
    if isinstance(model, str):
        _load_model_ref(raw, model, path, lines.get(("model",)), models_dir)
    elif isinstance(model, dict):
        _put(raw, "model", model, file, lines, ("model",))
    else:
        raise ConfigError(Problem("model must be a preset name, a file path or a mapping", key="model", file=file,
                                  line=lines.get(("model",)), fix="e.g. model: llama3.1_8B"))
    for section in ("model_overrides", "training", "plan", "cluster"):
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(Problem(f"{section} must be a mapping", key=section, file=file,
                                      line=lines.get((section,)), fix=f"write {section}: {{key: value, ...}}"))
        target = "model" if section == "model_overrides" else section
        _put(raw, target, value, file, lines, (section,))
    apply_canonical_overrides(raw, overrides or {})
    return raw


def _put(raw: RawScenario, prefix: str, value: dict[str, Any], file: str, lines: dict[KeyPath, int],
         at: KeyPath) -> None:
    """Copy a mapping into the raw scenario key by key, recording lines. Nested spec sections (e.g. plan.sharding,
    model.moe) are recursed into so each leaf has its own origin."""
    for k, v in value.items():
        path = (*at, str(k))
        dotted = f"{prefix}.{k}"
        if isinstance(v, dict) and dotted not in ("model.moe.layer_pattern",):
            raw.set(dotted, {}, Origin(file, lines.get(path), ".".join(path)))
            _put(raw, dotted, v, file, lines, path)
        else:
            raw.set(dotted, v, Origin(file, lines.get(path), ".".join(path)))


def _load_model_ref(raw: RawScenario, ref: str, scenario_path: Path, line: int | None, models_dir: Path) -> None:
    """A model named by preset or by file path (relative to the scenario file)."""
    candidate = (scenario_path.parent / ref)
    preset = models_dir / (ref if ref.endswith(".yaml") else f"{ref}.yaml")
    kind = not_regular(candidate) if ref and not preset.is_file() else None
    if kind is not None:  # a directory, /dev/zero, a pipe: not a model file (it used to read "not found")
        raise ConfigError(Problem(f"model file {ref!r} is {kind}, not a preset YAML or HF config.json", key="model",
                                  file=str(scenario_path), line=line, fix="point model: at the file itself, or name "
                                  f"a preset: {', '.join(list_presets(models_dir))}"))
    if candidate.is_file():
        target = candidate
    elif preset.is_file():
        target = preset
    else:
        raise ConfigError(Problem(f"model preset or file {ref!r} not found", key="model", file=str(scenario_path),
                                  line=line, fix=f"use one of: {', '.join(list_presets(models_dir))}, or a path to "
                                  "a preset YAML / HF config.json"))
    if target.suffix == ".json":
        data, lines = load_json(target)
        if not is_hf_config(data):
            raise ConfigError(Problem("not an HF config.json", key="model", file=str(scenario_path), line=line,
                                      fix="point model: at a config.json or a preset"))
        for key, value, origin in hf_model_fields(data, str(target), lines):
            raw.set(key, value, origin)
        return
    fields, unknown = preset_model_fields(target)
    for key, value, origin in fields:
        raw.set(key, value, origin)
    raw.placeholders.update(unknown)  # what the preset leaves unknown (its vocabulary): the scenario may still set it


def preset_model_fields(path: Path) -> tuple[list[tuple[str, Any, Origin]], dict[str, Problem]]:
    """Canonical model fields of a preset (Megatron-dest-key YAML, see models/README.md), and the problems of the
    fields it stood in for (RawScenario.placeholders)."""
    from projection.formats.megatron import args_to_raw

    data, lines = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(Problem("a model preset must be a mapping of Megatron argument names", file=str(path),
                                  fix="see models/README.md"))
    origins = {k: Origin(str(path), lines.get((k,)), k) for k in data}
    sub = args_to_raw(data, origins, source=str(path), framework="preset")
    out = []
    for key, origin in sorted(sub.origins.items(), key=lambda kv: kv[0].count(".")):
        if key.startswith("model."):
            out.append((key, sub.get(key), origin))
    return out, dict(sub.placeholders)
