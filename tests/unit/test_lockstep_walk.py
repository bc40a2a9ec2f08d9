"""sim/lockstep.py: the lock-step walk torch up to 2.9 runs interleaved 1F1B by, its selection by --pytorch and
ParallelPlan.pipeline_runtime, and its errors. The walk against torch's own runtime is
tests/oracle/test_pipeline_lockstep_gloo.py; the time steps against torch's pipeline_order,
tests/oracle/test_schedules_vs_torch.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projection.errors import ConfigError
from projection.schedule.interleaved import interleaved_1f1b, torch_group_size, torch_time_steps
from projection.sim.costs import StageCosts
from projection.sim.dag import walk
from projection.sim.lockstep import lockstep_walk, received_too_late
from projection.specs.plan import torch_pipeline_runtime
from tests.cli.test_performance_cli import perf

REPO = Path(__file__).resolve().parents[2]
T5 = REPO / "benchmarks" / "torchtitan_runs" / "t5_llama31_405b_fsdp8_tp8_pp8_interleaved1f1b.toml"


def test_a_two_rank_pipeline_by_hand() -> None:
    """pp 2, 2 microbatches, one stage per rank, F 1 s and B 2 s, no p2p time. torch's time steps: rank 0 runs
    F0, F1 at steps 0, 1 and B0, B1 at 5, 7; rank 1 runs F0, B0, F1, B1 at steps 1-4. Step by step, each rank
    waiting at every step for the neighbour it sends to or receives from:
      t0: r0 F0 0-1 (sends to r1)            -> both done at 1
      t1: r0 F1 1-2 (sends), r1 F0 1-2        -> both 2
      t2: r1 B0 2-4 (sends to r0)             -> both 4
      t3: r1 F1 4-5 (last stage: no send)     -> r0 4, r1 5
      t4: r1 B1 5-7 (sends)                   -> both 7
      t5: r0 B0 7-9; t7: r0 B1 9-11           -> step 11 s
    The dependency walk runs r0's B0 as soon as its gradient is there (4-6) and B1 at 7-9: 9 s."""
    sched = interleaved_1f1b(2, 2, 1, style="torch")
    assert torch_time_steps(2, 2, 1) == ((0, 1, 5, 7), (1, 2, 3, 4))
    costs = StageCosts.from_lists([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 0.0)
    res = lockstep_walk(sched, costs, torch_time_steps(2, 2, 1))
    assert res.step_time_s == pytest.approx(11.0)
    assert walk(sched, costs).step_time_s == pytest.approx(9.0)


def test_a_batch_waits_for_its_transfer() -> None:
    """The same pipeline with 0.5 s per transfer: the steps whose batch carries a send take 0.5 s longer (t0, t1,
    t2 and t4 exchange; t3, t5 and t7 do not): 11 + 4 x 0.5 = 13 s."""
    sched = interleaved_1f1b(2, 2, 1, style="torch")
    costs = StageCosts.from_lists([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 0.5)
    assert lockstep_walk(sched, costs, torch_time_steps(2, 2, 1)).step_time_s == pytest.approx(13.0)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 5), vpp=st.integers(1, 3), m=st.integers(1, 12), seed=st.integers(0, 10**6),
       lat=st.sampled_from([0.0, 0.05, 0.5]))
def test_lock_step_never_beats_the_dependency_walk(pp: int, vpp: int, m: int, seed: int, lat: float) -> None:
    """Lock-step only adds waits to the same order (every input is received in an earlier step's batch), so no
    action starts earlier than in the dependency walk and the step is at least as long."""
    try:
        torch_group_size(pp, m)
    except ValueError:
        return
    sched = interleaved_1f1b(pp, m, vpp, style="torch")
    costs = random_costs(seed, pp * vpp, lat)
    if received_too_late(sched, torch_time_steps(pp, m, vpp)) is not None:
        with pytest.raises(ConfigError, match="is received at the end of step"):
            lockstep_walk(sched, costs, torch_time_steps(pp, m, vpp))
        return
    lock, dep = lockstep_walk(sched, costs, torch_time_steps(pp, m, vpp)), walk(sched, costs)
    assert lock.step_time_s >= dep.step_time_s - 1e-9
    assert all(a >= d - 1e-9 for a, d in zip(lock.run.start, dep.run.start, strict=True))
    if pp == 1:  # one rank: no neighbour to wait for
        assert lock.step_time_s == pytest.approx(dep.step_time_s)


def random_costs(seed: int, n: int, lat: float) -> StageCosts:
    """Stage costs drawn from `seed`: F 0.1-3 s, B 0.1-6 s per stage (no W), `lat` per transfer."""
    import random

    rnd = random.Random(seed)
    f = [rnd.uniform(0.1, 3.0) for _ in range(n)]
    b = [rnd.uniform(0.1, 6.0) for _ in range(n)]
    return StageCosts.from_lists(f, b, [0.0] * n, lat)


def test_which_torch_orders_receive_too_late() -> None:
    """torch's interleaved time steps run a pass before its input is received with vpp >= 2 and fewer microbatches
    than pp (e.g. pp 3, vpp 2, 1 microbatch: rank 0 runs 3F0 at step 1, but 2F0 runs on rank 2 at step 2), and
    never with a multiple of pp microbatches (TorchTitan's default: one per stage)."""
    steps = torch_time_steps(3, 1, 2)
    assert received_too_late(interleaved_1f1b(3, 1, 2, style="torch"), steps) == (
        "3F0 runs at time step 1, but its input from 2F0 is received at the end of step 2")
    for pp in range(1, 9):
        for vpp in range(1, 5):
            for m in range(1, 4 * pp + 1):
                try:
                    torch_group_size(pp, m)
                except ValueError:
                    continue
                early = received_too_late(interleaved_1f1b(pp, m, vpp, style="torch"), torch_time_steps(pp, m, vpp))
                if m % pp == 0 or vpp == 1:
                    assert early is None, (pp, vpp, m)
                elif m < pp:
                    assert early is not None, (pp, vpp, m)


