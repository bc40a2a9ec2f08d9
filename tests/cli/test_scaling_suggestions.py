"""What `projection performance --target-nodes N` suggests when the global batch does not split at N nodes
(projection/perf/scaling.py, found by the scaling audit): the suggested `--set training.global_batch_size=G` must
work, at N and at the node count the job is scaled from, schedule rules included; and a batch that does not split
into whole microbatches is reported once, not again as a schedule rule broken by a rounded-down count."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.test_performance_cli import perf

REPO = Path(__file__).resolve().parents[2]


def test_the_suggested_global_batch_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3.1-70B (tp 8, pp 4, interleaved vpp 5, global batch 128) at 12 nodes: dp 3 does not divide 128. The
    first multiple of 3, 129, breaks the interleaved schedule's group rule (129 % 4); the suggestion must not."""
    base = ("--config", str(REPO / "examples" / "llama3.1_70B-mi300x.yaml"), "--target-nodes", "12")
    code, _, err = perf(capsys, *base)
    assert code == 2 and "42 microbatches" not in err and "interleaved_1f1b" not in err  # one problem, not two
    suggested = re.search(r"--set training.global_batch_size=(\d+)", err)
    assert suggested is not None and int(suggested.group(1)) % 3 == 0 and suggested.group(1) != "129"
    code, out, err = perf(capsys, *base, "--set", f"training.global_batch_size={suggested.group(1)}")
    assert code == 0, err


def test_the_suggestion_leaves_only_the_layouts_own_problems(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen3-235B (ep 32, interleaved over pp 8) from 32 to 12 nodes: ep 32 cannot fit 12 nodes whatever the batch;
    the suggested batch must clear the batch's own problem at 12 nodes and still run at 32."""
    cfg = str(REPO / "benchmarks" / "bridge_runs" / "perf_qwen3_235b_a22b_256xh100_fp8cs.yaml")
    code, _, err = perf(capsys, "--config", cfg, "--nodes", "32", "--target-nodes", "12")
    assert code == 2 and "[plan.ep]" in err
    g = re.search(r"--set training.global_batch_size=(\d+)", err)
    assert g is not None
    code, _, err = perf(capsys, "--config", cfg, "--nodes", "32", "--target-nodes", "12", "--set",
                        f"train.global_batch_size={g.group(1)}")
    assert code == 2 and "[plan.ep]" in err and "global_batch_size" not in err and "microbatch" not in err
    code, _, err = perf(capsys, "--config", cfg, "--nodes", "32", "--set", f"train.global_batch_size={g.group(1)}")
    assert code == 0, err
