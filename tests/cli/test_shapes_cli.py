"""`projection shapes` (projection/cli_shapes.py) on the bundled examples: CSV and JSON output, counts per step that
add up to Megatron's model FLOPs, and user errors as exit code 2."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import pytest

from projection import api, cli_shapes
from projection.workload.model_flops import model_flops_per_step

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "llama3_8b_inline.yaml"  # TP 2, PP 2 on one MI300X node: DP 2
LLAMA70 = REPO / "examples" / "llama3.1_70B-mi300x.yaml"


def shapes(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    cli_shapes.add_parser(parser.add_subparsers(dest="command"))
    code = cli_shapes.run(parser.parse_args(["shapes", *argv]))
    out, err = capsys.readouterr()
    return code, out, err


def test_csv_rows_and_counts(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = shapes(capsys, "--config", str(LLAMA))
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == list(cli_shapes.COLUMNS)
    assert {r["rank_type"] for r in rows} == {"pp0", "pp1"}
    # SwiGLU fc1 per TP rank: 2 x 14336 / 2 outputs; BLAS m = out features, n = tokens (8192), k = in (4096)
    fc1 = [r for r in rows if r["kind"] == "gemm" and r["phase"] == "F" and (r["m"], r["n"], r["k"]) ==
           ("14336", "8192", "4096")]
    assert [(r["rank_type"], r["layout"], r["count_per_step"]) for r in fc1] == [("pp0", "TN", "512"),
                                                                                ("pp1", "TN", "512")]
    kinds = {(r["collective"], r["group"]) for r in rows if r["kind"] == "collective"}
    assert {("all_reduce", "tp"), ("send_recv", "pp"), ("reduce_scatter", "dp"), ("all_gather", "dp")} <= kinds
    logits = [r for r in rows if r["kind"] == "gemm" and r["m"] == str(128256 // 2)]
    assert {r["rank_type"] for r in logits} == {"pp1"}


def test_counts_add_up_to_the_model_flops(capsys: pytest.CaptureFixture[str]) -> None:
    """Per-rank GEMM + attention FLOPs (attention counted over the full matrix, as Megatron does) x TP x DP, over all
    pipeline ranks, equal Megatron's model FLOPs of the step (no recompute in this example)."""
    code, out, _ = shapes(capsys, "--config", str(LLAMA), "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["parallel"]["tp"] == 2 and doc["parallel"]["dp"] == 2 and doc["microbatches_per_step"] == 32
    total = sum(r["flop_per_step"] * (2 if r["causal"] else 1) for r in doc["rows"] if not r["recompute"])
    sc = api.load(LLAMA)
    assert total * 2 * 2 == pytest.approx(model_flops_per_step(sc.model, sc.training, sc.plan), rel=1e-12)


def test_overrides_and_recompute_rows(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = shapes(capsys, "--config", str(LLAMA70), "--nodes", "8", "--set", "plan.pp=8", "--set",
                          "plan.vpp=1", "--set", "plan.schedule=1f1b", "--format", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["world_size"] == 64 and doc["parallel"]["pp"] == 8
    recomputed = [r for r in doc["rows"] if r["recompute"]]
    assert recomputed and {r["kind"] for r in recomputed} == {"attention"}  # selective core_attn in the example
    assert {r["rank_type"] for r in doc["rows"]} >= {"pp0", "pp7"}
    sp = {(r["collective"], r["phase"]) for r in doc["rows"] if r["group"] == "tp"}
    assert ("all_gather", "F") in sp and ("reduce_scatter", "F") in sp  # sequence parallel


def test_user_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = shapes(capsys, "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and out == "" and err.startswith("error:")
    code, _, err = shapes(capsys, "--config", str(LLAMA), "--set", "plan.tp=3")
    assert code == 2 and "error:" in err
