"""Pipeline schedules as data: builders, well-formedness and deadlock checks, in-flight counts, CSV notation."""

from __future__ import annotations

import pytest

from projection.schedule.action import Action, Schedule
from projection.schedule.checks import check_schedule, describe_deadlock, find_deadlock
from projection.schedule.csv import dumps_csv, loads_csv
from projection.schedule.inflight import (
    awaiting_w_timeline,
    inflight_timeline,
    peak_awaiting_w,
    peak_inflight,
    peak_inflight_total,
    peak_weighted,
)
from projection.schedule.interleaved import interleaved_1f1b, schedule_table
from projection.schedule.registry import SCHEDULE_NAMES, build_schedule

PPS = (2, 3, 4, 8)
VPPS = (1, 2, 3)


def microbatch_grid(pp: int) -> tuple[int, ...]:
    return (pp, 2 * pp, 3 * pp + 1)


def unit_time_spans(s: Schedule, dur: dict[str, int] | None = None) -> tuple[int, list[int]]:
    """Run each rank's list in order, every action as soon as its inputs exist; (makespan, busy span per rank)."""
    dur = dur or {"F": 1, "I": 1, "W": 1, "B": 2}
    finish: dict[tuple[str, int, int], int] = {}
    pos = [0] * s.n_ranks
    clock = [0] * s.n_ranks
    first: list[int | None] = [None] * s.n_ranks
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(s.actions):
            while pos[r] < len(acts):
                a = acts[pos[r]]
                if a.kind == "F":
                    prev = s.prev_stage(a.stage, a.microbatch)
                    deps = [] if prev is None else [("F", prev, a.microbatch)]
                elif a.kind == "W":
                    deps = [("G", a.stage, a.microbatch)]
                else:
                    nxt = s.next_stage(a.stage, a.microbatch)
                    deps = [("F", a.stage, a.microbatch)] + ([] if nxt is None else [("G", nxt, a.microbatch)])
                if any(d not in finish for d in deps):
                    break
                start = max([clock[r]] + [finish[d] for d in deps])
                first[r] = start if first[r] is None else first[r]
                clock[r] = start + dur[a.kind]
                finish["G" if a.kind in "BI" else a.kind, a.stage, a.microbatch] = clock[r]
                pos[r] += 1
                progress = True
    assert all(pos[r] == len(acts) for r, acts in enumerate(s.actions))
    return max(clock), [clock[r] - (first[r] or 0) for r in range(s.n_ranks)]


# ---------------------------------------------------------------------------------------------- well formed


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_every_builder_is_well_formed_over_the_grid(name: str) -> None:
    built = 0
    for pp in PPS:
        for vpp in VPPS:
            for m in microbatch_grid(pp):
                try:
                    s = build_schedule(name, pp, m, vpp)
                except ValueError:
                    continue
                built += 1
                assert check_schedule(s) == [], (name, pp, vpp, m)
                assert find_deadlock(s) == []
                assert s.name == name and s.n_ranks == pp and s.n_microbatches == m
    assert built >= 3, f"{name}: too few legal combinations in the grid ({built})"


@pytest.mark.parametrize("pp", PPS)
@pytest.mark.parametrize("vpp", VPPS)
def test_torch_style_interleaved_is_well_formed(pp: int, vpp: int) -> None:
    for m in (1, pp - 1, pp, pp + 1, 2 * pp, 10):
        try:
            s = interleaved_1f1b(pp, m, vpp, style="torch")
        except ValueError:
            continue
        assert check_schedule(s) == [], (pp, vpp, m)


def test_placements_follow_the_stage_convention() -> None:
    s = build_schedule("interleaved_1f1b", 4, 8, 2)
    assert s.stage_to_rank == (0, 1, 2, 3, 0, 1, 2, 3)
    for name in ("zbv", "v_half", "v_min", "dualpipev"):
        assert build_schedule(name, 4, 8, 2).stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    assert build_schedule("dualpipe", 4, 8).stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)


