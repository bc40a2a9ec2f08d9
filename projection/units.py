"""SI units and unit parsing.

Glossary. Inside the package every quantity is SI: seconds (`_s`), bytes (`_bytes`), FLOP (`_flop`), FLOP/s
(`_flop_per_s`), bytes/s (`_bytes_per_s`). Decimal prefixes (GB = 1e9 bytes) unless the text says GiB (2**30).
Parallel axes: tp tensor, sp sequence (TP-sharded norms/dropout), pp pipeline, vpp virtual pipeline chunks per rank,
cp context, dp data, ep expert, etp expert-tensor, edp expert-data (= world / (etp * ep * pp)).

Parsers accept a number (already SI, returned as float) or a string "<number>[ ]<prefix><unit>". Booleans are
rejected (YAML `yes`/`true` is never a quantity), and so are negative, infinite and NaN values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from numbers import Real

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "ki": 2.0**10, "mi": 2.0**20,
           "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}
_QTY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]i?)?\s*([A-Za-z/]*)\s*$")
_BYTE_UNITS = {"b", "bytes", "byte", ""}
_BYTE_RATE_UNITS = {"B/s", "Bps"}  # case-sensitive; spelled-out forms below are matched case-insensitively
_BIT_RATE_UNITS = {"b/s", "bps"}
_FLOP_RATE_UNITS = {"flop/s", "flops", "flop", ""}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(s|ms|us|µs|μs|ns|min|h)?\s*$")
# Sub-second units divide (5 / 1e6 == 5e-06 exactly; 5 * 1e-6 is not); longer ones multiply.
_PER_SECOND = {None: 1.0, "s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "μs": 1e6, "ns": 1e9}
_SECONDS_PER = {"min": 60.0, "h": 3600.0}

GiB = 2**30
GB = 10**9


def parse_bytes(text: str | int | float) -> float:
    """Bytes from '192GB' (1.92e11), '64GiB' (68719476736), '1.5e9' or a bare number (123 -> 123.0). An upper-case
    prefix before a lower-case 'b' ('192Gb') is refused: datasheets write bits so (parse_bandwidth reads '400Gb/s' as
    bits), a factor of 8 away from the bytes meant."""
    m = _QTY.match(text) if isinstance(text, str) else None
    if m and m.group(3) == "b" and m.group(2) and m.group(2)[0].isupper():
        raise ValueError(f"{text!r} reads as bits ({m.group(2)}b), not bytes: write {m.group(1)}{m.group(2)}B")
    return _parse(text, "bytes", lambda unit: 1.0 if unit.lower() in _BYTE_UNITS else None)


def parse_bandwidth(text: str | int | float) -> float:
    """Bytes/s from '400Gbps' or '400Gb/s' (bits: 5e10), '50GB/s' (bytes: 5e10) or a bare number (bytes/s).

    Case matters for the unit, as in vendor datasheets: 'b' is a bit, 'B' is a byte."""

    def scale(unit: str) -> float | None:
        if unit in _BYTE_RATE_UNITS or unit.lower() in ("", "bytes/s", "byte/s"):
            return 1.0
        if unit in _BIT_RATE_UNITS or unit.lower() in ("bit/s", "bits/s"):
            return 1.0 / 8.0
        return None

    return _parse(text, "bandwidth", scale)


def parse_flop_rate(text: str | int | float) -> float:
    """FLOP/s from '1307.4 TFLOP/s' (1.3074e15), '2.5PFLOPS', '989.4e12' or a bare number (FLOP/s)."""
    return _parse(text, "FLOP rate", lambda unit: 1.0 if unit.lower() in _FLOP_RATE_UNITS else None)


def parse_duration(text: str | int | float) -> float:
    """Seconds from '2us' / '2µs' (2e-6), '0.45 us', '3ms', '1.5s', '1e-6' or a bare number (seconds).

    Own table because 'm' means milli here (ms), not mega as in the byte prefixes."""
    if not isinstance(text, str):
        return _number(text, "duration")
    m = _DURATION.match(text)
    if not m and _DURATION.match(text.strip().removeprefix("-")):
        raise ValueError(f"duration {text!r} is negative: a time must be >= 0")
    if not m:
        raise ValueError(f"cannot parse duration {text!r} (expected e.g. '2us', '3ms', '1.5s' or seconds)")
    unit = m.group(2)
    return float(m.group(1)) * _SECONDS_PER[unit] if unit in _SECONDS_PER else float(m.group(1)) / _PER_SECOND[unit]


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"expected a {what} (number or string with a unit), got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out < 0:
        raise ValueError(f"expected a finite, non-negative {what}, got {value!r}")
    return out


def _parse(text: str | int | float, what: str, scale_of: Callable[[str], float | None]) -> float:
    if not isinstance(text, str):
        return _number(text, what)
    m = _QTY.match(text)
    if not m:
        raise ValueError(f"cannot parse {what} {text!r}")
    scale = scale_of(m.group(3))
    if scale is None:
        raise ValueError(f"unknown {what} unit {m.group(3)!r} in {text!r}")
    return float(m.group(1)) * _PREFIX[(m.group(2) or "").lower()] * scale


def parse_cublas_workspace_config(value: str) -> int | None:
    """Bytes of a CUBLAS_WORKSPACE_CONFIG value (":4096:8" -> 8 chunks of 4096 KiB = 32 MiB; several ":SIZE:COUNT"
    pairs add up); None if it does not parse (PyTorch then warns and uses its default)."""
    pairs = re.findall(r":([0-9]+):([0-9]+)", value)
    if not pairs:
        return None
    return sum(int(size) * 1024 * int(count) for size, count in pairs)


# The variables that hold the job's allocator settings: the device-generic PYTORCH_ALLOC_CONF (2.9 on) and the
# device-specific PYTORCH_CUDA_ALLOC_CONF / PYTORCH_HIP_ALLOC_CONF. Which PyTorch reads first has changed between
# versions (projection.formats.job_env refuses two that disagree).
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def alloc_conf_expandable_segments(value: str) -> bool | None:
    """The expandable_segments setting of an allocator-config value ("expandable_segments:True,max_split_size_mb:512"
    -> True), None when the value does not set it. PyTorch's lexer splits on ',' ':' '[' ']' and drops spaces, and
    accepts only `True` or `False` here (c10 AllocatorConfig::parseArgs); anything else fails the job at start-up,
    so it raises ValueError."""
    tokens = [t for t in re.split(r"([,:\[\]])", value.replace(" ", "")) if t]
    found: bool | None = None
    for i, tok in enumerate(tokens):
        if tok != "expandable_segments":
            continue
        setting = tokens[i + 2] if i + 2 < len(tokens) and tokens[i + 1] == ":" else ""
        if setting not in ("True", "False"):
            raise ValueError(f"expandable_segments takes True or False (PyTorch accepts no other spelling), got "
                             f"{setting or 'nothing'!r} in {value!r}")
        found = setting == "True"
    return found
