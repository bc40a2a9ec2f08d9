"""Performance projection core (projection/perf): pricing of stages, p2p and data-parallel communication, the
optimizer step, the breakdown, weak scaling, and invariants with hypothesis."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from projection import api
from projection.cost.collectives import GroupPlacement, group_placement
from projection.errors import ConfigError, PlanError
from projection.perf import (
    BREAKDOWN_KEYS,
    applicable_schedules,
    compare_schedules,
    default_cost_model,
    dp_comm_tasks,
    extrapolate,
    optimizer_step_seconds,
    price_stages,
    project,
)
from projection.perf.action_time import blocking, launch, pipelined_exposed_s, run, run_items, sync, wait
from projection.perf.placement import grid_placement
from projection.perf.pricing import SPLIT_BACKWARD, stage_components
from projection.perf.project import build_plan_schedule
from projection.perf.stage_params import stage_params
from projection.schedule.registry import SCHEDULE_NAMES, build_schedule
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec
from projection.workload.params import per_rank_params
from projection.workload.stages import split_stages

H100 = load_device("h100-sxm")
QUIET = H100.model_copy(update={"host_kernel_issue_s": None})  # no framework overhead: seconds add up exactly
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def scenario(*, layers: int = 8, hidden: int = 1024, tp: int = 1, pp: int = 1, vpp: int | None = None, cp: int = 1,
             sp: bool = False, nodes: int = 1, gpn: int = 8, mbs: int = 1, gbs: int = 64, seq: int = 1024,
             zero: int = 0, overlap: dict[str, bool] | None = None, recompute: str = "none", schedule: str = "1f1b",
             device: object = QUIET, moe: bool = False, runtime: str = "actions") -> Scenario:
    model = ModelSpec(num_layers=layers, hidden_size=hidden, num_attention_heads=16, num_kv_heads=8,
                      ffn_hidden_size=4 * hidden, vocab_size=32000, vocab_divisible_by=128, vocab_pad_with_tp=True,
                      moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": hidden} if moe else None)
    training = TrainingSpec(seq_length=seq, micro_batch_size=mbs, global_batch_size=gbs)
    rec = {"granularity": recompute, **({"method": "uniform", "num_layers": 1} if recompute == "full" else {})}
    dp = nodes * gpn // (tp * cp * pp)
    plan = ParallelPlan(tp=tp, sp=sp, pp=pp, vpp=vpp, cp=cp, dp=dp, sharding={"zero_stage": zero}, recompute=rec,
                        overlap=overlap or {}, schedule=schedule, ep=2 if moe else 1,
                        pipeline_runtime="megatron" if runtime == "megatron" else "actions",
                        schedule_style="torch" if runtime == "torch" else "megatron")
    cluster = ClusterSpec(device=device, nodes=nodes, gpus_per_node=gpn)
    return Scenario(model=model, training=training, plan=plan, cluster=cluster)


# ---- pricing

def test_uniform_dense_stage_f_is_the_sum_of_its_ops() -> None:
    sc = scenario(tp=2, pp=4, layers=8)  # TP without SP: forward all-reduces are waited for on the compute stream
    cm = default_cost_model(sc)
    priced = price_stages(sc, cm)
    for slot in split_stages(sc.model, sc.plan):
        ops = [o for _, comp in stage_components(sc, slot) for o in comp if o.phase == "F" and not o.recompute]
        assert priced.stages[slot.stage].f_s == pytest.approx(sum(cm.op_seconds(o) for o in ops), rel=1e-12)
    middle = priced.stages[1:-1]
    assert middle[0].f_s == middle[1].f_s and middle[0].b_s == middle[1].b_s
    assert all(s.b_s == pytest.approx(s.i_s + s.w_s) or s.b_s <= s.i_s + s.w_s for s in priced.stages)


def test_recompute_forward_is_added_to_the_backward() -> None:
    base, full = scenario(pp=2), scenario(pp=2, recompute="full")
    cm = default_cost_model(base)
    p0, p1 = price_stages(base, cm), price_stages(full, cm)
    for slot in split_stages(full.model, full.plan):
        rec = [o for _, comp in stage_components(full, slot) for o in comp if o.recompute]
        extra = sum(cm.op_seconds(o) for o in rec)
        assert p1.stages[slot.stage].i_s - p0.stages[slot.stage].i_s == pytest.approx(extra, rel=1e-9)
        assert p1.stages[slot.stage].f_s == p0.stages[slot.stage].f_s
        assert p1.stages[slot.stage].b.by_category["recompute"] == pytest.approx(extra, rel=1e-9)


def test_p2p_is_priced_on_the_tier_its_ranks_cross() -> None:
    inter = scenario(tp=8, pp=2, nodes=2, gbs=8)  # pp stride 8 GPUs = one node: stages on different nodes
    intra = scenario(tp=2, pp=2, nodes=1, gbs=8)
    for sc, place in ((inter, GroupPlacement(2, 1, 2)), (intra, GroupPlacement(2, 2, 1))):
        cm = default_cost_model(sc)
        priced = price_stages(sc, cm)
        assert priced.p2p_placements[0] == place
        nbytes = 1 * 1024 * sc.model.hidden_size * 2
        assert priced.p2p_bytes == nbytes
        assert priced.p2p_fwd_s[0] == cm.collective_seconds("send_recv", nbytes, place)
    assert price_stages(inter, default_cost_model(inter)).p2p_fwd_s[0] > \
        price_stages(intra, default_cost_model(intra)).p2p_fwd_s[0]


@pytest.mark.parametrize(("zero", "kind"), [(0, "all_reduce"), (1, "reduce_scatter")])
def test_dp_task_sizes_are_the_gradient_bytes_per_rank(zero: int, kind: str) -> None:
    sc = scenario(hidden=2048, layers=8, pp=2, vpp=2, schedule="interleaved_1f1b", zero=zero, gbs=32,
                  overlap={"grad_reduce": True})
    cm = default_cost_model(sc)
    sched = build_plan_schedule(sc)
    priced = price_stages(sc, cm)
    dp = dp_comm_tasks(sc, cm, sched, priced)
    for rp in per_rank_params(sc.model, sc.plan):
        mine = [b for b in dp.grad_buckets if b.pp_rank == rp.pp_rank]
        assert sum(b.size_bytes for b in mine) == rp.params * 4  # fp32 main gradients
        assert {b.kind for b in mine} == {kind}
    first = [b for b in dp.grad_buckets if b.pp_rank == 0 and b.stage == 0]
    assert len(first) == math.ceil(priced.stages[0].params.dense / 40_000_000)  # bucketed: rank 0, chunk 0
    assert all(len([b for b in dp.grad_buckets if b.stage == s]) == 1 for s in range(1, 4))  # one bucket per chunk
    assert (len(dp.param_buckets) > 0) == (zero == 1)


def test_interleaved_chunk_grad_syncs_start_when_their_backward_ends() -> None:
    """Megatron starts each model chunk's gradient sync when that chunk's last backward ends (the deepest chunk
    first); a chunk whose gradients are ready never waits behind one whose backward is still running."""
    sc = scenario(hidden=2048, layers=16, pp=2, vpp=4, schedule="interleaved_1f1b", zero=1, gbs=32, nodes=4,
                  overlap={"grad_reduce": True})
    cm = default_cost_model(sc)
    sched = build_plan_schedule(sc)
    dp = dp_comm_tasks(sc, cm, sched, price_stages(sc, cm))
    result = project(sc, cm, engine="dag")  # comm tasks do not queue behind p2p sends on a shared NIC here
    for r, acts in enumerate(sched.actions):
        mine = [t for t in dp.tasks if t.rank == r]
        assert len(mine) >= 2
        ends = {e.action: e.end_s for e in result.sim.timeline[r] if e.stream == "compute" and e.action is not None}
        assert [acts.index(t.after) for t in mine] == sorted(acts.index(t.after) for t in mine)
        assert mine[0].after.stage == max(t.after.stage for t in mine)  # the deepest chunk's backward ends first
        comm = sorted((e for e in result.sim.timeline[r] if e.stream not in ("compute", "p2p")),
                      key=lambda e: e.start_s)
        free = 0.0
        for task, event in zip(mine, comm, strict=True):  # each starts as soon as it is issued and the stream frees
            assert event.start_s == pytest.approx(max(ends[task.after], free), abs=1e-12)
            free = event.end_s


def test_dp_without_overlap_is_one_task_after_the_backward_and_fsdp_reduces_inside() -> None:
    sc = scenario(pp=2, zero=1, gbs=16)
    cm = default_cost_model(sc)
    sched = build_plan_schedule(sc)
    dp = dp_comm_tasks(sc, cm, sched, price_stages(sc, cm))
    for r, acts in enumerate(sched.actions):
        (task,) = [t for t in dp.tasks if t.rank == r]
        assert task.after == acts[-1] and task.duration_s == pytest.approx(dp.grad_s[r])
    fsdp = scenario(pp=1, zero=3, gbs=16)
    priced = price_stages(fsdp, cm)
    assert not dp_comm_tasks(fsdp, cm, build_plan_schedule(fsdp), priced).grad_buckets
    assert priced.stages[0].f.comm_s["dp"] > 0.0 and priced.stages[0].b.comm_s["dp"] > 0.0


def test_default_cost_model_sources() -> None:
    from projection.cost.calibrated import CalibratedCostModel
    from projection.cost.roofline import RooflineCostModel

    assert isinstance(default_cost_model(scenario()), CalibratedCostModel)  # calibrations/h100-sxm.json
    b200 = scenario(device=load_device("b200"))
    assert isinstance(default_cost_model(b200), RooflineCostModel)  # no shipped B200 calibration
    from projection.perf.costmodel import shipped_calibration

    path = shipped_calibration("mi300x")
    assert path is not None
    cm = default_cost_model(b200, calibration=path)
    assert isinstance(cm, CalibratedCostModel) and cm.name == "mi300x.json"


def test_stage_params_add_up_to_the_rank_params() -> None:
    sc = scenario(layers=8, pp=4, tp=2, moe=True, gbs=16)
    got: dict[int, int] = {}
    for slot in split_stages(sc.model, sc.plan):
        got[slot.pp_rank] = got.get(slot.pp_rank, 0) + stage_params(sc.model, sc.plan, slot).total
    assert got == {r.pp_rank: r.params for r in per_rank_params(sc.model, sc.plan)}


def test_split_backward_schedules_are_those_with_i_and_w_actions() -> None:
    for name in SCHEDULE_NAMES:
        vpp = 2 if name in ("zbv", "v_half", "v_min", "dualpipev", "interleaved_1f1b") else 1
        kinds = {a.kind for acts in build_schedule(name, 4, 8, vpp).actions for a in acts}
        assert (name in SPLIT_BACKWARD) == bool(kinds & {"I", "W"}), name


def test_placements_equal_the_generic_rank_walk() -> None:
    for sizes, gpn in [((2, 2, 1, 4, 2), 8), ((8, 1, 1, 2, 4), 8), ((1, 2, 2, 2, 2), 4), ((4, 1, 2, 1, 2), 2)]:
        cluster = ClusterSpec(device=QUIET, nodes=math.prod(sizes) // gpn, gpus_per_node=gpn)
        for axis in ("tp", "cp", "ep", "dp", "pp", "dp-cp", "tp-cp-dp-pp"):
            assert grid_placement(cluster, sizes, axis) == group_placement(cluster, *sizes, axis), (sizes, axis)


def test_tensor_and_expert_group_placement() -> None:
    """The allgather dispatcher's group: etp x ep innermost ranks of the expert grid; the fast placement equals the
    generic rank walk (projection.cost.model.group_placements)."""
    from projection.cost.model import group_placements
    from projection.perf.placement import op_placements

    for tp, ep, etp, nodes in [(2, 4, None, 2), (4, 4, 1, 2), (8, 8, None, 8), (1, 8, None, 1)]:
        plan = ParallelPlan(tp=tp, ep=ep, etp=etp, dp=nodes * 8 // tp, sp=tp > 1)
        cluster = ClusterSpec(device=QUIET, nodes=nodes, gpus_per_node=8)
        fast, generic = op_placements(cluster, plan)["etp_ep"], group_placements(cluster, plan)["etp_ep"]
        assert fast == generic and fast.n_ranks == plan.etp_ * ep, (tp, ep, etp)


def test_optimizer_shards_with_the_distributed_optimizer() -> None:
    plain, sharded = scenario(hidden=2048), scenario(hidden=2048, zero=1)
    cm = default_cost_model(plain)
    assert optimizer_step_seconds(sharded, cm)[0] < optimizer_step_seconds(plain, cm)[0]


def test_distributed_optimizer_loops_over_the_rank_shard_tensors() -> None:
    """With the distributed optimizer the count-zeros loop runs over the tensors of the rank's shard
    (projection.perf.optimizer.shard_tensors; one bucket per buffer without overlap_grad_reduce)."""
    from projection.perf.optimizer import COUNT_ZEROS_KERNELS, optimizer_items, shard_tensors

    def zeros_kernels(sc: Scenario) -> int:
        cm = default_cost_model(sc)
        flagged = sc.model_copy(update={"training": sc.training.model_copy(update={"log_num_zeros_in_grad": True})})
        return (sum(i.kernels for i in optimizer_items(flagged, cm, 0))
                - sum(i.kernels for i in optimizer_items(sc, cm, 0)))

    for nodes in (1, 2, 4):
        sc = scenario(hidden=512, nodes=nodes, zero=1, device=H100)
        tensors = sum(stage_params(sc.model, sc.plan, s).tensors for s in split_stages(sc.model, sc.plan))
        shard = round(shard_tensors(tensors, 1, sc.plan.dp_()))
        assert shard < tensors
        assert zeros_kernels(sc) == COUNT_ZEROS_KERNELS * shard + 1 + 1  # + all-reduce + D2H copy


def test_nan_checks_add_host_reads_to_the_loss_stage_and_per_gradient_bucket() -> None:
    """check_for_nan_in_loss_and_grad: the loss stage's forward gains isnan + isinf with a host read each (4 kernel
    issues); nothing else changes in the pipeline; the optimizer step gains per gradient bucket a norm and the two
    checks (5 issues): one bucket per buffer without overlap_grad_reduce, ceil(params / bucket size) with it."""
    from projection.perf.dp import bucket_elements
    from projection.perf.optimizer import optimizer_items

    for overlap in ({}, {"grad_reduce": True}):
        base = scenario(hidden=2048, pp=2, nodes=2, device=H100, overlap=overlap)  # first stage: 317 M parameters
        on = base.model_copy(update={"training": base.training.model_copy(
            update={"check_for_nan_in_loss_and_grad": True})})
        cm = default_cost_model(base)
        before, after = price_stages(base, cm), price_stages(on, cm)
        for s0, s1 in zip(before.stages, after.stages, strict=True):
            loss = s0.stage == len(before.stages) - 1
            assert s1.f.kernels - s0.f.kernels == (4 if loss else 0)
            assert (s1.f.seconds > s0.f.seconds) == loss
            assert s1.b == s0.b
        first = stage_params(base.model, base.plan, split_stages(base.model, base.plan)[0])
        n_buckets = math.ceil(first.dense / bucket_elements(base)) if overlap else 1
        assert n_buckets == (8 if overlap else 1)
        added = (sum(i.kernels for i in optimizer_items(on, cm, 0))
                 - sum(i.kernels for i in optimizer_items(base, cm, 0)))
        assert added == 5 * n_buckets


def test_logging_flags_add_their_kernels_collectives_and_host_syncs() -> None:
    """--log-num-zeros-in-grad: COUNT_ZEROS_KERNELS per gradient tensor, a scalar all-reduce and a host read;
    --log-params-norm: ceil(tensors / 110) multi-tensor norm launches, two scalar all-reduces and a host read."""
    from projection.perf.optimizer import COUNT_ZEROS_KERNELS, optimizer_items

    base = scenario(hidden=512, nodes=2, device=H100)
    cm = default_cost_model(base)
    tensors = sum(stage_params(base.model, base.plan, s).tensors for s in split_stages(base.model, base.plan))

    def with_flags(**flags: bool) -> Scenario:
        return base.model_copy(update={"training": base.training.model_copy(update=flags)})

    def kernels(sc: Scenario) -> int:
        return sum(i.kernels for i in optimizer_items(sc, cm, 0))

    zeros, norm = with_flags(log_num_zeros_in_grad=True), with_flags(log_params_norm=True)
    assert kernels(zeros) - kernels(base) == COUNT_ZEROS_KERNELS * tensors + 1 + 1  # + all-reduce + D2H copy
    assert kernels(norm) - kernels(base) == math.ceil(tensors / 110) + 2 + 1
    for sc in (zeros, norm):
        extra = [i for i in optimizer_items(sc, cm, 0)[len(optimizer_items(base, cm, 0)):] if i.mode == "sync"]
        assert len(extra) == 1
        assert optimizer_step_seconds(sc, cm)[0] > optimizer_step_seconds(base, cm)[0]
    # Megatron reads the gradient norm on the host; TorchTitan's clip_grad_norm_ does not
    assert [i.mode for i in optimizer_items(base, cm, 0)].count("sync") == 1
    titan = base.model_copy(update={"framework": "torchtitan"})
    assert [i.mode for i in optimizer_items(titan, cm, 0)].count("sync") == 0


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_w_actions_add_one_hook_kernel_per_hooked_tensor(zero: int) -> None:
    """Megatron DDP adds the gradient of every norm, bias and embedding table into the main buffer (one kernel per
    tensor per microbatch); FSDP (zero_stage 3) reduces per unit instead. The other W kernels are the W ops."""
    sc = scenario(hidden=512, layers=2, pp=2, zero=zero, gpn=4, nodes=1, gbs=16)
    priced = price_stages(sc, default_cost_model(sc))
    for slot, price in zip(split_stages(sc.model, sc.plan), priced.stages, strict=True):
        w_ops = sum(o.count for _, ops in stage_components(sc, slot) for o in ops if o.phase == "W")
        hooks = sum(k for _, k, _ in stage_params(sc.model, sc.plan, slot).hooked)
        expected = w_ops + (hooks if zero < 3 else 0)
        fsdp_launches = len(stage_components(sc, slot)) if zero == 3 else 0  # a reduce-scatter per unit
        assert price.w.kernels == expected + fsdp_launches, (slot.stage, zero)


def test_notes_say_what_is_projected_as_something_else() -> None:
    moe = scenario(hidden=256, layers=2, moe=True, gbs=16)
    dense = scenario(hidden=256, layers=2, gbs=16)
    assert project(dense).notes == ()
    (optimistic,) = project(moe).notes  # native: the all-to-all dispatcher, no framework flag; every MoE job says
    assert optimistic.startswith("MoE: projections of published MoE runs have all been fast")
    kernels = moe.training.kernels.model_copy(update={"moe_token_dispatcher": "flex"})
    other = moe.model_copy(update={"training": moe.training.model_copy(update={"kernels": kernels}),
                                   "framework": "megatron"})
    notes = project(other).notes
    assert notes == (optimistic, "MoE token dispatcher 'flex' (DeepEP / HybridEP kernels) priced as the NCCL "
                     "all-to-all dispatcher: the same bytes, not the same kernels")


def test_moe_forward_reads_its_token_counts_on_the_host_once_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron's all-to-all and allgather dispatchers and TorchTitan's expert-parallel dispatch read the token
    counts on the host in every MoE forward (a synchronisation: one host-read item more per layer, in a recomputed
    forward too), and so does Megatron's flex dispatcher (DeepEP's normal dispatch waits on the host for the
    received counts); Primus-Turbo's DeepEP, TorchTitan without EP and drop-and-pad (all-to-all, HybridEP) do not
    (perf/checks.token_count_syncs)."""
    from projection.perf import checks, pricing

    base = scenario(hidden=256, layers=2, moe=True, gbs=16, recompute="full")

    def variant(framework: str, dispatcher: str = "alltoall", ep: int = 2) -> Scenario:
        kernels = base.training.kernels.model_copy(update={"moe_token_dispatcher": dispatcher})
        return base.model_copy(update={"framework": framework, "plan": base.plan.model_copy(update={"ep": ep}),
                                       "training": base.training.model_copy(update={"kernels": kernels})})

    syncing = [variant("megatron"), variant("megatron", "allgather"), variant("torchtitan"),
               variant("megatron", "flex"), variant("megatron-bridge", "flex")]
    assert all(checks.token_count_syncs(sc) == {"moe.router.topk"} for sc in syncing)
    turbo = variant("primus-megatron", "flex")
    kernels = turbo.training.kernels.model_copy(update={"moe_flex_backend": "turbo_deepep"})
    turbo = turbo.model_copy(update={"training": turbo.training.model_copy(update={"kernels": kernels})})
    assert checks.token_count_syncs(turbo) == frozenset()
    assert checks.token_count_syncs(variant("primus-megatron", "flex")) == {"moe.router.topk"}  # Megatron's DeepEP
    assert checks.token_count_syncs(variant("torchtitan", ep=1)) == frozenset()
    padded = base.model.moe.model_copy(update={"capacity_factor": 1.0, "pad_to_capacity": True})  # type: ignore[union-attr]
    drop_and_pad = variant("megatron").model_copy(update={"model": base.model.model_copy(update={"moe": padded})})
    assert checks.token_count_syncs(drop_and_pad) == frozenset()  # the counts are the capacity, known on the host
    hybrid = variant("megatron", "flex")
    kernels = hybrid.training.kernels.model_copy(update={"moe_flex_backend": "hybridep"})
    hybrid = hybrid.model_copy(update={"model": drop_and_pad.model, "training": hybrid.training.model_copy(
        update={"kernels": kernels})})
    assert checks.token_count_syncs(hybrid) == frozenset()  # HybridEP sized by the capacity

    def counts(sc: Scenario) -> tuple[int, int]:
        stage = price_stages(sc, default_cost_model(sc)).stages[0]
        return stage.f.kernels, stage.b.kernels

    with_reads = counts(syncing[0])
    monkeypatch.setattr(pricing, "token_count_syncs", lambda sc: frozenset())
    without = counts(syncing[0])
    layers = base.model.num_layers
    assert (with_reads[0] - without[0], with_reads[1] - without[1]) == (layers, layers)