@pytest.mark.parametrize(("name", "pp", "m", "vpp", "words"), [
    ("1f1b", 4, 8, 2, "interleaved_1f1b"),
    ("zb_h1", 4, 8, 2, "vpp must be 1"),
    ("zbv", 4, 8, 1, "exactly two stages"),
    ("v_min", 4, 8, 3, "exactly two stages"),
    ("dualpipev", 4, 7, 2, ">= 2 * pp"),
    ("dualpipe", 3, 12, 1, "even pp"),
    ("dualpipe", 4, 6, 1, "even n_microbatches >= 2 * pp"),
    ("dualpipe", 4, 9, 1, "even n_microbatches"),
    ("dualpipe", 4, 8, 2, "vpp must be 1"),
    ("interleaved_1f1b", 4, 10, 2, "must be 0 or >= pp"),
    ("interleaved_1f1b", 4, 3, 2, "[pp, n_microbatches]"),
    ("nope", 4, 8, 1, "unknown schedule"),
    ("1f1b", 0, 8, 1, "pp must be a positive integer"),
    ("gpipe", 2, 0, 1, "n_microbatches must be a positive integer"),
])
def test_impossible_combinations_raise_clear_errors(name: str, pp: int, m: int, vpp: int, words: str) -> None:
    with pytest.raises(ValueError) as err:
        build_schedule(name, pp, m, vpp)
    assert words in str(err.value)


def test_megatron_group_size_rules() -> None:
    assert check_schedule(build_schedule("interleaved_1f1b", 4, 10, 2, microbatch_group_size=5)) == []
    assert check_schedule(build_schedule("interleaved_1f1b", 3, 11, 2, microbatch_group_size=4)) == []  # 11 % 4 = 3
    with pytest.raises(ValueError, match="must lie in"):
        build_schedule("interleaved_1f1b", 4, 8, 2, microbatch_group_size=3)
    with pytest.raises(ValueError, match="torch"):
        build_schedule("1f1b", 4, 3, style="torch")
    with pytest.raises(ValueError, match="derived"):
        build_schedule("interleaved_1f1b", 4, 8, 2, microbatch_group_size=4, style="torch")
    # other schedules ignore the group size, so a plan can always pass it
    assert build_schedule("1f1b", 4, 8, microbatch_group_size=4) == build_schedule("1f1b", 4, 8)


def test_builders_are_deterministic() -> None:
    for name in SCHEDULE_NAMES:
        vpp = 2 if name in ("zbv", "v_half", "v_min", "dualpipev") else 1
        assert build_schedule(name, 4, 12, vpp) == build_schedule(name, 4, 12, vpp)


# ------------------------------------------------------------------------------------------------ orderings


def test_gpipe_and_1f1b_orders() -> None:
    g = build_schedule("gpipe", 2, 3)
    assert [str(a) for a in g.actions[1]] == ["1F0", "1F1", "1F2", "1B0", "1B1", "1B2"]
    s = build_schedule("1f1b", 4, 6)
    assert " ".join(map(str, s.actions[1])) == "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5"
    assert " ".join(map(str, s.actions[3])) == "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5"


def test_megatron_schedule_table_example() -> None:
    # Megatron's own example (schedules.py, forward_backward_pipelining_with_interleaving): PP2 N3 M5 VP2.
    assert schedule_table(5, 2, 3) == list(zip([0, 1, 2, 0, 1, 2, 3, 4, 3, 4], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1],
                                               strict=True))


def test_megatron_and_torch_interleaved_agree_when_m_is_a_multiple_of_pp() -> None:
    for pp in PPS:
        for vpp in (2, 3):
            for m in (pp, 2 * pp, 3 * pp):
                assert interleaved_1f1b(pp, m, vpp).actions == interleaved_1f1b(pp, m, vpp, style="torch").actions


