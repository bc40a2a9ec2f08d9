"""`--set` on a Primus Megatron experiment: which keys Primus merges and which are canonical, and the unknown ones.

Primus merges `--set` values into the trainer's flat Megatron arguments (primus.py, step 3), so a key that is neither
a Megatron argument projection reads nor a key the experiment already holds would be merged and then never read: it
is refused, as the Megatron loader refuses it (megatron_files.py). Dotted keys under model., training., plan. and
cluster. are projection's canonical keys (Primus's `model` is a preset file name, never a section), applied after
the Megatron arguments are read, as for the other formats.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from projection.errors import COMMAND_LINE, Problem
from projection.formats.megatron_args import DESTS, canonical_dest
from projection.formats.primus_keys import PRIMUS_MEGATRON_KEYS, PRIMUS_MODEL_BASE_KEYS
from projection.specs.plan import MEGATRON_SCHEDULES
from projection.specs.scenario import Origin

CANONICAL_SECTIONS = ("model", "training", "plan", "cluster")
_PRIMUS_KEYS = PRIMUS_MEGATRON_KEYS | PRIMUS_MODEL_BASE_KEYS  # Primus @fd1eeab's module configs and model bases


def split_set(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Primus keys, canonical keys) of a Primus Megatron experiment's `--set` values."""
    canonical = {k: v for k, v in overrides.items() if "." in k and k.split(".")[0] in CANONICAL_SECTIONS}
    return {k: v for k, v in overrides.items() if k not in canonical}, canonical


def set_dest(dotted: str, trainer: str) -> str:
    """The trainer's argument a `--set` key names, without Primus's optional `modules.<trainer>.[overrides.]`."""
    for prefix in (f"modules.{trainer}.overrides.", f"modules.{trainer}."):
        if dotted.startswith(prefix):
            return dotted[len(prefix):]
    return dotted


def unknown_set_keys(overrides: Mapping[str, Any], trainer: str, file_keys: Callable[[], Mapping[str, Any]],
                     primus_root_given: bool = False) -> list[Problem]:
    """The problem of every `--set` key (after Primus's optional `modules.<trainer>.[overrides.]` prefix) that is
    not a Megatron argument projection reads, not a key of Primus's Megatron module configs (primus_keys) and not a
    key of the experiment (`file_keys`: resolved without --set, nested keys by their dotted path; called only when
    some key needs it). `model` is refused too: the preset is chosen by `modules.<trainer>.model` before any override,
    so setting it would rename the model without changing it."""
    candidates, problems = [], []
    for dotted in overrides:
        key = set_dest(dotted, trainer)
        if key == "model":
            problems.append(Problem(f"--set {dotted}: the model preset is chosen by modules.{trainer}.model before "
                                    "any override, so this would rename the model without changing its architecture",
                                    key=dotted, file=COMMAND_LINE,
                                    fix=f"edit modules.{trainer}.model in the experiment, or --set the architecture's "
                                        "own keys (num_layers, hidden_size, ...)"))
        elif canonical_dest(key) not in DESTS and key.split(".")[0] not in _PRIMUS_KEYS:
            candidates.append((dotted, key))
    known = file_keys() if candidates else {}
    for dotted, key in candidates:
        if _holds(known, key):
            continue  # an argument the experiment sets that nothing here reads: merged, unused
        dashed = canonical_dest(key.replace("-", "_"))
        close = [dashed] if dashed in DESTS else difflib.get_close_matches(key, list(DESTS), n=3)
        hint = "" if primus_root_given else (" (without --primus-root the keys of Primus @fd1eeab's module configs "
                                             "are known; pass --primus-root PATH to read your version's)")
        problems.append(Problem(
            f"--set {dotted}: not a Megatron argument this projection reads, nor a key of the experiment or of "
            f"Primus's Megatron module configs{hint}", key=dotted, file=COMMAND_LINE,
            fix=f"did you mean {', '.join(close)}?" if close else "use a Megatron argument name (e.g. "
            "tensor_model_parallel_size) or a canonical key (e.g. training.global_batch_size)"))
    return problems


