"""notebooks/planning.ipynb runs top to bottom, and what it prints is what the CLI prints for the same config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib
import pytest

from projection.cli import main

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "notebooks" / "planning.ipynb"


def _run_notebook(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    matplotlib.use("Agg")
    monkeypatch.chdir(REPO)
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    namespace: dict[str, Any] = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{NOTEBOOK.name}", "exec"), namespace)  # noqa: S102
    return namespace


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


def test_planning_notebook_agrees_with_the_cli(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    ns = _run_notebook(monkeypatch)
    config = str(ns["CONFIG"])
    perf = _cli_json(capsys, "performance", "--config", config, "--format", "json")
    assert ns["proj"].step_time_s == pytest.approx(perf["step_time_s"], rel=1e-12)
    assert ns["proj"].tokens_per_s_per_gpu == pytest.approx(perf["tokens_per_s_per_gpu"], rel=1e-12)
    mem = _cli_json(capsys, "memory", "--config", config, "--format", "json")
    assert ns["mem"].peak_bytes == mem["peak_bytes"] and ns["mem"].verdict == mem["verdict"]
    scaling = _cli_json(capsys, "performance", "--config", config, "--scaling", "4,8,16", "--format", "json")
    assert [p.step_time_s for p in ns["rows"]] == pytest.approx([r["step_time_s"] for r in scaling["projections"]])
    # the layout search: the chosen layout fits and no fitting layout is faster; the CLI projects it the same way
    best, found = ns["best"], ns["found"]
    assert best is not None and best.status == "fits"
    assert all(c.projection.step_time_s >= best.projection.step_time_s for c in found if c.status == "fits")
    again = _cli_json(capsys, "performance", "--config", config, "--set", f"plan.tp={best.tp}", "--set",
                      f"plan.pp={best.pp}", "--set", f"plan.vpp={best.vpp}", "--set",
                      f"plan.schedule={best.scenario.plan.schedule}", "--format", "json")
    assert again["step_time_s"] == pytest.approx(best.projection.step_time_s, rel=1e-12)
    assert any(c.status == "refused" for c in found), "the search names the layouts the cluster cannot take"
