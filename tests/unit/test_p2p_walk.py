"""sim/p2p_walk.py with schedule/megatron_calls.py and schedule/torch_calls.py: Megatron-LM's blocking p2p calls
around 1F1B and interleaved 1F1B without overlap, and torch.distributed.pipelining's Schedule1F1B; their selection
(ParallelPlan.pipeline_runtime "megatron", set by the Megatron loaders; a torch-style 1f1b) and the 2021-era
scatter/gather of p2p tensors. The walks against real runs on gloo: tests/oracle/test_pipeline_megatron_p2p_gloo.py
(Megatron's loops) and tests/oracle/test_real_pipeline_gloo.py (torch's Schedule1F1B)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projection import api
from projection.perf.costmodel import default_cost_model
from projection.perf.placement import boundary_placement, op_placements
from projection.perf.pricing import price_stages
from projection.perf.project import project
from projection.schedule.basic import one_f_one_b
from projection.schedule.interleaved import interleaved_1f1b, megatron_group_size
from projection.schedule.megatron_calls import megatron_calls
from projection.sim.costs import StageCosts
from projection.sim.dag import walk
from projection.sim.p2p_walk import megatron_walk
from tests.cli.test_performance_cli import perf
from tests.unit.test_lockstep_walk import random_costs

ARGS = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --max-position-embeddings 2048 "
        "--micro-batch-size 1 --global-batch-size 32 --vocab-size 32000 --bf16 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 4")


def test_two_ranks_by_hand() -> None:
    """pp 2, 2 microbatches, F 1 s, B 2 s, 0.1 s per transfer. Rank 0 (one warm-up forward): F0 0-1, then
    send_forward waits for rank 1's recv_forward (posted at 0): done 1.1. F1 1.1-2.1, then send_forward_recv_backward
    posted at 2.1. Rank 1: F0 1.1-2.1 (its empty call after F0 costs nothing), B0 2.1-4.1, then
    send_backward_recv_forward posted at 4.1: both ranks' calls pair up and end at 4.2. Rank 0: B0 4.2-6.2, then
    recv_backward; rank 1: F1 4.2-5.2, B1 5.2-7.2, send_backward: 7.3. Rank 0: B1 7.3-9.3, the step.
    The dependency walk lets rank 0 run F1 at 1-2 and rank 1 run F1 as soon as it is free (4.1): 9.2 s."""
    sched = interleaved_1f1b(2, 2, 1)
    costs = StageCosts.from_lists([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 0.1)
    res = megatron_walk(sched, costs)
    assert res.step_time_s == pytest.approx(9.3)
    assert res.engine == "megatron"
    start = {(r, str(a)): s for r in range(2) for a, s in
             zip(sched.actions[r], res.run.start[res.run.compiled.lo[r]:res.run.compiled.hi[r]], strict=True)}
    assert start == pytest.approx({(0, "0F0"): 0.0, (0, "0F1"): 1.1, (0, "0B0"): 4.2, (0, "0B1"): 7.3,
                                   (1, "1F0"): 1.1, (1, "1B0"): 2.1, (1, "1F1"): 4.2, (1, "1B1"): 5.2})
    assert walk(sched, costs).step_time_s == pytest.approx(9.2)


def test_the_interleaved_exchange_couples_neighbours() -> None:
    """pp 4, vpp 2, 8 microbatches with a slow first virtual stage and no transfer time: the steady-state 4-way
    exchange holds every rank until both neighbours end their F+B pair, which the dependency walk never does."""
    sched = interleaved_1f1b(4, 8, 2)
    f = [2.0] + [1.0] * 7
    costs = StageCosts.from_lists(f, [2 * x for x in f], [0.0] * 8, 0.0)
    blocking, free = megatron_walk(sched, costs).step_time_s, walk(sched, costs).step_time_s
    assert blocking > free * 1.02


@settings(max_examples=80, deadline=None)
@given(pp=st.integers(2, 6), vpp=st.integers(1, 3), m=st.integers(1, 14), seed=st.integers(0, 10**6),
       lat=st.sampled_from([0.0, 0.05, 0.5]), overlap=st.booleans())
def test_megatron_calls_never_beat_the_dependency_walk(pp: int, vpp: int, m: int, seed: int, lat: float,
                                                       overlap: bool) -> None:
    """Megatron's calls, blocking or overlapped, only add waits to the same order, so no pass starts earlier than in
    the dependency walk; every send pairs with one receive of the same tensor, and every pass's input is received
    by a call waited before it (megatron_calls checks that)."""
    if vpp > 1:
        try:
            megatron_group_size(pp, m, None)
        except ValueError:
            return
    sched = interleaved_1f1b(pp, m, vpp)
    costs = random_costs(seed, pp * vpp, lat)
    if pp == 2 and vpp > 1 and not overlap:  # Megatron refuses it (test_interleaved_at_pp_2_needs_overlapped_p2p)
        return
    calls = megatron_calls(sched, overlap and vpp > 1)
    assert all(calls.partner[calls.partner[o]] == o and calls.op_key[calls.partner[o]] == calls.op_key[o]
               and calls.op_send[calls.partner[o]] != calls.op_send[o] for o in range(len(calls.partner)))
    assert [sorted(k for k in prog if k >= 0) for prog in calls.programs] == [list(range(len(a)))
                                                                               for a in sched.actions]
    meg, dep = megatron_walk(sched, costs, calls), walk(sched, costs)
    assert meg.step_time_s >= dep.step_time_s - 1e-9
    assert all(a >= d - 1e-9 for a, d in zip(meg.run.start, dep.run.start, strict=True))


@pytest.mark.parametrize(("pp", "m", "group"), [(4, 10, 5), (4, 12, 6), (4, 11, 7), (8, 24, 12)])
def test_microbatch_group_sizes_pair_up(pp: int, m: int, group: int) -> None:
    """--microbatch-group-size-per-virtual-pipeline-stage other than pp: Megatron's warm-up grows with the group,
    and the leading ranks' receives still pair with the sends (megatron_calls checks every pair)."""
    for vpp in (2, 3):
        sched = interleaved_1f1b(pp, m, vpp, microbatch_group_size=group)
        costs = StageCosts.uniform(pp * vpp, 1.0, 2.0, 0.0, 0.01)
        assert megatron_walk(sched, costs).step_time_s >= walk(sched, costs).step_time_s - 1e-9


