"""`projection plan` when the file's own layout fails on the cluster but the search replaces the axis at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection import api
from projection.cli import main
from projection.perf import default_cost_model, project

REPO = Path(__file__).resolve().parents[2]


def test_a_searched_axis_replaces_the_files_invalid_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tp 3 on 32 GPUs fails (it divides neither the world nor the 64 heads), but `--tp 4,8` replaces it: the search
    runs from a searched layout that holds (it used to refuse with six tp 3 problems), and each row is what the
    file gives with that tp. An axis the search leaves alone still fails as the loader says."""
    config = tmp_path / "tp3.yaml"
    config.write_text((REPO / "examples" / "llama3.1_70B-mi300x.yaml").read_text().replace("  tp: 8", "  tp: 3"))
    assert main(["plan", "--config", str(config), "--tp", "4,8", "--format", "json"]) == 0
    rows = {r["tp"]: r for r in json.loads(capsys.readouterr().out)["candidates"]}
    assert set(rows) == {4, 8}
    for tp, row in rows.items():
        sc = api.load(config, overrides={"plan.tp": tp})
        assert row["step_time_s"] == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-9)
    assert main(["plan", "--config", str(config), "--pp", "2,4"]) == 2
    assert "tp = 3 does not divide num_attention_heads = 64" in capsys.readouterr().err
