"""`projection memory` end to end: JSON schema, internal consistency, model states against the per-rank parameter
counts of `inspect` (themselves checked against transformers), the verdict, and `--explain`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3.1_70B-mi300x.yaml"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "projection", *args], capture_output=True, text=True, timeout=120)


def test_memory_json_schema_and_consistency() -> None:
    res = run("memory", "--config", str(EXAMPLE), "--format", "json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    for key in ("peak_bytes", "reserved_bytes", "capacity_bytes", "verdict", "ranks"):
        assert key in d
    assert [r["pp_rank"] for r in d["ranks"]] == [0, 1, 2, 3]
    for r in d["ranks"]:
        assert set(r["bytes"]) == {"weights", "gradients", "optimizer", "activations", "buffers", "other"}
        assert r["peak_bytes"] == sum(r["bytes"].values())
        assert r["reserved_bytes"] >= r["peak_bytes"]
    assert d["peak_bytes"] == max(r["peak_bytes"] for r in d["ranks"])
    assert d["capacity_bytes"] == 196592 * 2**20  # MI300X as the driver reports it (hardware_specs/README.md)
    assert d["verdict"] in ("fits", "at risk", "out of memory")
    if d["verdict"] == "fits":
        assert d["reserved_bytes"] < d["capacity_bytes"]

    ins = json.loads(run("inspect", "--config", str(EXAMPLE), "--format", "json").stdout)
    for r, p in zip(d["ranks"], ins["params"]["per_rank"], strict=True):
        # bf16 weights 2 B, fp32 main grads 4 B per parameter; zero_stage 1 over dp*cp = 1 -> 12 B optimizer
        assert r["terms"]["weights.params"] == 2 * p["params"]
        assert r["bytes"]["gradients"] == 4 * p["params"]
        assert r["bytes"]["optimizer"] == 12 * p["params"]


def test_memory_verdict_out_of_memory() -> None:
    """The same 70B model on a single 80 GB H100 without any parallelism cannot fit: 16+ B/param of states."""
    res = run("memory", "--config", str(EXAMPLE), "--format", "json", "--hardware", "h100-sxm", "--nodes", "1",
              "--gpus-per-node", "1", "--set", "plan.tp=1", "--set", "plan.pp=1", "--set", "plan.vpp=1",
              "--set", "plan.schedule=1f1b")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["verdict"] == "out of memory" and d["headroom_bytes"] < 0


def test_memory_table_and_explain() -> None:
    res = run("memory", "--config", str(EXAMPLE), "--explain")
    assert res.returncode == 0, res.stderr
    assert "pp_rank" in res.stdout and "FITS" in res.stdout.upper()
    assert "activations per dense layer" in res.stdout and "b*s*" in res.stdout


def test_memory_explain_json_is_one_json_document() -> None:
    res = run("memory", "--config", str(EXAMPLE), "--explain", "--format", "json")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)  # the formulas ride inside the document, not after it
    text = "\n".join(d["explain"])
    assert "activations per dense layer" in text and "b*s*" in text and d["verdict"] == "fits"


def test_memory_bad_input_exit_2(tmp_path: Path) -> None:
    res = run("memory", "--config", str(EXAMPLE), "--set", "plan.tp=3")
    assert res.returncode == 2 and "Traceback" not in res.stderr and "tp = 3" in res.stderr


def test_memory_at_target_nodes_is_the_scaled_jobs_memory() -> None:
    """`memory --target-nodes 16` (weak scaling at the file's global batch): the per-rank memory of the job loaded
    on 16 nodes directly, the ZeRO-1 optimizer shards and in-flight microbatches shrunk with dp, and the memory
    `performance --target-nodes 16` reports; a bad count exits 2."""
    scaled = json.loads(run("memory", "--config", str(EXAMPLE), "--target-nodes", "16", "--format", "json").stdout)
    direct = json.loads(run("memory", "--config", str(EXAMPLE), "--nodes", "16", "--format", "json").stdout)
    base = json.loads(run("memory", "--config", str(EXAMPLE), "--format", "json").stdout)
    perf = json.loads(run("performance", "--config", str(EXAMPLE), "--target-nodes", "16", "--format", "json").stdout)
    assert scaled["world_size"] == 128 and scaled["peak_bytes"] == direct["peak_bytes"] == perf["memory"]["peak_bytes"]
    assert scaled["peak_bytes"] < base["peak_bytes"]
    bad = run("memory", "--config", str(EXAMPLE), "--target-nodes", "0")
    assert bad.returncode == 2 and "--target-nodes" in bad.stderr and "Traceback" not in bad.stderr