def test_megatron_and_torch_interleaved_differ_by_design() -> None:
    # vpp = 1: Megatron falls back to plain 1F1B (warm-up pp-r-1), torch keeps 2(pp-r-1).
    meg, tor = interleaved_1f1b(4, 8, 1), interleaved_1f1b(4, 8, 1, style="torch")
    assert peak_inflight_total(meg) == [4, 3, 2, 1]
    assert peak_inflight_total(tor) == [7, 5, 3, 1]
    # m = 10, pp = 4: torch groups 5 microbatches per round; Megatron needs
    # --microbatch-group-size-per-virtual-pipeline-stage 5.
    tor10 = interleaved_1f1b(4, 10, 2, style="torch")
    assert tor10.actions == interleaved_1f1b(4, 10, 2, microbatch_group_size=5).actions
    # m < pp: torch only.
    assert check_schedule(interleaved_1f1b(4, 3, 2, style="torch")) == []


def test_zero_bubble_unit_time_bubbles() -> None:
    for pp in PPS:
        for m in (pp, 2 * pp, 3 * pp + 1):
            one, _ = unit_time_spans(build_schedule("1f1b", pp, m))
            assert one == 3 * (m + pp - 1)  # 1F1B with T_F = 1, T_B = 2
            h1, _ = unit_time_spans(build_schedule("zb_h1", pp, m))
            assert h1 == 3 * m + pp - 1  # bubble (pp-1)(T_F + T_I - T_W) = pp - 1
            h2, spans = unit_time_spans(build_schedule("zb_h2", pp, m))
            assert h2 <= h1
            if m >= 2 * pp:
                assert spans == [3 * m] * pp  # parallelogram: no rank idles between its first and last pass


def test_zbv_and_v_schedules_unit_time() -> None:
    for pp in (4, 8):
        m = 4 * pp
        work = 6 * m  # two chunks x (F + I + W) per microbatch
        zb, _ = unit_time_spans(build_schedule("zbv", pp, m, 2))
        half, _ = unit_time_spans(build_schedule("v_half", pp, m, 2))
        vmin, _ = unit_time_spans(build_schedule("v_min", pp, m, 2))
        assert 1 - work / zb < 0.06
        assert zb <= half <= vmin
        assert 1 - work / half < 0.15
        assert 1 - work / vmin < 0.3


# ------------------------------------------------------------------------------------------------- in flight


@pytest.mark.parametrize("pp", PPS)
def test_inflight_closed_forms(pp: int) -> None:
    for m in (1, pp - 1 or 1, pp, 2 * pp, 3 * pp + 1):
        assert peak_inflight_total(build_schedule("1f1b", pp, m)) == [min(pp - r, m) for r in range(pp)]
        assert peak_inflight_total(build_schedule("zb_h1", pp, m)) == [min(pp - r, m) for r in range(pp)]
        assert peak_inflight_total(build_schedule("zb_h2", pp, m)) == [min(2 * (pp - r) - 1, m) for r in range(pp)]
        assert peak_inflight_total(build_schedule("gpipe", pp, m)) == [m] * pp
        assert peak_inflight_total(build_schedule("gpipe", pp, m, 2)) == [2 * m] * pp
    for vpp in (2, 3):
        for m in (pp, 2 * pp, 4 * pp):
            total = m * vpp
            want = [min((pp - r - 1) * 2 + (vpp - 1) * pp + 1, total) for r in range(pp)]
            assert peak_inflight_total(build_schedule("interleaved_1f1b", pp, m, vpp)) == want, (vpp, m)
        g = pp + 1
        want = [min((pp - r - 1) * 2 + (vpp - 1) * g + 1, 3 * g * vpp) for r in range(pp)]
        assert peak_inflight_total(build_schedule("interleaved_1f1b", pp, 3 * g, vpp, microbatch_group_size=g)) == want