# ---- the action model

def test_a_host_sync_drains_the_gpu_before_the_next_issue() -> None:
    """GPU-bound: the host runs ahead of a 1 s kernel, so the next kernel costs no issue time; after a sync the
    host issues it only once the GPU is idle: one host issue time more. Host-bound work pays nothing extra."""
    ahead = run_items([run("gemm", 1.0), run("gemm", 1e-3)], host_s=0.01)
    synced = run_items([run("gemm", 1.0), sync(), run("gemm", 1e-3)], host_s=0.01)
    assert ahead.seconds == pytest.approx(0.01 + 1.0 + 1e-3)
    assert synced.seconds == pytest.approx(0.01 + 1.0 + 0.01 + 1e-3)
    assert synced.by_category["overhead"] == pytest.approx(0.02)
    tiny = [run("memory_bound", 1e-6)] * 10
    assert run_items([*tiny, sync(), *tiny], host_s=1e-3).seconds == pytest.approx(21e-3 + 1e-6)
    # a value read synchronises the compute stream only: a 2 s collective on its own stream runs on beside it
    t = run_items([launch("dp", 2.0, 1), run("gemm", 1.0), sync(), run("gemm", 1.0)])
    assert t.seconds == 2.0 and t.by_category.get("dp", 0.0) == 0.0