def _holds(params: Mapping[str, Any], dotted: str) -> bool:
    """Whether the nested params hold the dotted key path (`torch_compile.enable`)."""
    node: Any = params
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def unknown_override_keys(block: Mapping[str, Any], origins: Mapping[tuple[str, ...], Origin],
                          held: Mapping[str, Any], trainer: str, file: str) -> list[Problem]:
    """Every key of an experiment's `modules.<trainer>.overrides` block (nested mappings key by key) that the module
    config and model preset do not hold. Primus refuses these before the trainer starts (primus/core/utils/
    yaml_utils.py override_namespace: "Override namespace failed: can't find key"), so a misspelt key is not a
    setting that is silently dropped. origins: the block's key paths -> where they were written."""
    problems: list[Problem] = []

    def walk(node: Mapping[str, Any], have: Mapping[str, Any], path: tuple[str, ...]) -> None:
        for key, value in node.items():
            at = (*path, str(key))
            if key not in have:
                close = difflib.get_close_matches(str(key), [str(k) for k in have], n=3)
                o = origins.get(at)
                problems.append(Problem(
                    f"override {'.'.join(at)!r} is not a key of the module config or the model preset, so Primus "
                    "refuses it (\"Override namespace failed: can't find key\")",
                    key=f"modules.{trainer}.overrides.{'.'.join(at)}", file=o.file if o else file,
                    line=o.line if o else None,
                    fix=f"did you mean {', '.join(close)}?" if close else "remove it, or use the name the module "
                    "config (pre_trainer.yaml and what it extends) or the model preset gives the setting"))
            elif isinstance(value, Mapping) and isinstance(have[key], Mapping):
                walk(value, have[key], at)

    walk(block, held, ())
    return problems


# --schedule NAME on a Primus Megatron experiment: the keys that pick NAME as Primus picks it (megatron.py
# _primus_schedule): 1F1B and interleaved 1F1B without Primus's pipeline patches (Megatron-LM's own schedules.py),
# the zero-bubble family through `patch_zero_bubble` (ZB-H1 / ZB-H2 by the pending backwards allowed, the V schedules
# by their memory setup), so that its zero-bubble runtime's rules (megatron_checks.zero_bubble_rules) apply
_NO_PATCH = {"patch_zero_bubble": False, "patch_primus_pipeline": False}
_ZERO_BUBBLE = {"patch_zero_bubble": True, "enable_zero_bubble": True, "patch_primus_pipeline": False,
                "enable_1f1b_v": False}
_V_SETUPS = {"zbv": "zb", "v_half": "half", "v_min": "min"}
# what a Primus Megatron experiment can run: Megatron-LM's own schedules and its zero-bubble runtime's
PRIMUS_SCHEDULES = (*MEGATRON_SCHEDULES, "zb_h1", "zb_h2", *_V_SETUPS)


def schedule_overrides(schedule: str, pp: int) -> dict[str, Any] | None:
    """The Primus keys that run `schedule` on a pipeline of `pp` stages; None for a schedule Primus has no way to
    run (gpipe, DualPipe), which Megatron-LM's runtime then refuses (specs/validate_schedule.py)."""
    if schedule in MEGATRON_SCHEDULES:
        return dict(_NO_PATCH)
    if schedule in ("zb_h1", "zb_h2"):
        return {**_ZERO_BUBBLE, "zero_bubble_v_schedule": False,
                "zero_bubble_max_pending_backward": pp if schedule == "zb_h1" else 2 * pp}
    if schedule in _V_SETUPS:
        return {**_ZERO_BUBBLE, "zero_bubble_v_schedule": True, "zero_bubble_v_schedule_mem_setup": _V_SETUPS[schedule]}
    return None
