"""The notes a projection prints about its calibration: measured on another device, missing tables the device's
shipped calibration has, or holding tables that price none of the job's ops (perf/project.py)."""

from __future__ import annotations

import functools
from pathlib import Path

from projection.cost.model import CostModel
from projection.specs.device_names import device_match
from projection.specs.scenario import Scenario


def calibration_notes(sc: Scenario, cm: CostModel, sources: set[str]) -> list[str]:
    """Every calibration note of a projection of `sc` priced by `cm`, whose cost sources are `sources`."""
    return _foreign_calibration(sc, cm) + _partial_calibration(sc, cm) + _idle_tables(sc, cm, sources)


def _foreign_calibration(sc: Scenario, cm: CostModel) -> list[str]:
    """A note when the cost model's calibration was measured on another device than the scenario's (its seconds are
    used as they are: a mismatched --calibration is most often a mistake), or was matched by the ISA alone (hipBLASLt
    prints gfx942 for MI300X and MI325X alike)."""
    cal = getattr(cm, "calibration", None)
    measured = sorted({p.device_name for p in getattr(cal, "provenance", ()) if p.device_name})
    dev = sc.cluster.device
    verdicts = {m: device_match(m, dev) for m in measured}
    foreign = [m for m, v in verdicts.items() if v == "other"]
    by_arch = [m for m, v in verdicts.items() if v == "arch"]
    notes = []
    if foreign and len(foreign) < len(measured):  # a mixed calibration (--allow-mixed-devices)
        rows_note = getattr(cm, "device_rows_note", None)  # which tables are its own, which fell back (device_rows.py)
        notes.append((rows_note() if callable(rows_note) else None)
                     or f"calibration {getattr(cm, 'name', '')} also holds measurements of {', '.join(foreign)}, not "
                        f"of {dev.name}: {dev.name} is priced from its own rows only (projection/cost/device_rows.py)")
    elif foreign:
        notes.append(f"calibration {getattr(cm, 'name', '')} was measured on {', '.join(foreign)}, not on {dev.name}: "
                     "its seconds are used as they are (calibrate on this device, or pass --hardware with the device "
                     "it was measured on)")
    if by_arch:
        notes.append(f"calibration {getattr(cm, 'name', '')} names {', '.join(by_arch)}: matched to {dev.name} by its "
                     f"architecture ({dev.gpu_arch}) only, which other parts share")
    return notes


def _partial_calibration(sc: Scenario, cm: CostModel) -> list[str]:
    """A note when a calibration file other than the device's shipped one lacks tables the shipped one has: those
    ops fall back to the roofline, not to the shipped tables (a host-only --calibration drops the shipped GEMMs)."""
    from projection.calibrate.calibration import TABLES
    from projection.perf.costmodel import shipped_calibration

    cal, path = getattr(cm, "calibration", None), getattr(cm, "path", None)
    shipped = shipped_calibration(sc.cluster.device.name)
    if cal is None or path is None or shipped is None or Path(path).resolve() == shipped.resolve():
        return []
    ship, shipped_devices = _shipped_tables(str(shipped))
    have = cal.row_counts()
    missing = [t for t in TABLES if t != "host" and ship.get(t) and not have.get(t)]
    if not missing:
        return []
    devices = shipped_devices | {p.device_name for p in cal.provenance if p.device_name}
    mixed = " --allow-mixed-devices" if len(devices) > 1 else ""
    return [f"calibration {path} has no {', '.join(missing)} rows: those ops are priced by the "
            f"{sc.cluster.device.name} roofline, not by the shipped {shipped} (to keep both, combine them: "
            f"projection calibrate import {shipped} {path} --out CAL.json{mixed})"]


def _idle_tables(sc: Scenario, cm: CostModel, sources: set[str]) -> list[str]:
    """A note naming the tables of a --calibration file (not the device's shipped one) that priced none of the job's
    ops: `sources` are the projection's cost sources, each 'calibrated: <file> <table label>' or '<fallback>: <file>
    <table label>' for an op its table held or that fell out of its range (cost/calibrated.py); a table whose rows
    match no op (another dtype, no node count, ...) appears in none of them."""
    from projection.perf.costmodel import shipped_calibration

    cal, path, name = getattr(cm, "calibration", None), getattr(cm, "path", None), getattr(cm, "name", None)
    shipped = shipped_calibration(sc.cluster.device.name)
    if cal is None or path is None or not name or (shipped is not None
                                                   and Path(path).resolve() == shipped.resolve()):
        return []
    used = set()
    for source in sources:
        at = source.find(f"{name} ")
        if not source.startswith("calibrated") or at < 0:
            continue
        label = source[at + len(name) + 1:]
        table = label.split(" ", 1)[0]
        used.add("collective" if " curve" in label or " tier" in label else table)
    idle = [f"{table} ({count} rows)" for table, count in cal.row_counts().items()
            if table != "host" and count and table not in used]
    if not idle:
        return []
    return [f"calibration {path}: its {', '.join(idle)} price none of this job's ops (no row matches their dtype, "
            f"layout, kernel or group; `projection calibrate fit {path}` lists the rows it cannot use and why); "
            f"those ops fall back to the {sc.cluster.device.name} roofline"]


@functools.lru_cache(maxsize=8)
def _shipped_tables(path: str) -> tuple[dict[str, int], frozenset[str]]:
    """Rows per table and device names of a shipped calibration file (read once: a --scaling run or a schedule
    comparison projects many times with the same --calibration)."""
    from projection.calibrate.calibration import load_calibration

    cal = load_calibration(Path(path))
    return cal.row_counts(), frozenset(p.device_name for p in cal.provenance if p.device_name)