def test_launch_bound_action_costs_the_host_issue_time() -> None:
    tiny = run_items([run("memory_bound", 1e-6)] * 100, host_s=10e-6)
    assert tiny.seconds == pytest.approx(100 * 10e-6 + 1e-6)
    assert tiny.by_category["overhead"] == pytest.approx(100 * 10e-6 - 99 * 1e-6)
    big = run_items([run("gemm", 1e-3)] * 10, host_s=10e-6)  # the host runs ahead of long kernels
    assert big.seconds == pytest.approx(10e-6 + 10e-3)


def test_overlap_in_an_action() -> None:
    t = run_items([launch("tp", 2.0, 1), run("gemm", 3.0), wait(1), blocking("tp", 1.0), run("gemm", 1.0)])
    assert t.seconds == 5.0 and t.by_category == {"gemm": 4.0, "tp": 1.0} and t.comm_s == {"tp": 3.0}
    t = run_items([launch("ep", 5.0, 1), run("gemm", 3.0)])
    assert t.seconds == 5.0 and t.by_category["ep"] == 2.0
    assert pipelined_exposed_s(4.0, 8.0, 4) == 1.0 and pipelined_exposed_s(8.0, 4.0, 4) == 2.0 + 3.0


def test_tp_comm_overlap_hides_tp_time() -> None:
    off = project(scenario(tp=8, sp=True, gbs=8))
    on = project(scenario(tp=8, sp=True, gbs=8, overlap={"tp_comm": True}))
    assert on.breakdown_s["comm.tp"] < off.breakdown_s["comm.tp"]
    assert on.comm_total_s["tp"] == pytest.approx(off.comm_total_s["tp"])
    assert on.step_time_s < off.step_time_s


