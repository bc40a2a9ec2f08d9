"""`projection performance` (projection/cli_performance.py): the JSON keys the documentation promises, scaling
with --target-nodes and --scaling (tokens/s/GPU non-increasing as nodes grow at a fixed global batch), --schedule all,
a valid Chrome trace, the scaling PNG, and user errors as exit code 2 without a traceback."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from projection import cli_performance

REPO = Path(__file__).resolve().parents[2]
LLAMA = REPO / "examples" / "llama3_8b_inline.yaml"  # TP 2, PP 2 on one MI300X node (8 GPUs): DP 2, gbs 64, mbs 1
SEQ = 8192  # its seq_length
KEYS = ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "world_size", "breakdown_s")


def perf(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="projection")
    cli_performance.add_parser(parser.add_subparsers(dest="command"))
    code = cli_performance.run(parser.parse_args(["performance", *argv]), env=dict(os.environ))
    out, err = capsys.readouterr()
    return code, out, err


def perf_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = perf(capsys, *argv, "--format", "json")
    assert code == 0, err
    doc: dict = json.loads(out)
    return doc


def test_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    doc = perf_json(capsys, "--config", str(LLAMA))
    assert set(KEYS) <= set(doc)
    assert doc["world_size"] == 8 and doc["n_microbatches"] == 32
    assert doc["step_time_s"] > 0 and 0 < doc["mfu"] < 1
    tokens = 64 * 8192  # global batch x sequence
    assert doc["tokens_per_s_per_gpu"] == pytest.approx(tokens / doc["step_time_s"] / 8, rel=1e-9)
    assert doc["model_tflops_per_gpu"] == pytest.approx(doc["mfu"] * doc["peak_flop_per_s"] / 1e12, rel=1e-9)
    # the causal count (Megatron-LM since 2025) drops half of the scores and weighted values: s x a x d = s x h
    # multiply-accumulates per token and layer, 6 FLOP each over forward and backward (32 layers, h 4096)
    causal = doc["model_flops_per_step"] - 6 * tokens * 32 * 8192 * 4096
    assert doc["model_tflops_per_gpu_causal"] == pytest.approx(causal / doc["step_time_s"] / 8 / 1e12, rel=1e-9)
    assert sum(doc["breakdown_s"].values()) == pytest.approx(doc["step_time_s"], rel=1e-6)
    assert all(v >= 0 for v in doc["breakdown_s"].values())
    assert doc["memory"]["verdict"] in ("fits", "at risk", "out of memory")
    # idle per pp rank, beside the mean ratio: the pipeline's first rank starts at once and waits at the end of
    # 1F1B's cool-down; every rank is idle for some of the step and none for all of it
    idle = doc["bubble_s_per_rank"]
    assert len(idle) == 2 and all(0 < b < doc["step_time_s"] for b in idle)


@pytest.mark.parametrize("extra", [(), ("--target-nodes", "4")])
def test_json_plan_is_the_tables_plan_line(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...]) -> None:
    """An audit found the layout the table prints (dp and microbatches after --target-nodes above all) nowhere in
    the JSON. Its `plan` holds each number of the table's `plan:` line."""
    import re

    doc = perf_json(capsys, "--config", str(LLAMA), *extra)
    code, out, _ = perf(capsys, "--config", str(LLAMA), *extra)
    line = next(x for x in out.splitlines() if x.startswith("plan: "))
    nums = {k: int(v) for k, v in re.findall(r"\b(tp|pp|vpp|cp|ep|dp|zero|microbatches) (\d+)", line)}
    gbs, seq = (int(v) for v in re.search(r"global batch (\d+) x (\d+) tokens", line).groups())  # type: ignore
    plan = doc["plan"]
    assert {k: plan[k] for k in ("tp", "pp", "vpp", "cp", "ep", "dp")} == {k: nums[k] for k in
                                                                          ("tp", "pp", "vpp", "cp", "ep", "dp")}
    assert plan["zero_stage"] == nums["zero"] and doc["n_microbatches"] == nums["microbatches"]
    assert (plan["global_batch_size"], plan["seq_length"]) == (gbs, seq) == (64, SEQ)
    assert plan["sp"] == (" sp," in line) and plan["dp"] == (2 if not extra else 8)
    assert plan["global_batch_size"] == plan["dp"] * plan["micro_batch_size"] * doc["n_microbatches"]


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = perf(capsys, "--config", str(LLAMA))
    assert code == 0
    for text in ("step time", "tokens/s/GPU", "MFU", "breakdown", "critical path", "memory:"):
        assert text in out


