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

from projection.errors import COMMAND_LINE, ConfigError, Problem
from projection.formats.megatron_args import DESTS, canonical_dest

CANONICAL_SECTIONS = ("model", "training", "plan", "cluster")


def split_set(overrides: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Primus keys, canonical keys) of a Primus Megatron experiment's `--set` values."""
    canonical = {k: v for k, v in overrides.items() if "." in k and k.split(".")[0] in CANONICAL_SECTIONS}
    return {k: v for k, v in overrides.items() if k not in canonical}, canonical


def unknown_set_keys(overrides: Mapping[str, Any], trainer: str, file_keys: Callable[[], Mapping[str, Any]]) -> None:
    """ConfigError listing every `--set` key (after Primus's optional `modules.<trainer>.[overrides.]` prefix) that is
    not a Megatron argument projection reads and not a key of the experiment (`file_keys`, resolved without --set,
    is called only when some key needs it)."""
    candidates = []
    for dotted in overrides:
        key = dotted
        for prefix in (f"modules.{trainer}.overrides.", f"modules.{trainer}."):
            if key.startswith(prefix):
                key = key[len(prefix):]
                break
        if canonical_dest(key) not in DESTS:
            candidates.append((dotted, key))
    if not candidates:
        return
    known = file_keys()
    problems = []
    for dotted, key in candidates:
        if key in known:
            continue  # an argument the experiment sets that nothing here reads (lr): merged, unused
        dashed = canonical_dest(key.replace("-", "_"))
        close = [dashed] if dashed in DESTS else difflib.get_close_matches(key, list(DESTS), n=3)
        problems.append(Problem(
            f"--set {dotted}: not a Megatron argument this projection reads, nor a key of the experiment",
            key=dotted, file=COMMAND_LINE,
            fix=f"did you mean {', '.join(close)}?" if close else "use a Megatron argument name (e.g. "
            "tensor_model_parallel_size) or a canonical key (e.g. training.global_batch_size)"))
    if problems:
        raise ConfigError(problems)
