"""Pipeline engines on hand-computed cases: exact walk, event loop (links, comm streams), results, exports, CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from projection import cli_schedule
from projection.errors import ConfigError
from projection.report.ppvis import load_pp_data, write_pp_vis
from projection.report.timeline_png import write_timeline_png
from projection.report.trace import chrome_trace, write_chrome_trace
from projection.schedule.action import Action, Schedule
from projection.schedule.registry import SCHEDULE_NAMES, build_schedule
from projection.sim.api import rank_costs, simulate, what_if
from projection.sim.costs import CommTask, StageCosts, grad_sync_tasks
from projection.sim.dag import walk
from projection.sim.des import simulate_events

A = Action.parse
V2 = {"zbv", "v_half", "v_min", "dualpipev", "interleaved_1f1b"}


def plain(per_rank: list[str], n_mb: int, name: str = "hand") -> Schedule:
    """One stage per rank; per_rank[r] = 'xF0 xF1 xB0 ...'."""
    acts = tuple(tuple(A(t) for t in row.split()) for row in per_rank)
    return Schedule(name, len(acts), len(acts), n_mb, tuple(range(len(acts))), acts)


def test_1f1b_by_hand() -> None:
    """pp 2, m 2, F 1 s, B 2 s, p2p 0.5 s: every start time worked out on paper."""
    s = build_schedule("1f1b", 2, 2)
    res = walk(s, StageCosts.uniform(2, 1.0, 2.0, None, 0.5))
    got = {str(e.action): (e.start_s, e.end_s) for t in res.timeline for e in t if e.stream == "compute"}
    assert got == {"0F0": (0.0, 1.0), "0F1": (1.0, 2.0), "1F0": (1.5, 2.5), "1B0": (2.5, 4.5), "1F1": (4.5, 5.5),
                   "1B1": (5.5, 7.5), "0B0": (5.0, 7.0), "0B1": (8.0, 10.0)}
    assert res.step_time_s == 10.0
    assert res.busy_s == (6.0, 6.0)
    # idle while a receive is in flight: rank 0 for the gradients [4.5, 5] and [7.5, 8], rank 1 for 0F0 [1, 1.5]
    assert res.exposed_comm_s == (1.0, 0.5)
    assert res.bubble_s == (3.0, 3.5)
    assert res.bubble_ratio == pytest.approx(0.4)
    assert [str(a) for a in res.critical_path] == ["0F0", "1F0", "1B0", "1F1", "1B1", "0B1"]
    assert res.peak_in_flight == (2, 1)


def test_every_builtin_schedule_runs_and_engines_agree() -> None:
    for name in SCHEDULE_NAMES:
        vpp = 2 if name in V2 else 1
        s = build_schedule(name, 4, 8, vpp)
        costs = StageCosts.from_lists([0.9 + 0.1 * i for i in range(s.n_stages)], [2.1] * s.n_stages,
                                      [0.7] * s.n_stages, 0.05).with_comm_tasks(grad_sync_tasks(s, [0.3] * s.n_stages))
        a, b = walk(s, costs), simulate_events(s, costs)
        assert (a.run.start, a.run.end) == (b.run.start, b.run.end), name
        assert a.timeline == b.timeline and a.critical_path == b.critical_path, name
        assert a.step_time_s >= max(a.busy_s), name
        assert a.critical_path, name


def test_links_serialize_transfers() -> None:
    """GPipe pp 2, m 3, F = B = 1 s, p2p 3 s: sharing one link per rank pair queues the transfers."""
    s = build_schedule("gpipe", 2, 3)
    costs = StageCosts.uniform(2, 1.0, 1.0, None, 3.0)
    assert simulate_events(s, costs, links="none").step_time_s == 14.0  # activations land at 4, 5, 6
    paired = simulate_events(s, costs, links="pair")  # activations at 4, 7, 10; gradients at 15, 18, 21
    assert paired.step_time_s == 22.0
    assert simulate_events(s, costs, links="nic").step_time_s == 22.0
    recv = [(e.start_s, e.end_s) for e in paired.timeline[1] if e.stream == "p2p"]
    assert recv == [(1.0, 4.0), (4.0, 7.0), (7.0, 10.0)]


def test_comm_task_overlaps_compute_and_shares_the_nic() -> None:
    """A 4 s DP reduce-scatter on rank 1 after its first backward (ends 3.5 s) overlaps compute; on the NIC it
    delays rank 1's second gradient send, queued behind it."""
    s = plain(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], 2)
    base = StageCosts.uniform(2, 1.0, 1.0, None, 0.5)
    costs = base.with_comm_tasks([CommTask(1, A("1B0"), 4.0, "dp_rs")])
    assert walk(s, base).step_time_s == 7.0
    res = walk(s, costs)
    assert res.step_time_s == 7.5
    comm = [e for e in res.timeline[1] if e.stream == "comm"]
    assert [(e.start_s, e.end_s, e.label) for e in comm] == [(3.5, 7.5, "dp_rs")]
    assert res.exposed_comm_s[1] == 0.5 + 2.0  # waiting for 0F0, then the reduce-scatter after the last compute
    assert simulate_events(s, costs, links="pair").step_time_s == 7.5  # a pair link is not the comm stream
    # NIC: 1B0's gradient goes first (3.5-4), the reduce-scatter 4-8, 1B1's gradient 8-8.5, then 0B1 8.5-9.5
    assert simulate_events(s, costs, links="nic").step_time_s == 9.5