def test_target_nodes_is_weak_scaling_at_fixed_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    docs = [perf_json(capsys, "--config", str(LLAMA), "--target-nodes", str(n)) for n in (1, 2, 4, 8, 16)]
    assert [d["world_size"] for d in docs] == [8, 16, 32, 64, 128]
    assert [d["nodes"] for d in docs] == [1, 2, 4, 8, 16]
    assert [d["n_microbatches"] for d in docs] == [32, 16, 8, 4, 2]  # gbs 64 = mbs 1 x dp x microbatches
    for d in docs:
        assert d["tokens_per_s_per_gpu"] * d["step_time_s"] * d["world_size"] == pytest.approx(64 * 8192, rel=1e-9)
    tok = [d["tokens_per_s_per_gpu"] for d in docs]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(tok, tok[1:], strict=False)), tok
    # the DP group is re-priced: intra-node (2 ranks of the xGMI mesh) at 1 node, across 16 nodes at 16
    assert docs[-1]["comm_total_s"]["dp"] != pytest.approx(docs[0]["comm_total_s"]["dp"], rel=1e-3)


def test_target_nodes_equals_nodes_flag_when_the_config_is_on_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    a = perf_json(capsys, "--config", str(LLAMA), "--target-nodes", "4")
    # --nodes 4 keeps the config's global batch too (the native file gives global_batch_size)
    b = perf_json(capsys, "--config", str(LLAMA), "--nodes", "4")
    assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-9)


def test_nodes_sets_the_base_of_target_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    # weak scaling keeps the global batch, so the base node count does not change where the job lands
    a = perf_json(capsys, "--config", str(LLAMA), "--nodes", "2", "--target-nodes", "8")
    b = perf_json(capsys, "--config", str(LLAMA), "--target-nodes", "8")
    assert a["nodes"] == b["nodes"] == 8 and a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-9)


