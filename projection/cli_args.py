"""Arguments shared by the sub-commands that load one scenario (inspect, memory, shapes)."""

from __future__ import annotations

import argparse


def add_scenario_args(p: argparse.ArgumentParser, formats: tuple[str, ...] = ("table", "json")) -> None:
    p.add_argument("--config", required=True, help="Primus YAML, Megatron args/script/MODEL_ARGS YAML, TorchTitan "
                   "TOML, HF config.json or a native scenario YAML (format detected from the file)")
    p.add_argument("--hardware", help="device name from hardware_specs/ (e.g. mi300x, h100-sxm) or a YAML path")
    p.add_argument("--nodes", type=int, help="number of nodes")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the device's usual count)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value, in the config file's own key space (repeatable)")
    p.add_argument("--primus-root", help="a Primus checkout whose primus/configs presets resolve the experiment")
    p.add_argument("--format", choices=formats, default=formats[0])
