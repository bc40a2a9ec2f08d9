"""Import a script of benchmarks/ (not a package) as a module, for the oracle tests that share its cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(stem: str) -> ModuleType:
    """benchmarks/<stem>.py as the module `projection_benchmarks_<stem>` (loaded once; its own sibling imports, such
    as accuracy_amd's `from accuracy import ...`, resolve from benchmarks/)."""
    name = f"projection_benchmarks_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def case_error(stem: str, prefix: str) -> float:
    """The relative error of the one case of benchmarks/<stem>.py whose name starts with `prefix`, projected as the
    benchmark projects it, with the row printed (the oracle tests' table line)."""
    mod = load_benchmark(stem)
    (case,) = [c for c in mod.cases() if c.name.startswith(prefix)]
    (row,) = mod.evaluate([case])
    print(f"\n{case.name} on {case.gpus} x {case.hardware} ({case.note}): measured {case.measured:.1f} "
          f"{case.metric}, projected {row.projected:.1f} ({row.error:+.1%}), step {row.step_time_s:.3f} s")
    return float(row.error)