def test_blocking_comm_task_holds_the_rank() -> None:
    """Two stages on one rank (0F0 1F0 1B0 0B0; F 1 s, B 2 s). A 3 s reduction after 1B0 (ends 4 s) overlaps 0B0
    (step 7 s) unless it blocks compute, as FSDP2's final wait does: then 0B0 runs 7-9 s."""
    s = Schedule("hand", 1, 2, 1, (0, 0), (tuple(A(t) for t in ["0F0", "1F0", "1B0", "0B0"]),))
    base = StageCosts.uniform(2, 1.0, 2.0)
    free = base.with_comm_tasks([CommTask(0, A("1B0"), 3.0, "fsdp grad s1")])
    held = base.with_comm_tasks([CommTask(0, A("1B0"), 3.0, "fsdp grad s1", blocks_compute=True)])
    assert walk(s, free).step_time_s == 7.0
    for res in (walk(s, held), simulate_events(s, held), simulate_events(s, held, links="nic")):
        got = {str(e.action): (e.start_s, e.end_s) for e in res.timeline[0] if e.stream == "compute"}
        assert got["0B0"] == (7.0, 9.0)
        assert res.step_time_s == 9.0
        assert res.exposed_comm_s == (3.0,)
        assert [str(a) for a in res.critical_path] == ["0F0", "1F0", "1B0", "0B0"]
    # a blocking task queued behind one that follows a later action would wait for itself
    bad = base.with_comm_tasks([CommTask(0, A("0B0"), 1.0, "late"), CommTask(0, A("1B0"), 1.0, "held",
                                                                             blocks_compute=True)])
    for engine in (walk, simulate_events):
        with pytest.raises(ConfigError, match="'held' holds rank 0's compute after 1B0 but waits on its stream "
                                              "behind 'late', which follows 0B0"):
            engine(s, bad)


def test_overlapped_pairs_wait_for_both_inputs() -> None:
    s = build_schedule("dualpipev", 4, 8, 2)
    res = walk(s, StageCosts.uniform(8, 1.0, 2.0, 1.0, 0.25))
    by_action = {(r, e.action): e for r, t in enumerate(res.timeline) for e in t if e.stream == "compute"}
    for r, idx in enumerate(s.overlapped):
        for i in idx:
            f, b = by_action[r, s.actions[r][i]], by_action[r, s.actions[r][i + 1]]
            assert f.end_s == b.start_s  # the pair runs back to back
    assert simulate_events(s, StageCosts.uniform(8, 1.0, 2.0, 1.0, 0.25)).step_time_s == res.step_time_s


def test_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="deadlock: rank 0 at 0B0 waits for 0F0 and 1B0; rank 1 at 1F0 waits for 0F0"):
        walk(plain(["0B0 0F0", "1F0 1B0"], 1), StageCosts.uniform(2, 1.0, 1.0))
    with pytest.raises(ConfigError, match="deadlock"):
        simulate_events(plain(["0B0 0F0", "1F0 1B0"], 1), StageCosts.uniform(2, 1.0, 1.0))
    with pytest.raises(ConfigError, match="1F0 needs 0F0"):
        walk(plain(["0B0", "1F0 1B0"], 1), StageCosts.uniform(2, 1.0, 1.0))
    with pytest.raises(ConfigError, match="appears twice"):
        walk(plain(["0F0 0F0 0B0", "1F0 1B0"], 1), StageCosts.uniform(2, 1.0, 1.0))
    with pytest.raises(ConfigError, match="costs price 3 stages"):
        walk(build_schedule("1f1b", 2, 2), StageCosts.uniform(3, 1.0, 1.0))
    with pytest.raises(ValueError, match="seconds must be finite"):
        StageCosts.uniform(2, -1.0, 1.0)
    with pytest.raises(ConfigError, match="no link model"):
        simulate(build_schedule("1f1b", 2, 2), StageCosts.uniform(2, 1.0, 1.0), links="nic")


