"""Shared loader helpers: reading YAML/TOML/JSON with clear errors and line numbers, and `--set KEY=VALUE`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import yaml

from projection.errors import COMMAND_LINE, ConfigError, Problem
from projection.fileio import (
    MAX_YAML_KEYS,
    DuplicateJsonKey,
    YamlTooDeep,
    loads_json_unique,
    parse_yaml,
    require_regular,
)

KeyPath = tuple[str, ...]


def too_deep(path: Path | str, what: str) -> ConfigError:
    """The error of a file nested deeper than the parser's recursion allows (it raised RecursionError): a config is
    a few levels deep, so this is a generated or damaged file, not one to support."""
    return ConfigError(Problem(f"{what} is nested too deeply to read (more than 100 levels of lists or mappings)",
                               file=str(path), fix="flatten the nesting (a config needs a few levels); check that "
                               "this is the file you meant"))


def read_text(path: Path) -> str:
    if not path.exists():
        raise ConfigError(Problem(f"file not found: {path}", file=str(path),
                                  fix="check the path (relative paths are taken from the current directory)"))
    if path.is_dir():
        raise ConfigError(Problem(f"{path} is a directory, not a config file", file=str(path),
                                  fix="pass the YAML/TOML/JSON file itself"))
    require_regular(path)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(Problem(f"cannot read file: {e}", file=str(path), fix="check permissions and encoding")) \
            from None


def load_yaml(path: Path, text: str | None = None) -> tuple[Any, dict[KeyPath, int]]:
    """Parse YAML safely; also return the 1-based line of every mapping key, keyed by its path of keys."""
    text = read_text(path) if text is None else text
    try:
        node, data = parse_yaml(text)
    except YamlTooDeep:
        raise too_deep(path, "the YAML") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(Problem(f"YAML syntax error: {problem}", file=str(path), line=line,
                                  fix="fix the YAML syntax at that line (indentation, quotes, ':' after keys)")) \
            from None
    except RecursionError:
        raise too_deep(path, "the YAML") from None
    lines: dict[KeyPath, int] = {}
    duplicates: list[Problem] = []
    if node is not None:
        try:
            _walk(node, (), lines, duplicates, str(path))
        except RecursionError:  # yaml.compose nests deeper than _walk before it fails: kept as a safety net
            raise too_deep(path, "the YAML") from None
    if duplicates:  # yaml.safe_load keeps the last one silently; the user meant one of them
        raise ConfigError(duplicates)
    return data, lines


def _walk(node: yaml.Node, prefix: KeyPath, lines: dict[KeyPath, int], duplicates: list[Problem], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                path = (*prefix, str(k.value))
                line = k.start_mark.line + 1
                if path[-1] in seen:
                    duplicates.append(Problem(f"duplicate key (first set at line {seen[path[-1]]}); YAML would keep "
                                              "only the last one", key=".".join(path), file=file, line=line,
                                              fix="keep one of the two entries (merge their contents)"))
                seen.setdefault(path[-1], line)
                lines[path] = line
                if len(lines) > MAX_YAML_KEYS:  # aliases of aliases expand without bound (a "billion laughs" file)
                    raise ConfigError(Problem(f"the YAML expands to more than {MAX_YAML_KEYS:,} keys (anchors and "
                                              "aliases repeated into each other)", file=file,
                                              fix="write the config out without nested aliases; a config has a few "
                                                  "hundred keys"))
                _walk(v, path, lines, duplicates, file)


def load_toml(path: Path, text: str | None = None) -> tuple[dict[str, Any], dict[KeyPath, int]]:
    """Parse TOML; also return the line of every `key = value` (by section path), found by a light scan since
    tomllib keeps no positions."""
    text = read_text(path) if text is None else text
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(Problem(f"TOML syntax error: {e}", file=str(path),
                                  fix="fix the TOML syntax (quotes around strings, [section] headers)")) from None
    except RecursionError:
        raise too_deep(path, "the TOML") from None
    lines: dict[KeyPath, int] = {}
    section: KeyPath = ()
    for i, raw in enumerate(text.splitlines(), 1):
        s = raw.split("#", 1)[0].strip()
        if s.startswith("[") and s.endswith("]"):
            section = tuple(p.strip().strip('"') for p in s.strip("[]").split("."))
            lines.setdefault(section, i)
        elif "=" in s:
            key = s.split("=", 1)[0].strip().strip('"')
            lines[(*section, *key.split("."))] = i
    return data, lines


def load_json(path: Path, text: str | None = None) -> tuple[Any, dict[KeyPath, int]]:
    """Parse JSON; line numbers of top-level keys found by a light scan."""
    text = read_text(path) if text is None else text
    text = text.removeprefix("\ufeff")  # a byte-order mark, as the YAML reader takes it
    try:
        data = loads_json_unique(text)
    except json.JSONDecodeError as e:
        raise ConfigError(Problem(f"JSON syntax error: {e.msg}", file=str(path), line=e.lineno,
                                  fix="fix the JSON syntax at that line")) from None
    except DuplicateJsonKey as e:
        raise ConfigError(Problem(str(e), key=e.key, file=str(path), line=e.line,
                                  fix="keep one of them (a JSON reader would silently take the last)")) from None
    except RecursionError:
        raise too_deep(path, "the JSON") from None
    lines: dict[KeyPath, int] = {}
    if isinstance(data, dict):
        for i, raw in enumerate(text.splitlines(), 1):
            s = raw.strip()
            if s.startswith('"') and '":' in s:
                key = s[1:s.index('"', 1)]
                if key in data:
                    lines.setdefault((key,), i)
    return data, lines


def coerce_scalar(text: str) -> Any:
    """'8' -> 8, '1e-5' -> 1e-05, 'true' -> True, 'null' -> None, '[1,2]' -> [1, 2], anything else stays a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_set(items: list[str] | tuple[str, ...] | None) -> dict[str, Any]:
    """`--set KEY=VALUE` items -> {KEY: value}. Values are read as YAML scalars."""
    out: dict[str, Any] = {}
    problems = []
    for item in items or ():
        if "=" not in item:
            problems.append(Problem(f"--set {item!r} is not KEY=VALUE", key=item, file=COMMAND_LINE,
                                    fix="write it as --set key=value, e.g. --set plan.tp=8 (or the config's own key)"))
            continue
        k, v = item.split("=", 1)
        if not v.strip():  # an empty value would reset the key to its default without a word
            problems.append(Problem(f"--set {item!r} gives {k.strip() or 'the key'} no value", key=k.strip() or item,
                                    file=COMMAND_LINE, fix=f"give a value (--set {k.strip() or 'key'}=VALUE), or "
                                    "null to clear a key that may be unset"))
            continue
        key = k.strip().lstrip("-")
        if key and "" in key.split("."):  # `plan..tp`, `.tp`, `plan.`: an empty part names no key (no key at all:
            # the loaders' own "give a key before '='")
            problems.append(Problem(f"--set {item!r}: the key {k.strip()!r} has an empty part", key=k.strip() or item,
                                    file=COMMAND_LINE, fix="write the key's parts with single dots, e.g. "
                                    "--set plan.tp=8"))
            continue
        out[key] = coerce_scalar(v.strip())
    if problems:
        raise ConfigError(problems)
    return out


def set_nested(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = {}
            node[p] = child
        node = child
    node[parts[-1]] = value


def one_slip(a: str, b: str) -> bool:
    """True when a and b differ by one inserted or deleted character, or by one swap of neighbouring characters
    (the typos a reader makes; a substituted character is not counted: real flags differ that way, fp4/fp8)."""
    if a == b:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
    if abs(len(a) - len(b)) != 1:
        return False
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long_[i]:
        i += 1
    return short[i:] == long_[i + 1:]

