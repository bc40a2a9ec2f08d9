"""Pick the loader for a config file from its name and content, then load it into a RawScenario."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem
from projection.formats.bridge_fields import is_bridge
from projection.formats.common import load_yaml, read_text
from projection.paths import MODELS_DIR
from projection.specs.scenario import RawScenario

FORMATS = ("primus", "megatron", "megatron-bridge", "torchtitan", "hf", "native")


def detect_format(path: Path) -> str:
    """One of FORMATS, from the suffix and the content."""
    text = read_text(path)
    suffix = path.suffix.lower()
    if not text.strip():  # an empty TOML would load as TorchTitan's defaults (its debug model) without a word
        raise ConfigError(_empty(path, "is empty"))
    if suffix == ".toml":
        if all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()):  # comments only:
            raise ConfigError(_empty(path, "holds no settings"))  # the loader would parse it again for nothing
        return "torchtitan"
    if suffix == ".json":
        return "hf"
    if suffix in (".sh", ".bash") or text.startswith("#!"):
        return "megatron"
    if suffix in (".yaml", ".yml"):
        data, _ = load_yaml(path, text)
        if data is None:
            raise ConfigError(_empty(path, "holds no settings"))
        if isinstance(data, dict):
            if "modules" in data or ("extends" in data and "MODEL_ARGS" not in data):
                return "primus"  # an experiment, or a model preset that pulls in others (formats/primus_preset.py)
            if "MODEL_ARGS" in data:
                return "megatron"
            if is_bridge(data):
                return "megatron-bridge"  # a ConfigContainer: run_config.yaml, or the sections it holds
            if "model" in data and ({"training", "plan", "cluster"} & set(data) or len(data) == 1):
                return "native"
            if "num_layers" in data and "hidden_size" in data:
                return "megatron"  # a flat file of Megatron argument names, e.g. a models/ preset
        raise ConfigError(Problem(
            "cannot tell which format this YAML is", file=str(path),
            fix="a Primus experiment has 'modules:' (a Primus model preset 'extends:' or num_layers / hidden_size), "
                "a Megatron test config 'MODEL_ARGS:', a Megatron-Bridge config 'model:' with 'train:'/'ddp:'/"
                "'dataset:', a native scenario 'model:' with 'training:'/'plan:'/'cluster:'"))
    if "--" in text:
        return "megatron"  # a plain file of Megatron flags
    raise ConfigError(Problem("unrecognised config file", file=str(path),
                              fix="use a .yaml (Primus, Megatron MODEL_ARGS, native), .toml (TorchTitan), "
                                  ".json (HF config) or a launch script / file of Megatron flags"))


def _empty(path: Path, what: str) -> Problem:
    return Problem(f"the config file {what}", file=str(path),
                   fix="give it contents (examples/ has one of each format), or pass the file you meant")


def load_raw(path: Path, overrides: Mapping[str, Any] | None = None, *, fmt: str | None = None,
             primus_root: Path | None = None, models_dir: Path = MODELS_DIR,
             env: Mapping[str, str] | None = None) -> RawScenario:
    """Load any supported config into a RawScenario. `overrides` are in the file's own key space."""
    fmt = fmt or detect_format(path)
    ov = dict(overrides or {})
    if fmt == "primus":
        from projection.formats.primus import load_primus

        return load_primus(path, ov, primus_root=primus_root, models_dir=models_dir, env=env)
    if fmt == "megatron":
        from projection.formats.megatron_files import load_megatron

        return load_megatron(path, ov, env=env)
    if fmt == "megatron-bridge":
        from projection.formats.bridge import load_bridge

        return load_bridge(path, ov)
    if fmt == "torchtitan":
        from projection.formats.torchtitan import load_torchtitan

        return load_torchtitan(path, ov)
    if fmt == "hf":
        from projection.formats.hf import load_hf

        return load_hf(path, ov)
    if fmt == "native":
        from projection.formats.native import load_native

        return load_native(path, ov, models_dir)
    raise ConfigError(Problem(f"unknown format {fmt!r}", key="--format-in", fix=f"use one of {', '.join(FORMATS)}"))
