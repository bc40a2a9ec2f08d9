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


PRIMUS = REPO.parent / "shared" / "fixtures" / "primus"


@pytest.mark.skipif(not PRIMUS.is_dir(), reason="shared Primus fixtures absent (user clone)")
def test_a_framework_file_searched_from_a_searched_base_keeps_its_axes(capsys: pytest.CaptureFixture[str]) -> None:
    """Primus's llama2_7B (mbs 4, global batch 256) on 16 nodes: its own layout fails (dp 128 x mbs 4 > 256), so the
    search starts from a searched layout. Each candidate is the file reloaded with Primus's keys relative to that
    base, over the base's own axes: mbs 1 at tp 1, 2 or 4 is a layout that holds (2, 2 and 8 microbatches), not
    refused with the file's mbs 4 ("4 * 128"); each row is what `projection performance --set` gives for it."""
    config = PRIMUS / "examples" / "megatron" / "configs" / "MI300X" / "llama2_7B-BF16-pretrain.yaml"
    argv = ["plan", "--config", str(config), "--primus-root", str(PRIMUS), "--nodes", "16", "--tp", "1,2,4",
            "--mbs", "1,2,4", "--format", "json"]
    assert main(argv) == 0
    rows = {(r["tp"], r["micro_batch_size"]): r for r in json.loads(capsys.readouterr().out)["candidates"]}
    for tp in (1, 2, 4):
        row = rows[(tp, 1)]
        assert row["status"] == "fits", row
        sc = api.load(config, nodes=16, primus_root=PRIMUS,
                      overrides={"tensor_model_parallel_size": tp, "micro_batch_size": 1})
        assert row["step_time_s"] == pytest.approx(project(sc, default_cost_model(sc)).step_time_s, rel=1e-9)
    assert rows[(1, 4)]["status"] == "refused"  # 4 x 128 > 256: the one that truly does not hold