def test_time_steps_that_do_not_fit_the_schedule_are_refused() -> None:
    sched = interleaved_1f1b(2, 2, 1, style="torch")
    costs = StageCosts.from_lists([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 0.0)
    for steps in (((0, 1, 5), (1, 2, 3, 4)), ((0, 1, 1, 7), (1, 2, 3, 4)), ((-1, 1, 5, 7), (1, 2, 3, 4))):
        with pytest.raises(ConfigError, match="time steps"):
            lockstep_walk(sched, costs, steps)


@pytest.mark.parametrize(("text", "want"), [("2.9", "lockstep"), ("2.7.0a0+git1963fc8", "lockstep"),
                                            ("2.5.1+rocm6.2", "lockstep"), ("2.10", "actions"),
                                            ("2.10.0+cu128", "actions"), ("v2.13.0", "actions"), ("3.0", "actions"),
                                            ("two", None), ("2", None), ("2.x", None), ("", None)])
def test_torch_release_names_its_runtime(text: str, want: str | None) -> None:
    assert torch_pipeline_runtime(text) == want


def test_pytorch_flag_picks_the_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    """TorchTitan's Interleaved1F1B (pp 8, vpp 2, 16 microbatches) on torch 2.9 and on 2.10."""
    base = ("--config", str(T5), "--hardware", "h100-sxm", "--nodes", "64", "--format", "json")
    code, out, err = perf(capsys, *base, "--pytorch", "2.9")
    assert code == 0, err
    import json

    old = json.loads(out)
    code, out, err = perf(capsys, *base, "--pytorch", "2.10")
    assert code == 0, err
    new = json.loads(out)
    assert old["engine"] == "lockstep" and new["engine"] != "lockstep"
    assert old["step_time_s"] > new["step_time_s"]


def test_a_release_that_cannot_be_read_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = perf(capsys, "--config", str(T5), "--hardware", "h100-sxm", "--nodes", "64", "--pytorch",
                           "nightly")
    assert code == 2 and out == ""
    assert "--pytorch" in err and "'nightly'" in err and "e.g. --pytorch 2.9" in err and "Traceback" not in err


def test_an_order_torch_cannot_run_in_lock_step_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """4 microbatches (microbatch size 8 of a local batch of 32) on pp 8, vpp 2: refused on torch 2.9, at --pytorch,
    and run on torch 2.10, whose runtime waits for each receive."""
    base = ("--config", str(T5), "--hardware", "h100-sxm", "--nodes", "64", "--set",
            "parallelism.pipeline_parallel_microbatch_size=8")
    code, out, err = perf(capsys, *base, "--pytorch", "2.9")
    assert code == 2 and out == ""
    assert "key '--pytorch'" in err and "8F0 runs at time step 4" in err and "multiple of pp = 8" in err
    code, out, err = perf(capsys, *base, "--pytorch", "2.10")
    assert code == 0, err


def test_zbv_and_looped_bfs_run_in_lock_step_too(capsys: pytest.CaptureFixture[str]) -> None:
    """ZB-V and looped breadth-first (gpipe, vpp 2) were PipelineScheduleMulti schedules up to torch 2.9 as well; a
    looped breadth-first order with fewer microbatches than pp reads a buffer before it is received (rank 0 runs
    the forward of stage pp with microbatch 0 at step m, before stage pp - 1's at step pp - 1)."""
    from projection.schedule.registry import build_schedule
    from projection.schedule.timesteps import lockstep_steps

    assert received_too_late(build_schedule("gpipe", 4, 3, 2, style="torch"), lockstep_steps("gpipe", 4, 3, 2)) == (
        "4F0 runs at time step 3, but its input from 3F0 is received at the end of step 3")
    assert all(received_too_late(build_schedule("zbv", pp, m, 2, style="torch"), lockstep_steps("zbv", pp, m, 2))
               is None for pp in range(2, 9) for m in range(1, 4 * pp + 1))
    base = ("--config", str(T5), "--hardware", "h100-sxm", "--nodes", "64", "--schedule", "zbv", "--format", "json")
    import json

    runs = {}
    for version in ("2.9", "2.10"):
        code, out, err = perf(capsys, *base, "--pytorch", version)
        assert code == 0, err
        runs[version] = json.loads(out)
    assert runs["2.9"]["engine"] == "lockstep" and runs["2.10"]["engine"] != "lockstep"
    assert runs["2.9"]["step_time_s"] >= runs["2.10"]["step_time_s"]


def test_schedule_all_leaves_out_a_schedule_its_builder_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """8 microbatches on pp 8: DualPipeV needs 2 pp = 16. `--schedule all` compares the others (it stopped at
    DualPipeV's error), and `--schedule dualpipev` is refused at load, naming the schedules that run."""
    base = ("--config", str(T5), "--hardware", "h100-sxm", "--nodes", "64", "--set",
            "parallelism.pipeline_parallel_microbatch_size=4")
    code, out, err = perf(capsys, *base, "--schedule", "all")
    assert code == 0, err
    assert "interleaved_1f1b" in out and "zbv" in out and "dualpipev" not in out
    code, out, err = perf(capsys, *base, "--schedule", "dualpipev")
    assert code == 2 and "dualpipev needs n_microbatches >= 2 * pp = 16 (got 8)" in err and "use one of" in err
