"""A Primus model preset given directly as the config (`primus/configs/models/megatron/<name>.yaml`, e.g.
`mixtral_8x7B_v0.1.yaml`), resolved as the experiment that names it would build it:
`modules: {pre_trainer: {framework: megatron, config: pre_trainer.yaml, model: <name>.yaml}}`.

`projection.formats.primus.resolve_experiment` sends a Primus YAML without `modules:` here, its `extends` chain
already resolved the way Primus does (paths relative to the including file, deep-merged, the file's own keys on top).
It is laid under the Megatron pre-trainer module config (the module winning, as in Primus parser.py), then `--set`
values go on top (`primus.assemble`). Module defaults come from a Primus checkout with `--primus-root`, else from the
built-in Primus defaults (projection/formats/primus_defaults.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem
from projection.formats.primus import PrimusExperiment, Tracked, assemble, from_layers, load_primus_yaml
from projection.formats.primus_defaults import MODULE_CONFIGS
from projection.specs.scenario import Origin

MODULE = "pre_trainer"
CONFIG = "pre_trainer.yaml"


def resolve_preset(model: Tracked, path: Path, overrides: Mapping[str, Any], *, primus_root: Path | None,
                   env: Mapping[str, str]) -> PrimusExperiment:
    """The Megatron trainer config of the experiment naming this preset (`model`: the preset, extends resolved)."""
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
    return assemble(module, model, path.name, Origin(str(path), None, "model"), "megatron", MODULE, overrides,
                    str(path))