# ---- projection

def test_projection_numbers_and_breakdown() -> None:
    sc = scenario(tp=2, pp=2, gbs=32, zero=1, overlap={"grad_reduce": True, "param_gather": True},
                  device=H100)
    p = project(sc)
    assert set(p.breakdown_s) == set(BREAKDOWN_KEYS)
    assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-9)
    assert p.tokens_per_s_per_gpu == pytest.approx(32 * 1024 / p.step_time_s / 8)
    assert p.mfu == pytest.approx(p.model_flops_per_step / (p.step_time_s * 8 * 989.4e12))
    assert p.hfu == p.mfu  # no recompute
    assert p.breakdown_s["overhead"] > 0.0 and p.memory is not None and p.memory.verdict == "fits"
    d = json.loads(json.dumps(p.to_dict()))
    for key in ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu", "world_size", "breakdown_s"):
        assert key in d
    assert "step time" in p.to_table()
    full = project(scenario(tp=2, pp=2, gbs=32, recompute="full"))
    assert full.hfu > full.mfu and full.breakdown_s["recompute"] > 0.0


def test_engines_agree_without_shared_links() -> None:
    sc = scenario(pp=4, gbs=16, zero=1, overlap={"grad_reduce": True})
    a, b = project(sc, engine="dag"), project(sc, engine="des")
    # one node, no link two transfers share: the event loop replays the exact walk (tests/unit/test_sim_engines.py)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)


