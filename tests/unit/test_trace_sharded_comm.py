"""The Chrome trace (`projection performance --trace`) draws the sharded-data-parallel collectives the pricing runs
inside each action (FSDP / ZeRO-3: per-unit parameter all-gathers prefetched one unit ahead, gradient
reduce-scatters, HSDP replica all-reduces) on threads of their own, where perf/action_time.run_items ran them.

The quantity they must add up to: for a job whose data-parallel communication is all in-action (zero_stage 3 without
FSDP inside pipeline stages and without a tied-embedding all-reduce), perf/project._breakdown defines the JSON's
`comm_total_s["dp"]` as the sum, over the breakdown rank's F/B/I/W actions, of ActionTime.comm_s["dp"] (every
launched dp collective's seconds) plus that rank's dp.grad_s and dp.param_gather_s, both 0 there. So the durations
of the trace's events on the FSDP threads of `breakdown_rank` (end_s - start_s) sum to `comm_total_s["dp"]`.
The audit found none of them: the `comm` thread declared with 0 events while the JSON reported 9.8 s of dp
communication (examples/llama3.1_70B-mi300x.yaml at 16 nodes with ZeRO-3)."""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from projection import cli_performance

REPO = Path(__file__).resolve().parents[2]
LLAMA70 = REPO / "examples" / "llama3.1_70B-mi300x.yaml"
LLAMA8 = REPO / "examples" / "llama3_8b_inline.yaml"  # ZeRO-1, tp 2, pp 2
TITAN = REPO / "benchmarks" / "torchtitan_runs" / "t1_llama31_8b_fsdp8.toml"  # FSDP 8, pp 1, Llama 3.1 8B
FSDP_TIDS = {3: "fsdp", 4: "fsdp_expert", 5: "fsdp_replicate"}


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the JSON report, the Chrome trace) of `projection performance <argv>`."""
    out = tmp_path / "trace.json"
    parser = argparse.ArgumentParser(prog="projection")
    cli_performance.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["performance", *argv, "--format", "json", "--trace", str(out)])
    code = cli_performance.run(args, env=dict(os.environ))
    stdout, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(stdout), json.loads(out.read_text())


def spans(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def sharded(trace: dict[str, Any], pid: int | None = None) -> list[dict[str, Any]]:
    """The events on the FSDP threads (of rank `pid`, or of every rank)."""
    return [e for e in spans(trace) if e["tid"] in FSDP_TIDS and (pid is None or e["pid"] == pid)]


def seconds(events: list[dict[str, Any]]) -> float:
    return sum(e["args"]["end_s"] - e["args"]["start_s"] for e in events)


def check_placement(trace: dict[str, Any]) -> None:
    """Each collective lies inside the action that launched it (run_items waits for every launch before the action
    ends), the events of one stream never overlap, and every thread that has events is declared by name."""
    compute = {(e["pid"], e["name"]): e for e in spans(trace) if e["tid"] == 0 and e.get("cat") in ("F", "B", "I", "W")}
    per_stream: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in sharded(trace):
        a = compute[(e["pid"], e["args"]["action"])]["args"]
        s, t = e["args"]["start_s"], e["args"]["end_s"]
        assert a["start_s"] - 1e-12 <= s <= t <= a["end_s"] + 1e-12, (e, a)
        assert e["cat"] == "comm" and e["args"]["group"] == "dp" and e["args"]["stream"] == FSDP_TIDS[e["tid"]]
        assert e["ts"] == pytest.approx(s * 1e6, rel=1e-12) and e["dur"] == pytest.approx((t - s) * 1e6, rel=1e-9,
                                                                                         abs=1e-9)
        per_stream[(e["pid"], e["tid"])].append((s, t))
    for iv in per_stream.values():
        iv.sort()
        assert all(b[0] >= a[1] - 1e-12 for a, b in zip(iv, iv[1:], strict=False))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all(names[key] == FSDP_TIDS[key[1]] for key in per_stream)


def test_native_zero3_draws_its_collectives_and_they_sum_to_the_dp_total(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The audit's command: Llama 3.1 70B on 16 MI300X nodes with ZeRO-3 (pp 4: each rank draws its own)."""
    doc, trace = run(capsys, tmp_path, "--config", str(LLAMA70), "--nodes", "16",
                     "--set", "plan.sharding.zero_stage=3")
    rank = doc["breakdown_rank"]
    mine = sharded(trace, rank)
    kinds = {e["name"].split()[0] for e in mine}
    assert kinds == {"all-gather", "reduce-scatter"}  # no HSDP, no experts
    assert {e["tid"] for e in mine} == {3}
    assert doc["comm_total_s"]["dp"] > 1.0
    assert seconds(mine) == pytest.approx(doc["comm_total_s"]["dp"], rel=1e-9)
    assert {e["pid"] for e in sharded(trace)} == {e["pid"] for e in spans(trace)}  # every pipeline rank
    check_placement(trace)


