"""The rows of a mixed-device calibration (`projection calibrate import --allow-mixed-devices`) that price one device.

Each row's device is its own `device` field (collective and host rows), else the device of the provenance entry whose
source file the row's `source` names (importers write `<file>:<line>` or `<file>: <op>`; the longest such file wins,
and two provenance entries of different devices for one file leave the row's device unknown). A device name is the
projected device's where `projection.specs.device_names.device_match` says "same" or "arch", the rule that decides
whether a calibration was measured on the projected part.

Where the calibration holds rows of the projected device and of another, each table keeps the projected device's
rows only, and a row of unknown device is not used (it may be the other device's); a table left empty is priced as
if the calibration lacked it (the roofline, the device YAML's fabric and host issue time). A calibration that names
no device, or only the projected one, or only other devices (a mismatched --calibration, which
projection/perf/project.py notes), is used whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from projection.calibrate.calibration import TABLES, Calibration
from projection.specs.device_names import device_match
from projection.specs.hardware import DeviceSpec

_FALLBACK = {"gemm": "the roofline", "grouped_gemm": "the roofline", "attention": "the roofline",
             "memory_bound": "the roofline", "collective": "the device YAML's fabric",
             "host": "the device YAML's host issue time"}
_BOUNDARY_BEFORE = " (\t"
_BOUNDARY_AFTER = ": /\t,"


@dataclass(frozen=True)
class DeviceRows:
    """`calibration`: the rows that price the device. `dropped[table]`: rows of that table not used (another device's,
    or of unknown device); `others`: the other devices' names; `kept[table]`: rows kept. Empty `dropped`: used whole."""

    calibration: Calibration
    others: tuple[str, ...] = ()
    dropped: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)

    def note(self, device: str, name: str) -> str | None:
        """What a mixed calibration prices the device with, table by table; None where it is used whole."""
        if not self.dropped:
            return None
        own = [f"{t} ({self.kept[t]} of {self.kept[t] + self.dropped.get(t, 0)} rows)"
               for t in TABLES if self.kept.get(t)]
        none = [t for t in TABLES if self.dropped.get(t) and not self.kept.get(t)]
        text = f"calibration {name} also holds measurements of {', '.join(self.others)}: {device} is priced from " \
               f"its own rows only"
        text += f" ({', '.join(own)})" if own else " (it has none)"
        if none:
            text += f"; its {', '.join(none)} rows are all another device's (or of no named device): priced as " \
                    f"without them ({', '.join(dict.fromkeys(_FALLBACK[t] for t in none))})"
        return text


def row_device(row: object, sources: list[tuple[str, str]]) -> str | None:
    """The device a row was measured on: its `device` field, else the device of the longest source file its
    `source` names at a word boundary (None: unknown, or two devices for that file)."""
    named = getattr(row, "device", None)
    if named:
        return str(named)
    text = str(getattr(row, "source", "") or "")
    hits = [(len(f), d) for f, d in sources if _names(text, f)]
    if not hits:
        return None
    longest = max(n for n, _ in hits)
    devices = {d for n, d in hits if n == longest}
    return devices.pop() if len(devices) == 1 else None


def own_device_rows(calibration: Calibration, device: DeviceSpec) -> DeviceRows:
    """The rows of `calibration` that price `device` (module docstring)."""
    sources = [(f, p.device_name) for p in calibration.provenance if p.device_name for f in p.source_files if f]
    named = {p.device_name for p in calibration.provenance if p.device_name}
    named |= {r.device for t in ("collective", "host") for r in getattr(calibration, t) if r.device}
    verdict = {n: device_match(n, device) != "other" for n in named}
    if all(verdict.values()) or not any(verdict.values()):
        return DeviceRows(calibration)
    kept: dict[str, tuple[object, ...]] = {}
    for table in TABLES:
        kept[table] = tuple(r for r in getattr(calibration, table) if verdict.get(row_device(r, sources) or "", False))
    dropped = {t: len(getattr(calibration, t)) - len(rows) for t, rows in kept.items()}
    return DeviceRows(calibration.model_copy(update=kept), tuple(sorted(n for n, own in verdict.items() if not own)),
                      {t: n for t, n in dropped.items() if n}, {t: len(rows) for t, rows in kept.items()})


def _names(text: str, file: str) -> bool:
    """Whether `text` names `file` as a whole word (not as a part of a longer path or name)."""
    start = text.find(file)
    while start >= 0:
        end = start + len(file)
        if (start == 0 or text[start - 1] in _BOUNDARY_BEFORE) and (end == len(text) or text[end] in _BOUNDARY_AFTER):
            return True
        start = text.find(file, start + 1)
    return False