def test_compare_schedules_covers_the_applicable_ones() -> None:
    sc = scenario(pp=4, gbs=16, layers=8)  # dp 2: 8 microbatches (DualPipe needs at least 2 pp)
    got = compare_schedules(sc)
    names = {p.schedule for p in got}
    assert {"1f1b", "gpipe", "zb_h1", "zb_h2", "dualpipe"} <= names and "zbv" not in names
    assert [p.step_time_s for p in got] == sorted(p.step_time_s for p in got)
    v = {p.schedule for p in compare_schedules(scenario(pp=2, vpp=2, schedule="interleaved_1f1b", gbs=16))}
    assert {"interleaved_1f1b", "zbv", "v_half", "v_min", "dualpipev"} <= v and "1f1b" not in v


def test_extrapolate_is_weak_scaling_at_fixed_global_batch() -> None:
    sc = scenario(tp=2, pp=2, gbs=32, nodes=1)
    big = extrapolate(sc, 4)
    assert big.plan.dp == 8 and big.world_size == 32 and big.training.global_batch_size == 32
    assert big.training.num_microbatches(8) == 4 and sc.training.num_microbatches(2) == 16
    with pytest.raises(PlanError):
        extrapolate(sc, 64)  # dp 128 does not divide a global batch of 32
    far = project(extrapolate(scenario(tp=8, gbs=64), 8))
    assert far.dp.crosses_nodes


