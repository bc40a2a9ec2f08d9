"""`projection inspect` end to end on the bundled example: JSON schema, provenance, and numbers checked against the
same model built by transformers on the meta device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3.1_70B-mi300x.yaml"


def run_json(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "projection", "inspect", "--config", str(EXAMPLE), "--format",
                          "json", *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_inspect_json_matches_meta_model() -> None:
    from tests.oracle.hf_models import count, hf_config_for, meta_model, sharded_count_by_layer

    d = run_json()
    assert d["cluster"] == {"hardware": "mi300x", "nodes": 4, "gpus_per_node": 8, "world_size": 32,
                            "inter_node_topology": "rail_optimized", "oversubscription": 1.0, "device_edits": {}}
    model = ModelSpec.model_validate(d["model"])
    plan = ParallelPlan.model_validate(d["plan"])
    assert (plan.tp, plan.pp, plan.vpp, plan.dp) == (8, 4, 5, 1)
    hf = meta_model(hf_config_for(model, vocab=d["derived"]["padded_vocab"]))
    assert d["params"]["total"] == count(hf)
    # per rank: layers 4 per virtual stage, rank r holds chunks r, r+4, ...; embedding on 0, head + norm on 3
    per_layer, emb, norm, head = sharded_count_by_layer(hf, 8, 1, 1)
    expected = [sum(per_layer[i] for c in range(5) for i in range(4 * (4 * c + r), 4 * (4 * c + r) + 4))
                for r in range(4)]
    expected[0] += emb
    expected[3] += norm + head
    assert [r["pp_rank"] for r in d["params"]["per_rank"]] == [0, 1, 2, 3]
    assert [r["params"] for r in d["params"]["per_rank"]] == expected


def test_inspect_provenance_and_overrides() -> None:
    d = run_json("--nodes", "8", "--set", "plan.pp=8", "--set", "plan.vpp=1", "--set", "plan.schedule=1f1b")
    assert d["cluster"]["world_size"] == 64
    assert d["origins"]["plan.tp"].startswith(str(EXAMPLE)) and ":10" in d["origins"]["plan.tp"]
    assert d["origins"]["plan.pp"] == "--set (plan.pp)"
    assert d["origins"]["cluster.nodes"] == "<command line> (--nodes)"
    assert d["origins"]["model.num_layers"].endswith("models/llama3.1_70B.yaml:9 (num_layers)")
    assert len(d["params"]["per_rank"]) == 8
    assert d["derived"]["dp"] == 1 and d["derived"]["microbatches_per_step"] == 128


def test_table_renders_the_same_numbers_as_json() -> None:
    d = run_json()
    res = subprocess.run([sys.executable, "-m", "projection", "inspect", "--config", str(EXAMPLE)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"{d['params']['total']:,}" in res.stdout
    assert all(f"{r['params']:,}" in res.stdout for r in d["params"]["per_rank"])


def test_inspect_shows_the_fabric_keys_with_their_origin() -> None:
    """cluster.inter_node_topology and cluster.oversubscription price every inter-node collective: inspect shows
    them and where they came from, as it does nodes and GPUs per node."""
    doc = run_json("--set", "cluster.oversubscription=4", "--set", "cluster.inter_node_topology=fat_tree")
    assert doc["cluster"]["oversubscription"] == 4.0 and doc["cluster"]["inter_node_topology"] == "fat_tree"
    assert "--set cluster.oversubscription" in str(doc["origins"]["cluster.oversubscription"])
    res = subprocess.run([sys.executable, "-m", "projection", "inspect", "--config", str(EXAMPLE)],
                         capture_output=True, text=True, timeout=120)
    lines = [line.split() for line in res.stdout.splitlines() if "cluster.oversubscription" in line]
    assert lines and lines[0][1:] == ["1.0", "default"]