def test_overlap_waits_each_receive_just_before_its_pass() -> None:
    """Interleaved pp 4, vpp 2, 8 microbatches with a slow first virtual stage and no transfer time: overlapped p2p
    (each receive waited just before the pass that needs it) sits between the dependency walk and the blocking
    4-way exchange."""
    sched = interleaved_1f1b(4, 8, 2)
    f = [2.0] + [1.0] * 7
    costs = StageCosts.from_lists(f, [2 * x for x in f], [0.0] * 8, 0.0)
    free = walk(sched, costs).step_time_s
    overlapped = megatron_walk(sched, costs, overlap=True).step_time_s
    blocking = megatron_walk(sched, costs).step_time_s
    assert free <= overlapped < blocking


def test_other_schedules_are_refused() -> None:
    from projection.errors import ConfigError
    from projection.schedule.registry import build_schedule

    for name, vpp in (("gpipe", 1), ("zb_h1", 1), ("zbv", 2)):
        sched = build_schedule(name, 4, 8, vpp)
        with pytest.raises(ConfigError, match="Megatron"):
            megatron_walk(sched, StageCosts.uniform(sched.n_stages, 1.0, 2.0))


def test_megatron_files_run_megatron_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Megatron-LM file with a pipeline runs Megatron's runtime: blocking 1F1B, blocking interleaved without
    overlap, overlapped interleaved with it (Megatron-LM's default for interleaving); --pytorch does not change it."""
    path = tmp_path / "args.txt"
    engines = {}
    for name, extra in (("1f1b", ""), ("il", " --num-layers-per-virtual-pipeline-stage 1 "
                                            "--no-overlap-p2p-communication"),
                        ("il_overlap", " --num-layers-per-virtual-pipeline-stage 1")):
        path.write_text(ARGS + extra + "\n", encoding="utf-8")
        sc = api.load(path, hardware="mi300x", nodes=1)
        assert sc.plan.pipeline_runtime == "megatron"
        engines[name] = project(sc).engine
        code, out, err = perf(capsys, "--config", str(path), "--hardware", "mi300x", "--pytorch", "2.7",
                              "--format", "json")
        assert code == 0, err
        assert json.loads(out)["engine"] == engines[name]
    assert engines == {"1f1b": "megatron", "il": "megatron", "il_overlap": "megatron"}


def test_primus_pipeline_patches_run_their_own_runtime(tmp_path: Path) -> None:
    path = tmp_path / "args.txt"
    path.write_text(ARGS + " --patch-primus-pipeline --pp-algorithm 1f1b\n", encoding="utf-8")
    try:
        sc = api.load(path, hardware="mi300x", nodes=1)
    except Exception as e:  # the flag spelling of Primus's keys in a Megatron file: read them as a Primus YAML
        pytest.skip(f"Primus keys not accepted as flags here: {e}")
    assert sc.plan.pipeline_runtime == "actions" and not sc.plan.megatron_pipeline


def test_scatter_gather_prices_a_tp_chunk_and_the_gather(tmp_path: Path) -> None:
    """Narayanan et al. 2021 §4.1: each TP rank sends 1/tp of the boundary tensor over its own link and the receiver
    all-gathers the tp chunks over NVLink; with sequence parallelism the tensor is already split, so nothing changes."""
    path = tmp_path / "args.txt"
    path.write_text(ARGS + "\n", encoding="utf-8")
    sc = api.load(path, hardware="mi300x", nodes=2)
    cm = default_cost_model(sc)
    plain = price_stages(sc, cm)
    sg = sc.model_copy(update={"plan": sc.plan.model_copy(update={"p2p_scatter_gather": True})})
    size = 2048 * 1024 * 2  # [s, b, h] in bf16
    assert plain.p2p_bytes == size
    gather = cm.collective_seconds("all_gather", size, op_placements(sg.cluster, sg.plan)["tp"])
    for k, secs in enumerate(price_stages(sg, cm).p2p_fwd_s):
        place = boundary_placement(sg.cluster, sg.plan, k, k + 1)
        assert secs == pytest.approx(cm.collective_seconds("send_recv", size // 2, place) + gather)
        assert plain.p2p_fwd_s[k] == pytest.approx(cm.collective_seconds("send_recv", size, place))
    with_sp = sg.model_copy(update={"plan": sg.plan.model_copy(update={"sp": True})})
    sp_plain = sc.model_copy(update={"plan": sc.plan.model_copy(update={"sp": True})})
    assert price_stages(with_sp, cm).p2p_fwd_s == price_stages(sp_plain, cm).p2p_fwd_s


def test_schedule_command_engine_megatron(capsys: pytest.CaptureFixture[str]) -> None:
    """`projection schedule --engine megatron` gives the walk's step; other schedules are exit 2 naming --engine."""
    from projection.cli import main
    from projection.sim.api import rank_costs

    argv = ["schedule", "--schedule", "interleaved_1f1b", "--pp", "4", "--vpp", "2", "--microbatches", "8",
            "--p2p-s", "0.05", "--format", "json"]
    assert main([*argv, "--engine", "megatron"]) == 0
    got = json.loads(capsys.readouterr().out)
    sched = interleaved_1f1b(4, 8, 2)
    assert got["engine"] == "megatron"
    want = megatron_walk(sched, rank_costs(sched, 1.0, 2.0, p2p_s=0.05)).step_time_s
    assert got["step_time_s"] == pytest.approx(want)
    assert got["closed_form_exact"] is False and got["closed_form_step_time_s"] < got["step_time_s"]
    assert main(["schedule", "--schedule", "zbv", "--pp", "4", "--vpp", "2", "--microbatches", "8", "--engine",
                 "megatron"]) == 2
    err = capsys.readouterr().err
    assert "--engine" in err and "not zbv" in err and "Traceback" not in err
    assert main(["schedule", "--schedule", "interleaved_1f1b", "--pp", "2", "--vpp", "2", "--microbatches", "4",
                 "--engine", "megatron"]) == 2
    assert "key '--pp'" in capsys.readouterr().err


def test_interleaved_at_pp_2_needs_overlapped_p2p(tmp_path: Path) -> None:
    """Megatron-LM refuses interleaving at pp 2 without overlapped p2p; a Bridge or native plan that asks for it is
    refused the same way (Megatron-Core's batches to the one neighbour would pair crosswise), all problems at once."""
    from projection.errors import PlanError

    with pytest.raises(ValueError, match="pp 2 needs overlapped p2p"):
        megatron_calls(interleaved_1f1b(2, 4, 2))
    path = tmp_path / "s.yaml"
    path.write_text("model: {num_layers: 8, hidden_size: 512, num_attention_heads: 8, ffn_hidden_size: 2048, "
                    "vocab_size: 32000}\n"
                    "training: {seq_length: 512, micro_batch_size: 1, global_batch_size: 8}\n"
                    "plan: {pp: 2, vpp: 2, schedule: interleaved_1f1b, pipeline_runtime: megatron, "
                    "overlap: {p2p_comm: false}}\n"
                    "cluster: {hardware: mi300x, nodes: 1, gpus_per_node: 2}\n", encoding="utf-8")
    with pytest.raises(PlanError, match="pipeline size 2 needs overlapped p2p"):
        api.load(path)
    ok = path.read_text().replace("p2p_comm: false", "p2p_comm: true")
    path.write_text(ok, encoding="utf-8")
    assert project(api.load(path)).engine == "megatron"


def test_torch_schedule_1f1b_by_hand() -> None:
    """The same pipeline (pp 2, 2 microbatches, F 1 s, B 2 s, 0.1 s per transfer) as torch's Schedule1F1B runs it:
    rank 0's two warm-up forwards run back to back (F0's send is posted and waited only after F1: rank 1 has been in
    its receive since 0, so it is done at 1.1), and F1's send is fused with B0's receive (posted at 2); rank 1
    receives F0 at 1.1, runs F0 1.1-2.1 and B0 2.1-4.1, then posts [B0's send + F1's receive] at 4.1, which pairs
    with rank 0's batch: both go on at 4.2. Rank 1: F1 4.2-5.2, B1 5.2-7.2, B1's send posted at 7.2; rank 0: B0
    4.2-6.2, B1's receive done at 7.3, B1 7.3-9.3."""
    from projection.sim.p2p_walk import torch_1f1b_walk

    sched = one_f_one_b(2, 2)
    costs = StageCosts.from_lists([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 0.1)
    res = torch_1f1b_walk(sched, costs)
    assert res.step_time_s == pytest.approx(9.3) and res.engine == "torch1f1b"
    start = {(r, str(a)): s for r in range(2) for a, s in
             zip(sched.actions[r], res.run.start[res.run.compiled.lo[r]:res.run.compiled.hi[r]], strict=True)}
    assert start == pytest.approx({(0, "0F0"): 0.0, (0, "0F1"): 1.0, (0, "0B0"): 4.2, (0, "0B1"): 7.3,
                                   (1, "1F0"): 1.1, (1, "1B0"): 2.1, (1, "1F1"): 4.2, (1, "1B1"): 5.2})


@settings(max_examples=40, deadline=None)
@given(pp=st.integers(2, 6), m=st.integers(1, 14), seed=st.integers(0, 10**6), lat=st.sampled_from([0.0, 0.05, 0.5]))
def test_torch_1f1b_never_beats_the_dependency_walk(pp: int, m: int, seed: int, lat: float) -> None:
    from projection.schedule.torch_calls import torch_1f1b_calls
    from projection.sim.p2p_walk import p2p_walk

    rnd = random.Random(seed)
    sched = one_f_one_b(pp, m)
    costs = StageCosts.from_lists([rnd.uniform(0.1, 3.0) for _ in range(pp)],
                                  [rnd.uniform(0.1, 6.0) for _ in range(pp)], [0.0] * pp, lat)
    calls = torch_1f1b_calls(sched)
    assert all(calls.partner[calls.partner[o]] == o for o in range(len(calls.partner)))
    res, dep = p2p_walk(sched, costs, calls, "torch1f1b"), walk(sched, costs)
    assert res.step_time_s >= dep.step_time_s - 1e-9
    assert all(a >= d - 1e-9 for a, d in zip(res.run.start, dep.run.start, strict=True))


def test_torchtitan_1f1b_runs_schedule_1f1b() -> None:
    """A TorchTitan pipeline with `pipeline_parallel_schedule = "1F1B"` is walked as torch's Schedule1F1B runs it
    (on every torch release), its interleaved schedule as the release's runtime does."""
    runs = Path(__file__).resolve().parents[2] / "benchmarks" / "torchtitan_runs"
    one = project(api.load(runs / "t5_llama31_405b_fsdp8_tp8_pp8_1f1b.toml", hardware="h100-sxm", nodes=64))
    assert one.engine == "torch1f1b"
    il = api.load(runs / "t5_llama31_405b_fsdp8_tp8_pp8_interleaved1f1b.toml", hardware="h100-sxm", nodes=64)
    assert not il.plan.torch_1f1b_pipeline and il.plan.pipeline_runtime != "megatron"


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(2, 5), vpp=st.integers(1, 3), mult=st.integers(1, 3), seed=st.integers(0, 10**6),
       variant=st.sampled_from(["blocking", "overlap", "torch1f1b"]))
def test_critical_path_runs_from_the_step_start_to_its_end(pp: int, vpp: int, mult: int, seed: int,
                                                           variant: str) -> None:
    """Under the runtime walks a pass's start may be set by a peer posting its side of a call, not by an input's
    arrival: the walk records which action that was, so the critical path still runs from an action at t = 0 to the
    one that ends the step, each action ending no later than the next starts."""
    from projection.sim.p2p_walk import torch_1f1b_walk

    if variant == "torch1f1b" or (variant == "blocking" and pp == 2):
        vpp = 1
    rnd = random.Random(seed)
    m = pp * mult
    n = pp * vpp
    f = [rnd.uniform(0.1, 3.0) for _ in range(n)]
    costs = StageCosts.from_lists(f, [x * rnd.uniform(1.5, 2.5) for x in f], [0.0] * n,
                                  [rnd.uniform(0.0, 0.3) for _ in range(n - 1)])
    sched = one_f_one_b(pp, m) if variant == "torch1f1b" else interleaved_1f1b(pp, m, vpp)
    res = torch_1f1b_walk(sched, costs) if variant == "torch1f1b" else megatron_walk(
        sched, costs, overlap=variant == "overlap" and vpp > 1)
    cs, run = res.run.compiled, res.run
    pos = {(cs.rank_of[p], cs.acts[p]): p for p in range(cs.n)}
    path = [pos[(sched.stage_to_rank[a.stage], a)] for a in res.critical_path]
    assert run.start[path[0]] == 0.0
    assert run.end[path[-1]] == pytest.approx(res.step_time_s)
    assert all(run.end[a] <= run.start[b] + 1e-9 for a, b in zip(path, path[1:], strict=False))


def test_a_blocked_send_is_communication_on_the_sender() -> None:
    """pp 2 by hand (test_two_ranks_by_hand): rank 0's send_forward of F0 is in flight 1.0-1.1 and holds rank 0,
    so that 0.1 s is exposed pipeline communication on rank 0, not bubble."""
    sched = interleaved_1f1b(2, 2, 1)
    res = megatron_walk(sched, StageCosts.from_lists([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], 0.1))
    sends = [(r, str(a), s, e) for r, a, s, e in res.run.sends]
    assert (0, "0SEND_F0", 1.0, pytest.approx(1.1)) in sends
    assert res.exposed_comm_s[0] >= 0.1 - 1e-9
    assert res.busy_s[0] + res.exposed_comm_s[0] + res.bubble_s[0] == pytest.approx(res.step_time_s)


def test_a_layout_search_keeps_megatrons_runtime(tmp_path: Path) -> None:
    """`projection plan` builds a Megatron-LM file's layouts from the loaded plan: one searched from pp 1 to pp 2,
    or to a virtual pipeline, runs Megatron's runtime with the file's own p2p overlap, as the same layout loaded with
    its flags does."""
    from projection.perf.search import search_layouts

    path = tmp_path / "args.txt"
    path.write_text(ARGS.replace("--pipeline-model-parallel-size 4", "--pipeline-model-parallel-size 1") + "\n",
                    encoding="utf-8")
    found = {(c.pp, c.vpp): c for c in search_layouts(api.load(path, hardware="mi300x", nodes=1), pp=[1, 4],
                                                      vpp=[1, 2])}
    for (pp, vpp), flags in (((4, 1), " --pipeline-model-parallel-size 4"),
                             ((4, 2), " --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1")):
        cand = found[(pp, vpp)]
        assert cand.projection is not None, [p.render() for p in cand.problems]
        path.write_text(ARGS.replace("--pipeline-model-parallel-size 4", "") + flags + "\n", encoding="utf-8")
        direct = project(api.load(path, hardware="mi300x", nodes=1))
        assert cand.projection.engine == direct.engine
        assert cand.projection.step_time_s == pytest.approx(direct.step_time_s)
        assert direct.engine == "megatron"