# ---- invariants (hypothesis)

grids = {"tp": st.sampled_from([1, 2, 4]), "pp": st.sampled_from([1, 2]), "zero": st.sampled_from([0, 1, 3]),
         "overlap": st.booleans(), "recompute": st.sampled_from(["none", "full"]), "mbs": st.sampled_from([1, 2]),
         "sp": st.booleans(), "schedule": st.sampled_from(["1f1b", "zb_h1", "gpipe"]),
         # the pipeline's runtime: the dependency walk, Megatron's blocking calls, torch's (Schedule1F1B for 1f1b)
         "runtime": st.sampled_from(["actions", "megatron", "torch"])}


def _random(tp: int, pp: int, zero: int, overlap: bool, recompute: str, mbs: int, sp: bool, schedule: str,
            runtime: str, nodes: int = 1) -> Scenario:
    if runtime == "megatron":  # Megatron-LM's schedules.py runs 1F1B (and interleaved 1F1B) only
        schedule = "1f1b"
    return scenario(tp=tp, pp=pp, zero=zero, recompute=recompute, mbs=mbs, gbs=64 * mbs, nodes=nodes, sp=sp,
                    runtime=runtime,
                    schedule=schedule, overlap={"grad_reduce": overlap, "param_gather": overlap and zero >= 1,
                                                "tp_comm": overlap and (sp or tp == 1)},
                    hidden=512, layers=4, device=H100)


@SETTINGS
@given(**grids)
def test_tokens_per_gpu_do_not_grow_with_dp(tp: int, pp: int, zero: int, overlap: bool, recompute: str, mbs: int,
                                            sp: bool, schedule: str, runtime: str) -> None:
    sc = _random(tp, pp, zero, overlap, recompute, mbs, sp, schedule, runtime)
    rates = [project(extrapolate(sc, n), engine="dag").tokens_per_s_per_gpu for n in (1, 2, 4)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(rates, rates[1:], strict=False)), rates


@SETTINGS
@given(**grids, nodes=st.sampled_from([1, 2]))
def test_exposed_communication_is_bounded_and_step_covers_compute(tp: int, pp: int, zero: int, overlap: bool,
                                                                 recompute: str, mbs: int, sp: bool, schedule: str,
                                                                 runtime: str, nodes: int) -> None:
    p = project(_random(tp, pp, zero, overlap, recompute, mbs, sp, schedule, runtime, nodes))
    if pp > 1 and schedule == "1f1b" and runtime != "actions":
        assert p.engine == ("megatron" if runtime == "megatron" else "torch1f1b")
    for g in ("tp", "cp", "ep", "pp", "dp"):
        exposed = p.breakdown_s[f"comm.{g}"]
        assert 0.0 <= exposed <= p.comm_total_s[g] * (1 + 1e-9) + 1e-12, (g, exposed, p.comm_total_s[g])
    assert all(v >= 0.0 for v in p.breakdown_s.values())
    assert p.step_time_s >= max(p.sim.busy_s) * (1 - 1e-12)
    assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-9)


@pytest.mark.parametrize("vpp", [1, 2, 3])
def test_a_schedule_the_config_accepts_is_one_perf_accepts(vpp: int, tmp_path: Path) -> None:
    """--set plan.schedule=X and --schedule X accept the same plans: the validator applies build_schedule's
    stage-count rule (gpipe with vpp > 1 is looped breadth-first; 1f1b and zero-bubble H1/H2 run one stage per
    rank; V schedules two)."""
    layers = 12
    for name in SCHEDULE_NAMES:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"model: {{num_layers: {layers}, hidden_size: 256, num_attention_heads: 4, "
                        "ffn_hidden_size: 1024, vocab_size: 512}\n"
                        "training: {seq_length: 128, micro_batch_size: 1, global_batch_size: 32}\n"
                        f"plan: {{pp: 2, vpp: {vpp}, schedule: {name}}}\n"
                        "cluster: {hardware: h100-sxm, nodes: 1, gpus_per_node: 2}\n")
        try:
            sc = api.load(path)
        except (ConfigError, PlanError):
            sc = None
        try:
            build_schedule(name, 2, 32, vpp)
            builds = True
        except ValueError:
            builds = False
        assert (sc is not None) == builds, (name, vpp)
        if sc is not None:
            assert name in applicable_schedules(sc) or name == "interleaved_1f1b" and vpp == 1