def test_api_what_if_keeps_the_work_fixed_across_vpp() -> None:
    one = what_if("1f1b", 4, 8, fwd_s=1.0, bwd_s=2.0)
    two = what_if("interleaved_1f1b", 4, 8, 2, fwd_s=1.0, bwd_s=2.0)
    assert one.busy_s == two.busy_s == (24.0,) * 4
    assert one.step_time_s == 33.0 and two.step_time_s == 28.5  # (m v + p - 1)(f + b) / v
    dual = build_schedule("dualpipe", 4, 8)
    assert rank_costs(dual, 1.0, 2.0).f_s == (1.0,) * 8  # a microbatch visits one of each rank's two stages
    with pytest.raises(ConfigError, match="microbatch group size"):
        what_if("interleaved_1f1b", 4, 3, 2)


def test_exports(tmp_path: Path) -> None:
    s = build_schedule("zbv", 4, 8, 2)
    res = walk(s, StageCosts.uniform(8, 1.0, 2.0, 1.0, 0.1))
    trace = chrome_trace(res)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len([e for e in xs if e["tid"] == 0]) == sum(len(a) for a in s.actions)
    assert {e["pid"] for e in xs} == {0, 1, 2, 3}
    assert any(e["name"] == "F s7 mb5" for e in xs)
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(res.step_time_s * 1e6)
    json.loads(write_chrome_trace(res, tmp_path / "t.json").read_text())
    out = write_pp_vis(res, tmp_path, activation_gb=0.5)
    assert json.loads((out / "config.json").read_text()) == {"pp_size": 4, "vpp_size": 2, "micro_batches": 8}
    back = load_pp_data(out)  # our dump reads back with the importer
    assert back.iterations[0].step_time_s == pytest.approx(res.step_time_s)
    assert back.iterations[0].bubble_ratio == pytest.approx(res.bubble_ratio)
    r0 = json.loads((out / "pp_rank_0.json").read_text())["0"]
    assert r0["memory"] == pytest.approx(0.5 * res.peak_in_flight[0])
    assert sorted(set(r0["fwd_chunk"])) == [0, 1] and len(r0["wgrad_start"]) == 16
    png = write_timeline_png(res, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _cli(*argv: str) -> int:
    p = argparse.ArgumentParser(prog="projection")
    cli_schedule.add_parser(p.add_subparsers(dest="command", required=True))
    return cli_schedule.run(p.parse_args(list(argv)))


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli("schedule", "--pp", "4", "--microbatches", "8", "--schedule", "1f1b", "--fwd-s", "1", "--bwd-s",
                "2", "--p2p-s", "100ms", "--format", "json", "--trace", str(tmp_path / "t.json")) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["step_time_s"] == pytest.approx(d["closed_form_step_time_s"])
    assert d["step_time_s"] == pytest.approx(33 + 0.6 + 2 * 0.1 * 5)
    assert (tmp_path / "t.json").exists() and len(d["ranks"]) == 4
    assert _cli("schedule", "--pp", "2", "--vpp", "2", "--microbatches", "4", "--schedule", "zbv",
                "--png", str(tmp_path / "t.png")) == 0
    assert "bubble ratio" in capsys.readouterr().out
    (tmp_path / "s.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    assert _cli("schedule", "--csv", str(tmp_path / "s.csv"), "--engine", "des", "--links", "pair") == 0
    assert "step time" in capsys.readouterr().out
    (tmp_path / "bad.csv").write_text("0B0,0F0\n1F0,1B0\n")
    assert _cli("schedule", "--csv", str(tmp_path / "bad.csv")) == 2
    assert "bad.csv" in capsys.readouterr().err
    assert _cli("schedule", "--pp", "4", "--microbatches", "8", "--schedule", "zbv") == 2
    assert "vpp must be 2" in capsys.readouterr().err
    assert _cli("schedule", "--pp", "4", "--microbatches", "8", "--schedule", "1f1b", "--fwd-s", "fast") == 2
    assert "--fwd-s" in capsys.readouterr().err
    assert _cli("schedule", "--pp", "4") == 2
