"""`${VAR}` / `${VAR:default}` interpolation in Primus YAML, as Primus's yaml_loader does it (AMD-AGI/Primus
@fd1eeab core/config/yaml_loader.py): step 1 of the merge in primus.py, applied to each string before `extends`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from projection.errors import ConfigError, Problem

# Primus's pattern (yaml_loader.py ENV_PATTERN): the name has no ':', '{' or '}'; the default may be empty or hold ':'.
_VAR = re.compile(r"\$\{([^:{}]+)(?::([^}]*))?\}")
_INT = re.compile(r"-?\d+")


def substitute_env(text: str, env: Mapping[str, str], *, file: str | None = None, line: int | None = None,
                   key: str | None = None) -> Any:
    """Replace `${VAR}` / `${VAR:default}` in `text` from `env`. If anything was replaced, the whole result is coerced
    (so `${TP:1}` -> 1, `${X:null}` -> "null", `a${X:1}` -> "a1"); otherwise `text` is returned unchanged.
    An unset `${VAR}` without a default is a ConfigError located at file/line/key."""
    replaced = False

    def one(m: re.Match[str]) -> str:
        nonlocal replaced
        name, default = m.group(1), m.group(2)
        if name in env:  # an empty value counts as set (Primus reads the process environment with a default)
            value = env[name]
        elif default is not None:
            value = default
        else:
            raise ConfigError(Problem(f"environment variable {name} is not set and ${{{name}}} has no default",
                                      key=key, file=file, line=line,
                                      fix=f"set {name} in the environment or give a default ${{{name}:value}}"))
        replaced = True
        return value

    out = _VAR.sub(one, text)
    return _coerce(out) if replaced else text


def _coerce(text: str) -> Any:
    """Primus yaml_loader._resolve_env_in_string: true/false (any case) -> bool, integer -> int, float -> float."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text
