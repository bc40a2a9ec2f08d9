"""A Primus model preset given directly as the config (`primus/configs/models/megatron/<name>.yaml`, e.g.
`mixtral_8x7B_v0.1.yaml`), loaded as the experiment that names it would build it:
`modules: {pre_trainer: {framework: megatron, config: pre_trainer.yaml, model: <name>.yaml}}`.

The preset's `extends` chain is resolved the way Primus does (projection/formats/primus.py: paths relative to the
including file, deep-merged, the file's own keys on top), laid under the Megatron pre-trainer module config (the
module winning, as in Primus parser.py), then `--set` values on top. Module defaults come from a Primus checkout with
`--primus-root`, else from the built-in Primus defaults (projection/formats/primus_defaults.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem
from projection.formats.megatron import args_to_raw
from projection.formats.primus import (
    cli_layer,
    combine_module_and_model,
    from_layers,
    load_primus_yaml,
    merge_into,
)
from projection.formats.primus_defaults import MODULE_CONFIGS
from projection.specs.scenario import Origin, RawScenario

MODULE = "pre_trainer"
CONFIG = "pre_trainer.yaml"


def is_model_preset(data: Any) -> bool:
    """A Primus YAML that is not an experiment (no `modules:`) but pulls in other files with `extends:`."""
    return isinstance(data, dict) and "extends" in data and "modules" not in data and "MODEL_ARGS" not in data


def load_primus_preset(path: Path, overrides: Mapping[str, Any] | None = None, *, primus_root: Path | None = None,
                       env: Mapping[str, str] | None = None) -> RawScenario:
    env = env or {}
    model = load_primus_yaml(Path(path), env)
    if not ("num_layers" in model.data and "hidden_size" in model.data):
        raise ConfigError(Problem(
            "this Primus YAML has `extends:` but no `modules:`, and its extends chain sets no num_layers / "
            "hidden_size, so it is neither an experiment nor a Megatron model preset", key="extends", file=str(path),
            fix="pass a Primus experiment (modules: pre_trainer: {framework: megatron, config: pre_trainer.yaml, "
                "model: <preset>.yaml}) or a model preset of primus/configs/models/megatron"))
    if primus_root is not None:
        module_file = Path(primus_root) / "primus" / "configs" / "modules" / "megatron" / CONFIG
        if not module_file.is_file():
            raise ConfigError(Problem(f"{module_file} does not exist", key="--primus-root", file=str(path),
                                      fix="give the root of a Primus checkout (the folder that holds primus/configs)"))
        module = load_primus_yaml(module_file, env)
    else:
        module = from_layers(MODULE_CONFIGS[("megatron", CONFIG)])
    if "model" not in model.data:  # Primus names the model after its preset file when the preset does not
        model.data["model"] = Path(path).name
        model.origins[("model",)] = Origin(str(path), None, "model")
    merged = combine_module_and_model(module, model)
    merge_into(merged, cli_layer(overrides or {}, MODULE), null_to_none=True)
    return args_to_raw(merged.data, {".".join(p): o for p, o in merged.origins.items()}, source=str(path),
                       framework="primus-megatron")