def test_torchtitan_fsdp_units_named_and_summed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """TorchTitan's FSDP2 on Llama 3.1 8B (one microbatch, pp 1): units embedding, layer0..31, output. The forward
    gathers each (prefetched, in order), the backward re-gathers all but [norm, output] (TorchTitan never reshards
    that unit after forward) and reduce-scatters each, last unit first."""
    doc, trace = run(capsys, tmp_path, "--config", str(TITAN))
    assert doc["n_microbatches"] == 1 and doc["breakdown_rank"] == 0
    units = ["embedding", *(f"layer{i}" for i in range(32)), "output"]
    by_action: dict[str, list[str]] = defaultdict(list)
    for e in sorted(sharded(trace, 0), key=lambda e: (e["args"]["start_s"], e["tid"])):
        by_action[e["args"]["action"]].append(e["name"])
    assert by_action["F s0 mb0"] == [f"all-gather {u}" for u in units]
    backward = by_action["B s0 mb0"]
    assert [n for n in backward if n.startswith("all-gather")] == [f"all-gather {u}" for u in units[-2::-1]]
    assert [n for n in backward if n.startswith("reduce-scatter")] == [f"reduce-scatter {u}" for u in units[::-1]]
    assert set(by_action) == {"F s0 mb0", "B s0 mb0"}
    assert seconds(sharded(trace, 0)) == pytest.approx(doc["comm_total_s"]["dp"], rel=1e-9)
    # the decoder layers are equal: so are their collectives
    rs = {round(e["dur"], 6) for e in sharded(trace, 0) if e["name"].startswith("reduce-scatter layer")}
    assert len(rs) == 1
    check_placement(trace)


def test_hsdp_replica_all_reduce_follows_its_units_reduce_scatter(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """HSDP (2 replicas x 8 shards on 2 nodes): each unit's reduced shard is all-reduced over the replicas on a
    stream of its own, once its reduce-scatter has ended; both count in comm_total_s.dp."""
    toml = tmp_path / "hsdp.toml"
    toml.write_text(TITAN.read_text().replace("data_parallel_replicate_degree = 1",
                                              "data_parallel_replicate_degree = 2"))
    doc, trace = run(capsys, tmp_path, "--config", str(toml), "--nodes", "2")
    mine = sharded(trace, doc["breakdown_rank"])
    replicas = {e["name"].split()[1]: e for e in mine if e["tid"] == 5}
    scatters = {e["name"].split()[1]: e for e in mine if e["name"].startswith("reduce-scatter")}
    assert len(replicas) == 34 and set(replicas) == set(scatters)
    assert all(e["name"] == f"all-reduce {u} (replicas)" for u, e in replicas.items())
    assert all(replicas[u]["args"]["start_s"] >= scatters[u]["args"]["end_s"] - 1e-12 for u in replicas)
    assert seconds(mine) == pytest.approx(doc["comm_total_s"]["dp"], rel=1e-9)
    assert seconds([e for e in mine if e["tid"] == 5]) > 0
    check_placement(trace)


def test_split_backward_places_the_reduce_scatters_in_the_weight_gradient(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Under a zero-bubble schedule (I and W actions) the backward re-gathers run in I and the reduce-scatters in
    W, each at its place in that action; the total is still the dp total."""
    doc, trace = run(capsys, tmp_path, "--config", str(LLAMA8), "--set", "plan.sharding.zero_stage=3",
                     "--schedule", "zb_h1")
    mine = sharded(trace, doc["breakdown_rank"])
    kinds = {(e["args"]["action"][0], e["name"].split()[0]) for e in mine}
    assert kinds == {("F", "all-gather"), ("I", "all-gather"), ("W", "reduce-scatter")}
    assert seconds(mine) == pytest.approx(doc["comm_total_s"]["dp"], rel=1e-9)
    check_placement(trace)


def test_zero1_trace_is_unchanged(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """ZeRO-1 reduces gradients in buckets (comm tasks, tid 2): no FSDP thread is declared or drawn."""
    _, trace = run(capsys, tmp_path, "--config", str(LLAMA8))
    assert not sharded(trace)
    assert any(e["tid"] == 2 for e in spans(trace))
    assert {e["tid"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"} == {0, 1, 2}