@pytest.mark.parametrize(("device", "params_dtype", "peak"), [("h100-sxm", "fp32", "tf32"), ("mi300x", "fp32", "fp32"),
                                                              ("h100-sxm", "bf16", "bf16")])
def test_mfu_is_quoted_against_the_peak_the_gemms_are_priced_at(device: str, params_dtype: str, peak: str) -> None:
    """MFU's peak is the one the cost model prices the job's GEMMs at (fp32 on TF32 tensor cores where the part has
    them), so an fp32 job never reads as more than 100 % of a peak it was priced above."""
    dev = load_device(device).model_copy(update={"host_kernel_issue_s": None})
    sc = scenario(device=dev, hidden=2048, layers=4)
    sc = sc.model_copy(update={"training": sc.training.model_copy(update={"params_dtype": params_dtype})})
    p = project(sc)
    from projection.cost.roofline import RooflineCostModel

    assert p.to_dict()["peak_dtype"] == peak == RooflineCostModel(dev).peak_dtype(params_dtype)
    assert 0.0 < p.mfu < 1.0


def test_muon_says_its_orthogonalisation_is_not_priced() -> None:
    """Muon's Newton-Schulz matmuls are not in the optimizer step: the projection says so rather than passing Muon
    off as SGD silently."""
    base = scenario()
    muon = base.model_copy(update={"training": base.training.model_copy(
        update={"optimizer": base.training.optimizer.model_copy(update={"name": "muon"})})})
    assert not [n for n in project(base).notes if "Newton-Schulz" in n]
    assert [n for n in project(muon).notes if "Newton-Schulz" in n]


@pytest.mark.parametrize(("pp", "tp"), [(1, 1), (2, 2), (4, 1)])
def test_hardware_flops_with_full_recompute_are_narayanans_f96(pp: int, tp: int) -> None:
    """A GPT (MHA, 4h GELU MLP, untied logits) with full recompute of every layer: Megatron's model FLOPs are
    F72 = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) and the hardware FLOPs, one more forward of every layer, Narayanan et
    al. 2021 Eq. 3, F96 = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (attention over the full s x s in both), whatever the
    pipeline and tensor split."""
    b, s, l, h, v = 32, 1024, 8, 1024, 32768  # noqa: E741
    model = ModelSpec(num_layers=l, hidden_size=h, num_attention_heads=16, ffn_hidden_size=4 * h, gated_mlp=False,
                      activation="gelu", vocab_size=v, vocab_divisible_by=128)
    sc = scenario(pp=pp, tp=tp, recompute="full", gbs=b, seq=s)
    sc = sc.model_copy(update={"model": model})
    p = project(sc)
    f72 = 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    f96 = 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    assert p.model_flops_per_step == pytest.approx(f72, rel=1e-9)
    assert p.hardware_flops_per_step == pytest.approx(f96, rel=1e-9)


@pytest.mark.parametrize(("pp", "tp", "vpp", "cp", "gpn"), [(1, 1, None, 1, 8), (2, 2, None, 1, 8),
                                                            (2, 1, 2, 1, 8), (1, 2, None, 2, 8), (2, 2, 2, 2, 16)])
def test_hardware_flops_with_selective_recompute_add_one_attention_core_forward(
        pp: int, tp: int, vpp: int | None, cp: int, gpn: int) -> None:
    """Selective recompute of the attention core (Korthikanti et al. 2022 §5): the hardware FLOPs are the model
    FLOPs plus one more forward of QK^T and of the probabilities times V in every layer, 2 x 2 B s^2 h (over the full
    s x s, the convention of the model FLOPs), and nothing else is recomputed: a first-principles count of the two
    recomputed GEMMs, not a formula taken from the paper; under interleaving, context parallelism and data
    parallelism alike (each splits the same work). HFU and hardware TFLOP/s/GPU are those FLOPs over the step, the
    GPUs and the device's dense peak."""
    b, s, l, h, v = 32, 1024, 8, 1024, 32768  # noqa: E741
    model = ModelSpec(num_layers=l, hidden_size=h, num_attention_heads=16, ffn_hidden_size=4 * h, gated_mlp=False,
                      activation="gelu", vocab_size=v, vocab_divisible_by=128)
    from projection.specs.plan import RecomputeSpec

    sc = scenario(pp=pp, tp=tp, vpp=vpp, cp=cp, gpn=gpn, gbs=b, seq=s,
                  schedule="interleaved_1f1b" if vpp else "1f1b")
    plan = sc.plan.model_copy(update={"recompute": RecomputeSpec(granularity="selective", modules=["core_attn"])})
    p = project(sc.model_copy(update={"model": model, "plan": plan}))
    f72 = 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    hardware = f72 + 4.0 * b * s * s * h * l
    assert p.model_flops_per_step == pytest.approx(f72, rel=1e-9)
    assert p.hardware_flops_per_step == pytest.approx(hardware, rel=1e-9)
    peak = QUIET.peak_flop_per_s["bf16"]
    assert p.world_size == gpn and p.peak_flop_per_s == peak
    assert p.hardware_tflops_per_gpu == pytest.approx(hardware / p.step_time_s / gpn / 1e12, rel=1e-9)
    assert p.hfu == pytest.approx(hardware / (p.step_time_s * gpn * peak), rel=1e-9)