@pytest.mark.parametrize("pp", PPS)
def test_v_and_dualpipe_inflight(pp: int) -> None:
    m = 3 * pp
    assert peak_inflight_total(build_schedule("zbv", pp, m, 2)) == [2 * pp] * pp  # = pp full-stage microbatches
    assert peak_inflight_total(build_schedule("dualpipev", pp, 2 * m, 2)) == [2 * pp + 1] * pp
    if pp % 2 == 0:
        assert peak_inflight_total(build_schedule("dualpipe", pp, 2 * m)) == [pp + 1] * pp  # DeepSeek-V3: PP + 1
    for name, cap in (("v_half", 2 * ((pp + 2) // 2)), ("v_min", 2 * ((pp + 4) // 3))):
        s = build_schedule(name, pp, m, 2)
        for live, wait in zip(inflight_timeline(s), awaiting_w_timeline(s), strict=True):
            for cur, pend in zip(live, wait, strict=True):
                assert 2 * sum(cur.values()) + sum(pend.values()) <= 2 * cap  # W keeps half a chunk (module doc)


def test_inflight_per_stage_and_awaiting_w() -> None:
    s = build_schedule("interleaved_1f1b", 2, 4, 2)
    tl = inflight_timeline(s)
    assert [sorted(d) for d in tl[0][:1]] == [[0, 2]]
    assert peak_inflight(s)[0] == {0: 3, 2: 2} and sum(peak_inflight(s)[0].values()) == peak_inflight_total(s)[0]
    assert peak_awaiting_w(build_schedule("1f1b", 4, 8)) == [{r: 0} for r in range(4)]
    zb = build_schedule("zb_h1", 4, 8)
    assert [sum(d.values()) for d in peak_awaiting_w(zb)] == [1, 2, 3, 4]  # rank r defers r W passes, plus the current
    # weighted peak: stage 2 activations are ten times stage 0's on rank 0
    assert peak_weighted(s, {0: 1.0, 2: 10.0})[0] == max(c.get(0, 0) + 10 * c.get(2, 0) for c in tl[0])
    assert peak_weighted(zb, {}, {0: 1.0})[0] == 1.0


# ----------------------------------------------------------------------------------------- checks, deadlock


def _sched(rows: list[str], n_stages: int, stage_to_rank: tuple[int, ...], m: int) -> Schedule:
    actions = tuple(tuple(Action.parse(t) for t in row.split()) for row in rows)
    return Schedule("hand", len(rows), n_stages, m, stage_to_rank, actions)


def test_deadlock_is_found_and_explained() -> None:
    # rank 1 runs microbatch 1 before 0 while rank 0 insists on finishing microbatch 0 first
    bad = _sched(["0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0"], 2, (0, 1), 2)
    assert find_deadlock(bad) == [Action(0, "B", 0), Action(1, "F", 1)]
    why = describe_deadlock(bad)
    assert "rank 0 is blocked at 0B0" in why[0] and "1B0 or 1I0 (rank 1)" in why[0]
    assert "rank 1 is blocked at 1F1" in why[1] and "0F1 (rank 0)" in why[1]
    assert any("blocked" in p for p in check_schedule(bad))


def test_check_schedule_names_each_problem() -> None:
    good = _sched(["0F0 0I0 0W0", "1F0 1B0"], 2, (0, 1), 1)
    assert check_schedule(good) == []
    problems = check_schedule(_sched(["0F0 0F0 0W0 0I0", "1F0 1B0 1W0"], 2, (0, 1), 1))
    assert "0F0 appears 2 times" in problems
    assert any("0W0 (position 2) comes before 0I0" in p for p in problems)
    assert any("both a full backward B and a split I/W" in p for p in problems)
    problems = check_schedule(_sched(["0F0 0B0 1F0", "1B0"], 2, (0, 1), 1))
    assert any("1F0 runs stage 1, which lives on rank 1" in p for p in problems)
    assert check_schedule(_sched(["0F0 0I0", "1F0 1B0"], 2, (0, 1), 1)) == ["stage 0 microbatch 0 lacks W"]
    assert any("out of range" in p for p in check_schedule(_sched(["0F0 0B0 0F5", "1F0 1B0"], 2, (0, 1), 1)))
    assert any("before its forward" in p for p in check_schedule(_sched(["0B0 0F0", "1F0 1B0"], 2, (0, 1), 1)))


def test_dualpipe_routes_and_model_stages() -> None:
    s = build_schedule("dualpipe", 4, 8)
    assert s.route(0) == (0, 1, 2, 3) and s.route(7) == (4, 5, 6, 7)
    assert s.prev_stage(4, 5) is None and s.next_stage(3, 0) is None and s.next_stage(5, 6) == 6
    assert [s.model_stage(st) for st in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert build_schedule("zbv", 4, 8, 2).model_stage(6) == 6
    for r in range(4):
        for i in s.overlapped[r]:
            assert s.actions[r][i].kind == "F" and s.actions[r][i + 1].kind == "B"


# ------------------------------------------------------------------------------------------------------ CSV


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_csv_round_trip(name: str) -> None:
    vpp = 2 if name in ("zbv", "v_half", "v_min", "dualpipev") else 1
    s = build_schedule(name, 4, 8, vpp)
    back = loads_csv(dumps_csv(s), name=name)
    assert back == s


def test_csv_load_torch_notation() -> None:
    text = "0F0,,0F1,0I0,(0F2;0B1)OVERLAP_F_B,0W0,0B2,0REDUCE_GRAD\n1F0,1I0,1SEND_B0,1F1,1B1,1W0,1F2,1B2\n"
    s = loads_csv(text)
    assert (s.n_ranks, s.n_stages, s.n_microbatches, s.stage_to_rank) == (2, 2, 3, (0, 1))
    assert [str(a) for a in s.actions[0]] == ["0F0", "0F1", "0I0", "0F2", "0B1", "0W0", "0B2"]
    assert s.overlapped == ((3,), ())
    assert Action(1, "SEND_B", 0) in s.actions[1]
    assert check_schedule(s) == []
    with pytest.raises(ValueError, match="on rank 0 and on rank 1"):
        loads_csv("0F0,0B0\n0F1\n")
    with pytest.raises(ValueError, match="rank 1: not an action"):
        loads_csv("0F0,0B0\n1Q0\n")
    with pytest.raises(ValueError, match="empty"):
        loads_csv("")


@pytest.mark.parametrize(("name", "pp", "m", "vpp"), [("1f1b", 4, 16, 1), ("interleaved_1f1b", 4, 16, 3),
                                                      ("zbv", 4, 16, 2), ("dualpipev", 4, 16, 2), ("gpipe", 2, 5, 1)])
def test_peak_candidates_give_the_weighted_peak(name: str, pp: int, m: int, vpp: int) -> None:
    """The few non-dominated states hold the same weighted peak as the whole timeline, for random weights."""
    import random

    from projection.schedule.inflight import inflight_timeline, peak_candidates
    from projection.schedule.registry import build_schedule

    s = build_schedule(name, pp, m, vpp)
    rng = random.Random(0)
    for _ in range(20):
        w = {st: rng.random() for st in range(s.n_stages)}
        for r in range(pp):
            full = max(sum(n * w[k] for k, n in d.items()) for d in inflight_timeline(s)[r])
            cand = max(sum(n * w[k] for k, n in st) for st in peak_candidates(s)[r])
            assert cand == pytest.approx(full, rel=1e-12)


def test_a_group_size_the_user_gave_is_to_be_changed_and_the_hint_is_one_megatron_accepts() -> None:
    """An audit: with --microbatch-group-size 5 given, the refusal said 'or set --microbatch-group-size'. The hint now
    says change it, and its example is one Megatron's check accepts."""
    from projection.schedule.interleaved import megatron_group_size

    for group, verb in ((5, "change"), (None, "set")):
        with pytest.raises(ValueError) as e:
            megatron_group_size(4, 16 if group else 10, group)
        text = str(e.value)
        assert f"or {verb} --microbatch-group-size-per-virtual-pipeline-stage" in text
        example = int(text.rsplit("e.g. ", 1)[1])
        assert megatron_group_size(4, 16 if group else 10, example) == example
