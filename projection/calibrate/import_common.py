"""What the importers share: a table row built from one data row of a log or trace, or skipped with its reason; the
note that lists the skipped rows; the readable events of a PyTorch profiler trace.

Rule (the importers' common contract, README "calibrate import"): a data row whose values are impossible (a time of
zero, negative, NaN, infinite or over the schema's hour; a dimension of 0; a 20-digit count) or unreadable is not a
measurement: it is skipped and said in a provenance note ("skipped N ... at lines ..."), never a traceback; a file
with no readable row at all is refused (CalibrationError, exit code 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import ValidationError

from projection.calibrate.calibration import Provenance
from projection.specs.base import Spec

RowT = TypeVar("RowT", bound=Spec)


def build_row(cls: type[RowT], fields: Mapping[str, Any]) -> tuple[RowT | None, str | None]:
    """(row, None), or (None, why) when the values do not validate (the first failing key and its value)."""
    try:
        return cls(**fields), None
    except ValidationError as err:
        first = err.errors()[0]
        key = ".".join(str(x) for x in first["loc"]) or cls.__name__
        return None, f"{key} = {first.get('input')!r}: {first['msg']}"


class Skipped:
    """Skipped data rows of one file, by reason: where (a line number, or with unit "" a place such as "event 3")
    and what was wrong."""

    def __init__(self, file: str, unit: str = "line"):
        self.file, self.unit = file, unit
        self.by_reason: dict[str, list[tuple[Any, str]]] = {}

    def add(self, reason: str, where: Any, detail: str = "") -> None:
        self.by_reason.setdefault(reason, []).append((where, detail))

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_reason.values())

    def notes(self) -> tuple[Provenance, ...]:
        """One provenance note per reason: how many, where (the first 10), and the first detail."""
        out = []
        for reason, items in self.by_reason.items():
            places = list(dict.fromkeys(str(w) for w, _ in items))  # both halves of one line: the line once
            more = f" (+{len(places) - 10} more)" if len(places) > 10 else ""
            where = ", ".join(places[:10]) + more
            detail = next((d for _, d in items if d), "")
            out.append(Provenance(source_files=(self.file,), notes=(
                f"skipped {len(items)} {reason} of {self.file} at {self.unit + 's ' if self.unit else ''}{where}"
                + (f" (first: {detail})" if detail else ""),)))
        return tuple(out)


def finite_number(value: object) -> float | None:
    """A JSON number (not a boolean) that is finite, as a float; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        out = float(value)
    except OverflowError:  # an integer beyond the float range
        return None
    return out if math.isfinite(out) else None


def count(value: object, minimum: int = 0) -> int | None:
    """A JSON integer (or an integral float) >= minimum and at most 2**53; None for anything else (a string, a
    boolean, a list, NaN, a 20-digit number)."""
    number = finite_number(value)
    if number is None or number != int(number) or not minimum <= number <= 2**53:
        return None
    return int(number)


def hashable_id(value: object) -> int | str | None:
    """A trace id (`correlation`, `External id`): an integer or a string; None for anything else."""
    if isinstance(value, bool):
        return None
    return value if isinstance(value, int | str) else None


def thread_of(event: dict[str, Any]) -> tuple[str, str]:
    """The (pid, tid) of an event as a hashable, sortable key (Kineto writes numbers or names; any JSON value)."""
    return str(event.get("pid")), str(event.get("tid"))


def trace_events(trace: dict[str, Any], skipped: Skipped | None = None) -> list[dict[str, Any]]:
    """The complete ("ph": "X") events of a trace that can be read: an object with a finite `ts`, when present a
    finite non-negative `dur`, and a string `name` and `cat`. Entries of traceEvents that are not objects, and
    complete events that cannot be read, are recorded in `skipped` (by their index in traceEvents)."""
    out = []
    for index, e in enumerate(trace.get("traceEvents") or []):
        if not isinstance(e, dict):
            if skipped is not None:
                skipped.add("malformed trace event(s) (not a JSON object)", f"event {index}", repr(e)[:40])
            continue
        if e.get("ph") != "X":
            continue
        if any(key in e and not isinstance(e[key], str) for key in ("name", "cat")):
            if skipped is not None:
                skipped.add("malformed trace event(s) (name or cat not a string)", f"event {index}",
                            repr(e.get("name"))[:40])
            continue
        ts, dur = finite_number(e.get("ts")), finite_number(e.get("dur", 0))
        if ts is None or dur is None or dur < 0:
            if skipped is not None:
                what = "ts" if ts is None else "dur"
                skipped.add("malformed trace event(s) (ts or dur not a finite number, or dur negative)",
                            f"event {index}", f"{e.get('name')!r}: {what} = {e.get(what)!r}")
            continue
        out.append(e)
    return out


def busy_us(events: list[dict[str, Any]]) -> float:
    """Length of the union of the events' [ts, ts + dur] intervals, microseconds (an interval overlapping no other
    counts its own `dur`, free of the rounding of large timestamps)."""
    total, group_start, group_end, group_dur, members = 0.0, 0.0, -math.inf, 0.0, 0
    for start, end, dur in sorted((float(e["ts"]), event_end(e), float(e.get("dur", 0))) for e in events):
        if start > group_end:
            total += group_dur if members == 1 else group_end - group_start if members else 0.0
            group_start, group_end, group_dur, members = start, end, dur, 1
        else:
            group_end, members = max(group_end, end), members + 1
    return total + (group_dur if members == 1 else group_end - group_start if members else 0.0)


def event_end(event: dict[str, Any]) -> float:
    return float(event["ts"]) + float(event.get("dur", 0))