def test_fp8_mfu_is_quoted_against_the_fp8_peak() -> None:
    """An FP8 job's GEMMs run on the fp8 tensor cores: MFU is quoted against the device YAML's fp8 dense peak."""
    from projection.specs.training import Fp8Spec

    base = scenario(device=load_device("h100-sxm"), hidden=2048, layers=4)
    f8 = base.model_copy(update={"training": base.training.model_copy(update={"fp8": Fp8Spec()})})
    p = project(f8)
    peak = load_device("h100-sxm").peak_flop_per_s["fp8"]
    assert p.peak_dtype == "fp8" and p.peak_flop_per_s == peak
    assert p.mfu == pytest.approx(p.model_flops_per_step / (p.step_time_s * f8.world_size * peak), rel=1e-12)


def test_unoverlapped_gradient_reduction_is_exposed_whole() -> None:
    """pp 1, plain DDP without overlap: the gradient all-reduce runs after the backward with nothing to hide behind,
    so the breakdown's exposed DP time is the whole reduction."""
    p = project(scenario(nodes=2, zero=0, overlap={"grad_reduce": False}))
    assert p.comm_total_s["dp"] > 0
    assert p.breakdown_s["comm.dp"] == pytest.approx(p.comm_total_s["dp"], rel=1e-9)


def test_one_microbatch_pipeline_exposes_both_boundary_transfers() -> None:
    """pp 2 with one microbatch: stage 0's activations go to stage 1, its gradient comes back, and neither transfer
    can overlap compute. Each is booked on its receiver's timeline, so every rank's exposed p2p is one transfer, and
    the step holds both on its critical path."""
    from projection.perf.pricing import price_stages

    sc = scenario(pp=2, gbs=4, nodes=1)  # dp 4, mbs 1: one microbatch
    assert sc.training.num_microbatches(sc.plan.dp_()) == 1
    p = project(sc)
    priced = price_stages(sc, default_cost_model(sc))
    one_way = priced.p2p_fwd_s[0]
    assert one_way > 0
    assert p.breakdown_s["comm.pp"] == pytest.approx(one_way, rel=1e-6)
    last_compute = max(e.end_s for tl in p.sim.timeline for e in tl if e.stream == "compute")
    assert last_compute == pytest.approx(sum(s.f_s + s.b_s for s in priced.stages) + 2 * one_way, rel=1e-9)


@pytest.mark.parametrize(("vpp", "aligned"), [(None, False), (2, True)])
def test_parameter_gather_starts_at_the_first_forward_or_aligned_at_the_step_start(vpp: int | None,
                                                                                   aligned: bool) -> None:
    """Megatron's overlapped parameter gather on pipeline rank 1 (unbucketed there: one bucket per model chunk).
    1F1B launches it at the rank's first forward (forward pre-hook), which needs it at once: exposed whole. The
    interleaved schedule launches every stage's gathers at the step's start (align_param_gather, the default), so
    rank 1 hides the time it waits for the pipeline to fill."""
    sc = scenario(pp=2, nodes=2, zero=1, vpp=vpp, layers=8, overlap={"param_gather": True, "grad_reduce": True},
                  schedule="interleaved_1f1b" if vpp else "1f1b")
    p = project(sc)
    starts: dict[int, float] = {}  # each model chunk's first forward on rank 1
    for e in p.sim.timeline[1]:
        if e.stream == "compute" and e.action is not None and e.action.kind == "F":
            starts.setdefault(e.action.stage, e.start_s)
    buckets = sorted((b for b in p.dp.param_buckets if b.pp_rank == 1), key=lambda b: starts[b.stage])
    assert len(buckets) == len(starts) == (vpp or 1) and min(starts.values()) > 0
    if aligned:  # back to back from 0; chunk k's bucket needed by chunk k's first forward
        end = worst = 0.0
        for b in buckets:
            end += b.seconds
            worst = max(worst, end - starts[b.stage])
        assert p.param_gather_exposed_s[1] == pytest.approx(max(0.0, worst), rel=1e-9, abs=1e-15)
        assert p.param_gather_exposed_s[1] < buckets[0].seconds
    else:
        assert p.param_gather_exposed_s[1] == pytest.approx(buckets[0].seconds, rel=1e-9)


def test_a_calibration_without_the_shipped_tables_says_what_falls_back(tmp_path: Path) -> None:
    """A host-only --calibration replaces the shipped one: its GEMMs, attention, memory-bound ops and collectives go
    to the roofline. The projection says so, and how to keep both."""
    from projection import api
    from projection.calibrate.calibration import Calibration, HostRow, Provenance
    from projection.perf import default_cost_model, project

    sc = api.load(Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml")
    path = tmp_path / "host.json"
    Calibration(provenance=(Provenance(device_name="AMD Instinct MI300X"),),
                host=(HostRow(host_s=2e-5, kernels=100),)).save(path)
    notes = project(sc, default_cost_model(sc, calibration=path)).notes
    (note,) = [n for n in notes if "has no" in n]
    assert "has no gemm, attention, memory_bound, collective rows" in note and "calibrations/mi300x.json" in note
    assert f"projection calibrate import {Path(__file__).resolve().parents[2] / 'calibrations' / 'mi300x.json'} " \
        f"{path} --out CAL.json" in note
    assert not [n for n in project(sc).notes if "has no" in n]  # the shipped one itself
    (tmp_path / "mine").mkdir()
    same_name = tmp_path / "mine" / "mi300x.json"  # a user's file named like the shipped one is still the user's
    same_name.write_text(path.read_text())
    assert [n for n in project(sc, default_cost_model(sc, calibration=same_name)).notes if "has no" in n]