def test_a_file_without_a_cluster_size_scales_from_the_first_count(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    # the example without its cluster block, and a plan of 16 GPUs: no layout on the 1 node assumed by default
    text = LLAMA.read_text(encoding="utf-8")
    wide = tmp_path / "wide.yaml"
    wide.write_text(text[:text.index("cluster:")].replace("tp: 2", "tp: 8"), encoding="utf-8")
    code, _, err = perf(capsys, "--config", str(wide))
    assert code == 2 and "--nodes" in err
    doc = perf_json(capsys, "--config", str(wide), "--scaling", "4,2")
    assert [r["nodes"] for r in doc["scaling"]] == [2, 4]
    assert doc["projections"][0]["step_time_s"] == pytest.approx(
        perf_json(capsys, "--config", str(wide), "--nodes", "2")["step_time_s"], rel=1e-9)
    a = perf_json(capsys, "--config", str(wide), "--nodes", "2", "--target-nodes", "4")
    assert a["step_time_s"] == pytest.approx(doc["projections"][1]["step_time_s"], rel=1e-9)


def test_target_nodes_from_a_file_without_a_cluster_size_starts_where_the_plan_fits(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """As Primus starts from the fewest nodes the model-parallel grid needs: a plan of 16 GPUs in a file that gives
    no cluster size scales to 4 nodes from 2 (the 1 node assumed by default holds no layout), says so, and lands
    where --nodes 2 --target-nodes 4 lands. A file that gives its node count keeps it as the start."""
    text = LLAMA.read_text(encoding="utf-8")
    wide = tmp_path / "wide.yaml"
    wide.write_text(text[:text.index("cluster:")].replace("tp: 2", "tp: 8"), encoding="utf-8")
    doc = perf_json(capsys, "--config", str(wide), "--target-nodes", "4")
    pinned = perf_json(capsys, "--config", str(wide), "--nodes", "2", "--target-nodes", "4")
    assert doc["nodes"] == 4 and doc["step_time_s"] == pytest.approx(pinned["step_time_s"], rel=1e-9)
    assert any("scaled from 2 nodes, the smallest count this plan fits" in n for n in doc["notes"])
    assert not any("scaled from" in n for n in pinned["notes"])
    at_min = perf_json(capsys, "--config", str(wide), "--target-nodes", "2")  # the target is the smallest count
    assert at_min["nodes"] == 2 and at_min["step_time_s"] == pytest.approx(
        perf_json(capsys, "--config", str(wide), "--nodes", "2")["step_time_s"], rel=1e-9)
    one = tmp_path / "one.yaml"
    one.write_text(wide.read_text(encoding="utf-8") + "cluster: {hardware: mi300x, nodes: 1}\n", encoding="utf-8")
    code, _, err = perf(capsys, "--config", str(one), "--target-nodes", "4")
    assert code == 2 and "at the starting point --target-nodes scales from" in err


def test_scaling_rows_carry_what_a_planner_compares(capsys: pytest.CaptureFixture[str]) -> None:
    """Each --scaling row: scaling efficiency against the first row, exposed communication, bubble and peak memory,
    each the same number as that count's projection; ZeRO-1 optimizer shards shrink the peak as dp grows."""
    doc = perf_json(capsys, "--config", str(LLAMA), "--scaling", "1,2,4")
    rows, projs = doc["scaling"], doc["projections"]
    for r, p in zip(rows, projs, strict=True):
        assert r["scaling_efficiency"] == pytest.approx(r["tokens_per_s_per_gpu"] / rows[0]["tokens_per_s_per_gpu"])
        assert r["exposed_comm_s"] == p["exposed_comm_s"] and r["bubble_ratio"] == p["bubble_ratio"]
        assert r["peak_gib"] == pytest.approx(p["memory"]["peak_bytes"] / 2**30)
    assert rows[0]["scaling_efficiency"] == 1.0
    assert rows[0]["peak_gib"] > rows[1]["peak_gib"] > rows[2]["peak_gib"]
    table = perf(capsys, "--config", str(LLAMA), "--scaling", "1,2")[1]
    assert "scaling exposed comm s  bubble  peak GiB" in table


def test_schedule_all(capsys: pytest.CaptureFixture[str]) -> None:
    doc = perf_json(capsys, "--config", str(LLAMA), "--schedule", "all")
    names = [d["schedule"] for d in doc["schedules"]]
    assert len(names) == len(set(names)) >= 4 and {"1f1b", "gpipe", "zb_h1"} <= set(names)
    steps = [d["step_time_s"] for d in doc["schedules"]]
    assert steps == sorted(steps)
    code, out, _ = perf(capsys, "--config", str(LLAMA), "--schedule", "all")
    assert code == 0 and "<- fastest" in out and all(n in out for n in names)
    # the mark goes to the fastest schedule whose memory fits: gpipe holds every microbatch's activations (OOM here)
    marked = [line for line in out.splitlines() if "<- fastest" in line]
    assert len(marked) == 1 and "out of memory" not in marked[0] and "not modelled" not in marked[0]
    assert "gpipe" in out and "out of memory" in next(line for line in out.splitlines() if line.startswith("gpipe"))


def test_schedule_all_names_one_chosen_schedule_and_traces_it(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    """gpipe ties 1f1b here (32 microbatches on pp 2) but does not fit: the table marks 1f1b alone, the JSON names it
    `chosen`, and the trace is of it (the trace used to take gpipe, the first of the tied rows)."""
    out = tmp_path / "t.json"
    doc = perf_json(capsys, "--config", str(LLAMA), "--schedule", "all", "--trace", str(out))
    rows = {d["schedule"]: d for d in doc["schedules"]}
    assert rows["gpipe"]["step_time_s"] == pytest.approx(rows["1f1b"]["step_time_s"], rel=1e-12)
    assert rows["gpipe"]["memory"]["verdict"] == "out of memory"
    assert doc["chosen"] == "1f1b" == json.loads(out.read_text())["otherData"]["schedule"]
    assert isinstance(rows["1f1b"]["comm_total_s"]["pp"], float)



def test_without_a_pipeline_there_is_one_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    """pp 1: microbatches run one after another whatever schedule is named (Megatron forward_backward_no_pipelining;
    TorchTitan builds no pipeline schedule), so `all` is one row and a named one is that row, memory included
    (gpipe's all-forwards-first order used to hold every microbatch's activations)."""
    flat = ("--config", str(LLAMA), "--set", "plan.pp=1")
    doc = perf_json(capsys, *flat, "--schedule", "all")
    assert [d["schedule"] for d in doc["schedules"]] == ["1f1b"]
    base = perf_json(capsys, *flat)
    for name in ("gpipe", "zb_h1", "zbv", "dualpipe"):
        for how in (("--schedule", name), ("--set", f"plan.schedule={name}")):
            other = perf_json(capsys, *flat, *how)
            assert other["step_time_s"] == base["step_time_s"], (name, how)
            assert other["memory"]["peak_bytes"] == base["memory"]["peak_bytes"], (name, how)
    code, _, err = perf(capsys, *flat, "--set", "plan.schedule=bogus")  # an unknown name is still refused
    assert code == 2 and "plan.schedule" in err

def test_one_named_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    doc = perf_json(capsys, "--config", str(LLAMA), "--schedule", "gpipe")
    assert doc["schedule"] == "gpipe"


def test_the_command_line_schedule_replaces_one_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """vpp 2 does not fit the file's 1f1b: --schedule NAME replaces it before the plan is checked, --schedule all
    compares what applies, and a name that does not fit either is refused at --schedule."""
    vpp2 = ("--config", str(LLAMA), "--set", "plan.vpp=2")
    code, _, err = perf(capsys, *vpp2)
    assert code == 2 and "1f1b runs one stage per rank" in err
    assert perf_json(capsys, *vpp2, "--schedule", "interleaved_1f1b")["schedule"] == "interleaved_1f1b"
    rows = perf_json(capsys, *vpp2, "--schedule", "all")["schedules"]
    assert "interleaved_1f1b" in {r["schedule"] for r in rows} and "1f1b" not in {r["schedule"] for r in rows}
    code, _, err = perf(capsys, *vpp2, "--schedule", "zb_h1")
    assert code == 2 and "key '--schedule'" in err and "vpp must be 1" in err
    assert "fix: use one of gpipe, interleaved_1f1b, zbv, v_half, v_min, dualpipev; or --schedule all" in err
    # at a node count the named schedule does not fit, the flag (not plan.schedule) is named
    code, _, err = perf(capsys, *vpp2, "--schedule", "interleaved_1f1b", "--target-nodes", "32")
    assert code == 2 and "[--schedule]" in err and "plan.schedule" not in err
    # --schedule all compares what fits the target when the file's schedule does not fit there
    rows = perf_json(capsys, *vpp2, "--set", "plan.schedule=interleaved_1f1b", "--schedule", "all",
                     "--target-nodes", "32")["schedules"]
    assert [r["schedule"] for r in rows] and "interleaved_1f1b" not in {r["schedule"] for r in rows}
    code, _, err = perf(capsys, *vpp2, "--schedule", "bogus")
    assert code == 2 and "unknown schedule 'bogus'" in err and "interleaved_1f1b" in err


def test_scaling_table_and_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "scaling.png"
    code, out, err = perf(capsys, "--config", str(LLAMA), "--scaling", "4,1,2", "--png", str(png))
    assert code == 0, err
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["nodes", "world"])
    rows = [line.split() for line in lines[header + 1: header + 4]]
    assert [r[0] for r in rows] == ["1", "2", "4"] and [r[3] for r in rows] == ["32", "16", "8"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in out
    doc = perf_json(capsys, "--config", str(LLAMA), "--scaling", "1,2,4,8")
    tok = [r["tokens_per_s_per_gpu"] for r in doc["scaling"]]
    assert [r["nodes"] for r in doc["scaling"]] == [1, 2, 4, 8]
    assert [r["dp"] for r in doc["scaling"]] == [2, 4, 8, 16]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(tok, tok[1:], strict=False)), tok
    assert all(set(KEYS) <= set(p) for p in doc["projections"])


def test_trace_is_valid_chrome_trace_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    doc = perf_json(capsys, "--config", str(LLAMA), "--trace", str(out))
    assert doc["wrote"] == [str(out)]
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(isinstance(e["ts"], float | int) and e["dur"] >= 0 and "name" in e for e in spans)
    assert {e["pid"] for e in spans} == {0, 1}  # one process per pipeline rank
    assert {e["args"]["kind"] for e in spans if e.get("cat") in ("F", "B", "I", "W")} >= {"F"}
    assert max(e["ts"] + e["dur"] for e in spans) <= doc["step_time_s"] * 1e6 * (1 + 1e-9)
    assert trace["otherData"]["schedule"] == doc["schedule"]
    # the step the JSON reports, optimizer included: the latest rank's last event ends there
    assert trace["otherData"]["step_time_s"] == pytest.approx(doc["step_time_s"], rel=1e-12)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(doc["step_time_s"] * 1e6, rel=1e-9)
    opt = [e for e in spans if e["name"] == "optimizer"]
    assert sorted(e["dur"] for e in opt) == pytest.approx(sorted(s * 1e6 for s in doc["optimizer_s"] if s > 0),
                                                          rel=1e-9)


@pytest.mark.parametrize("argv, needle", [
    (["--config", "/nonexistent/exp.yaml"], "exp.yaml"),
    (["--config", str(LLAMA), "--target-nodes", "3"], "--target-nodes 3"),  # dp 6 does not divide gbs 64
    (["--config", str(LLAMA), "--target-nodes", "0"], "--target-nodes"),
    (["--config", str(LLAMA), "--scaling", "1,two"], "--scaling"),
    (["--config", str(LLAMA), "--png", "x.png"], "--png"),
    (["--config", str(LLAMA), "--schedule", "round_robin"], "round_robin"),
    (["--config", str(LLAMA), "--calibration", "/nonexistent/cal.json"], "--calibration"),
    (["--config", str(LLAMA), "--set", "plan.tp=3"], "tp"),
])
def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    code, out, err = perf(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error:") and "Traceback" not in err
    if needle != "--target-nodes 3":
        assert needle in err, err


def test_bad_target_nodes_names_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = perf(capsys, "--config", str(LLAMA), "--target-nodes", "3")
    assert code == 2 and "at 3 nodes" in err and "fix:" in err


def test_through_the_projection_command() -> None:
    ok = subprocess.run([sys.executable, "-m", "projection", "performance", "--config", str(LLAMA), "--format",
                         "json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert set(KEYS) <= set(json.loads(ok.stdout))
    bad = subprocess.run([sys.executable, "-m", "projection", "performance", "--config", str(LLAMA),
                          "--target-nodes", "3"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.startswith("error:")


def test_schedules_table_marks_only_a_schedule_whose_memory_fits() -> None:
    """A schedule without a memory estimate (dualpipe) or out of memory is never 'the fastest that fits'."""
    from dataclasses import replace

    from projection import api
    from projection.perf import compare_schedules
    from projection.report.perf_tables import schedules_table as _schedules_table

    sc = api.load(LLAMA)
    projs = compare_schedules(sc)
    fastest = min(projs, key=lambda p: p.step_time_s)
    unmodelled = replace(fastest, schedule="dualpipe", memory=None, step_time_s=fastest.step_time_s / 2)
    table = _schedules_table([unmodelled, *projs], sc)
    (marked,) = [line for line in table.splitlines() if "<- fastest" in line]
    assert not marked.startswith("dualpipe") and "not modelled" not in marked


def test_equally_fast_schedules_prefer_the_one_that_fits() -> None:
    """Two schedules with the same step time (gpipe and interleaved 1F1B at one microbatch per chunk come out equal):
    the one whose memory fits is chosen over one at risk, whichever is listed first."""
    from dataclasses import replace

    from projection import api
    from projection.perf import compare_schedules
    from projection.report.perf_tables import chosen_schedule as _chosen

    projs = compare_schedules(api.load(LLAMA))
    base = projs[0]
    assert base.memory is not None
    risky = replace(base, schedule="a", memory=replace(base.memory, verdict="at risk"))
    fits = replace(base, schedule="b", memory=replace(base.memory, verdict="fits"),
                   step_time_s=base.step_time_s * (1 + 1e-9))
    assert _chosen([risky, fits]) is fits and _chosen([fits, risky]) is fits
    slower = replace(fits, step_time_s=base.step_time_s * 1.01)
    assert _chosen([risky, slower]) is risky  # a real speed difference still wins


def test_scaling_rows_say_which_peak_their_mfu_is_against(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    """TorchTitan at dp_shard 1 (one node, tp 8) has no FSDP, and under TP no mixed precision: that row runs and is
    measured in fp32, the others in bf16. The table says so per row, and the note names the node count."""
    toml = tmp_path / "llama.toml"
    toml.write_text('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 2048\n'
                    '[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 8\n')
    code, out, err = perf(capsys, "--config", str(toml), "--scaling", "1,2", "--set", "training.global_batch_size=8")
    assert code == 0, err
    one, two = (line.split() for line in out.splitlines()[2:4])
    assert (one[0], one[8], two[0], two[8]) == ("1", "fp32", "2", "bf16")
    assert "note at 1 node: TorchTitan applies no FSDP" in out
    doc = perf_json(capsys, "--config", str(toml), "--scaling", "1,2", "--set", "training.global_batch_size=8")
    assert [r["peak_dtype"] for r in doc["scaling"]] == ["fp32", "bf16"]


def test_schedule_all_still_reports_a_schedule_name_the_file_gets_wrong(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    """Only a valid schedule that does not fit the plan is passed over by --schedule all; a misspelt one is the
    file's error and is reported."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(LLAMA.read_text().replace("plan:\n", "plan:\n  schedule: one_f_one_b\n", 1))
    code, _, err = perf(capsys, "--config", str(bad), "--schedule", "all")
    assert code == 2 and "key 'plan.schedule'" in err and "one_f_one_b" in err


def test_a_global_batch_too_small_for_the_target_offers_a_smaller_micro_batch(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Global batch 96 at micro batch 2 (tp 2, pp 2): at 16 nodes (dp 32) micro batch x dp = 64 does not divide it.
    Besides a larger global batch, the fix offers micro batch 1 (the recipe's global batch kept), and that runs."""
    cfg = tmp_path / "mbs2.yaml"
    cfg.write_text(LLAMA.read_text(encoding="utf-8").replace("micro_batch_size: 1", "micro_batch_size: 2")
                   .replace("global_batch_size: 64", "global_batch_size: 96"), encoding="utf-8")
    code, _, err = perf(capsys, "--config", str(cfg), "--target-nodes", "16")
    assert code == 2 and "--set training.micro_batch_size=1 (3 microbatches per rank)" in err
    doc = perf_json(capsys, "--config", str(cfg), "--target-nodes", "16", "--set", "training.micro_batch_size=1")
    assert doc["n_microbatches"] == 3


def test_json_stage_costs_are_what_the_simulation_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """1F1B runs whole backwards: the JSON's I and W add up to B. A split-backward schedule (ZB-H1) runs I and W
    actions priced on their own (the input gradient's reduction no longer hides behind the weight gradient), and
    those are what its JSON lists."""
    whole = perf_json(capsys, "--config", str(LLAMA))["stages"]
    assert all(s["i_s"] + s["w_s"] == pytest.approx(s["b_s"], rel=1e-12) for s in whole)
    split = perf_json(capsys, "--config", str(LLAMA), "--schedule", "zb_h1")["stages"]
    assert all(s["i_s"] + s["w_s"] >= s["b_s"] * (1 - 1e-12) for s in split)
    assert [s["f_s"] for s in split] == [s["f_s"] for s in whole]


def test_no_micro_batch_is_offered_that_the_schedule_refuses(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    """Interleaved pp 4, micro batch 4, global batch 96 at 8 nodes (dp 16): micro batch 3 divides the global batch
    but leaves 2 microbatches per rank, fewer than pp, and 1 leaves 6, not a multiple of pp: neither is offered."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py --num-layers 16 --hidden-size 2048 "
                      "--num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 "
                      "--micro-batch-size 4 --global-batch-size 96 --pipeline-model-parallel-size 4 "
                      "--num-layers-per-virtual-pipeline-stage 2 --bf16 --use-distributed-optimizer\n")
    code, _, err = perf(capsys, "--config", str(script), "--target-nodes", "8")
    assert code == 2 and "training.micro_batch_size=" not in err


def test_target_nodes_reports_the_targets_problems_not_the_default_starts(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path) -> None:
    """A file without a cluster size whose plan fails everywhere (32 layers over pp 3): --target-nodes 4 reports
    that problem alone, not the world size of the 1 node assumed by default, which 4 nodes do not have."""
    text = LLAMA.read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text[:text.index("cluster:")].replace("tp: 2", "tp: 8").replace("pp: 2", "pp: 3"),
                   encoding="utf-8")
    for flags in (("--target-nodes", "6"), ("--scaling", "1,6")):
        code, _, err = perf(capsys, "--config", str(bad), *flags)
        assert code == 2 and "cannot be split evenly" in err and "world size" not in err, (flags, err)
    # a target the grid does not divide: the fix names the flag that set it
    grid = tmp_path / "grid.yaml"
    grid.write_text(text[:text.index("cluster:")].replace("tp: 2", "tp: 8"), encoding="utf-8")
    code, _, err = perf(capsys, "--config", str(grid), "--target-nodes", "3")
    assert code == 2 and "world size 24" in err and "change --target-nodes/--gpus-per-node" in err, err


def test_engine_flag_says_when_a_framework_runtime_is_walked_instead(capsys: pytest.CaptureFixture[str]) -> None:
    """--engine picks the simulator where no framework runtime applies; on a Megatron pipeline, walked as Megatron's
    schedules.py runs it, the projection says the flag was not used (and says nothing when the flag is not given)."""
    megatron = REPO.parent / "shared" / "fixtures" / "megatron" / "gpt3_mcore_te_tp1_pp4_vp1" / "model_config.yaml"
    if not megatron.exists():
        pytest.skip("../shared/fixtures is absent (a user's clone)")
    asked = perf_json(capsys, "--config", str(megatron), "--engine", "dag")
    plain = perf_json(capsys, "--config", str(megatron))
    assert asked["engine"] == plain["engine"] == "megatron"
    assert any(n.startswith("--engine dag not used") for n in asked["notes"])
    assert not any(n.startswith("--engine") for n in plain["notes"])
    native = perf_json(capsys, "--config", str(LLAMA), "--engine", "dag")
    assert native["engine"] == "dag" and not any(n.startswith("--engine") for n in native["notes"])


def test_scaling_rows_are_the_target_nodes_projections_of_one_start(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    """A file without a cluster size whose global batch follows the world (a local batch per rank, as TorchTitan's
    global_batch_size -1): every --scaling row, whatever the other counts listed, is what --target-nodes N projects
    from the one starting point, so the global batch is the same in all of them."""
    text = LLAMA.read_text(encoding="utf-8")
    free = tmp_path / "free.yaml"
    free.write_text(text[:text.index("cluster:")].replace("global_batch_size: 64", "local_batch_size: 32"),
                    encoding="utf-8")
    assert "local_batch_size: 32" in free.read_text(encoding="utf-8")
    target = perf_json(capsys, "--config", str(free), "--target-nodes", "4")
    for counts in ("1,4", "2,4", "4"):
        row = perf_json(capsys, "--config", str(free), "--scaling", counts)["projections"][-1]
        assert row["nodes"] == 4 and row["step_time_s"] == pytest.approx(target["step_time_s"], rel=1e-12), counts
        assert row["model_flops_per_step"] == target["model_flops_per_step"], counts
    # 32 sequences per DP rank at the 1-node start (dp 2): 64, kept at 4 nodes
    sequences = target["tokens_per_s_per_gpu"] * target["step_time_s"] * target["world_size"] / SEQ
    assert sequences == pytest.approx(64, rel=1e-9)


def test_a_pp_vis_folder_at_the_trace_path_is_refused_before_any_work(capsys: pytest.CaptureFixture[str],
                                                                      tmp_path: Path) -> None:
    same = tmp_path / "X"
    code, out, err = perf(capsys, "--config", str(LLAMA), "--pp-vis", str(same), "--trace", str(same))
    assert code == 2 and out == "" and "the same path as --trace" in err and not same.exists()


def test_the_scaling_trace_says_which_row_it_is(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    code, out, _ = perf(capsys, "--config", str(LLAMA), "--scaling", "1,2", "--trace", str(trace))
    assert code == 0 and f"wrote {trace} (the 2-node row)" in out and trace.exists()


def test_an_inapplicable_torchtitan_schedule_lists_those_torchtitan_would_run(capsys: pytest.CaptureFixture[str]
                                                                               ) -> None:
    """TorchTitan sets the stages per rank by the schedule: the ones offered are those that load as --schedule
    NAME loads them (interleaved 1F1B and ZB-V on two stages per rank), not those of the file's one stage."""
    toml = REPO / "benchmarks" / "torchtitan_runs" / "t5_llama31_405b_fsdp8_tp8_pp8_1f1b.toml"
    code, _, err = perf(capsys, "--config", str(toml), "--nodes", "64", "--hardware", "h100-sxm", "--schedule",
                        "dualpipev")
    assert code == 2 and "use one of gpipe, 1f1b, interleaved_1f1b, zbv;" in err
