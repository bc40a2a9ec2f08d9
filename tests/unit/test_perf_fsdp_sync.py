"""When FSDP2 gathers and reduces, and on which streams (projection/perf/items.py, dp.py, workload/shapes.py).

Facts from PyTorch's source, each checked here against the projection:
- torch.distributed.pipelining `_PipelineStageBase.backward_maybe_with_nosync` turns gradient sync and
  reshard-after-backward off on an FSDP2 stage module for every backward but the last, then runs every unit's
  post-backward (reduce-scatter) once. With `reshard_after_forward=False` (TorchTitan's default under PP) the units
  stay unsharded after the first forward: one all-gather per unit per step.
- Without pipelining, TorchTitan's gradient accumulation keeps gradient sync on: every microbatch reduce-scatters,
  and gathers again in forward (and in backward when resharded after forward; never the [norm, output] unit).
- FSDP2 issues a group's all-gathers and reduce-scatters on one process group, whose NCCL communicator runs them in
  order; HSDP's replica all-reduce runs on another group, on its own stream, after the unit's reduce-scatter.
"""

from __future__ import annotations

import pytest

from projection.perf import project
from projection.perf.action_time import launch, run, run_items, wait
from projection.perf.costmodel import default_cost_model
from projection.perf.fsdp_sizes import FsdpSizes
from projection.perf.items import Entry, ItemBuilder, Unit
from projection.perf.stage_params import stage_params
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec
from projection.workload.ops_base import Op
from projection.workload.shapes import step_shapes
from projection.workload.stages import split_stages

MODEL = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000)
MICRO = 4


def scenario(pp: int, reshard: bool, replicate: int = 1) -> Scenario:
    dp = 8 * replicate // pp
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=MICRO * dp)
    plan = ParallelPlan(pp=pp, dp=dp, schedule_style="torch", sharding={
        "zero_stage": 3, "fsdp": "torch_fsdp2", "reshard_after_forward": reshard, "dp_replicate": replicate})
    return Scenario(model=MODEL, training=training, plan=plan, framework="torchtitan",
                    cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=replicate, gpus_per_node=8))


def unit_seconds(sc: Scenario, pp_rank: int) -> tuple[list[str], list[float], list[float], list[float]]:
    """Per FSDP unit of the pp rank's stage: names, all-gather, reduce-scatter and replica all-reduce seconds."""
    (slot,) = [s for s in split_stages(sc.model, sc.plan) if s.pp_rank == pp_rank]
    params = stage_params(sc.model, sc.plan, slot)
    names = [n for n, _, _ in params.components]
    ag, rs, ar = FsdpSizes(sc, default_cost_model(sc)).unit_seconds(params, names)
    return names, [sum(g) for g in ag], [sum(r) for r in rs], ar


def test_pipelined_fsdp_gathers_and_reduces_once_per_step() -> None:
    sc = scenario(pp=2, reshard=False)
    assert sc.plan.pipelined_fsdp and sc.training.num_microbatches(sc.plan.dp_()) == MICRO
    proj = project(sc)
    _, ag, rs, _ = unit_seconds(sc, proj.breakdown_rank)
    assert proj.comm_total_s["dp"] == pytest.approx(sum(ag) + sum(rs), rel=1e-9)
    for row in step_shapes(sc):
        if row.collective in ("all_gather", "reduce_scatter"):
            assert row.count_per_step == 1, row


def test_the_compute_stream_waits_for_a_stages_final_reduction() -> None:
    """FSDP2's root post-backward callback of a stage's last backward makes the compute stream wait on the
    reduce-scatter (FSDPParamGroup.finalize_backward): with two chunks per rank (Interleaved1F1B), the shallower
    chunk's remaining backwards start only after the deeper chunk's reduction ends."""
    base = scenario(pp=2, reshard=False)
    sc = base.model_copy(update={"plan": base.plan.model_copy(update={"schedule": "interleaved_1f1b", "vpp": 2})})
    assert sc.plan.pipelined_fsdp
    proj = project(sc)
    tasks = [t for t in proj.dp.tasks if t.label.startswith("fsdp grad")]
    assert len(tasks) == 4 and all(t.blocks_compute for t in tasks)
    held = 0
    for t in tasks:
        line = proj.sim.timeline[t.rank]
        (comm,) = [e for e in line if e.stream == "comm" and e.label == t.label]
        order = [e for e in line if e.stream == "compute"]
        k = next(i for i, e in enumerate(order) if e.action == t.after)
        assert all(e.start_s >= comm.end_s for e in order[k + 1:]), t
        held += len(order) > k + 1 and order[k + 1].start_s == comm.end_s
    assert held >= 1  # a deeper chunk's reduction sets when the other chunk's next backward starts


def test_unpipelined_fsdp_syncs_every_microbatch() -> None:
    sc = scenario(pp=1, reshard=True)
    assert not sc.plan.pipelined_fsdp
    proj = project(sc)
    names, ag, rs, _ = unit_seconds(sc, 0)
    backward_gathers = sum(g for n, g in zip(names, ag, strict=True) if n != "output")
    assert proj.comm_total_s["dp"] == pytest.approx(MICRO * (sum(ag) + backward_gathers + sum(rs)), rel=1e-9)
    rs_rows = [r for r in step_shapes(sc) if r.collective == "reduce_scatter"]
    assert [r.count_per_step for r in rs_rows] == [MICRO]


def test_pipelining_is_faster_than_syncing_every_microbatch() -> None:
    """The same pipelined job with a per-microbatch sync would move MICRO times the FSDP traffic."""
    once = project(scenario(pp=2, reshard=False))
    _, ag, rs, _ = unit_seconds(scenario(pp=2, reshard=False), once.breakdown_rank)
    assert once.comm_total_s["dp"] < MICRO * (sum(ag) + sum(rs)) / 2


def test_hsdp_all_reduce_follows_each_units_reduce_scatter() -> None:
    sc = scenario(pp=1, reshard=True, replicate=2)
    names, _, rs, ar = unit_seconds(sc, 0)
    assert all(a > 0 for a in ar)
    proj = project(sc)
    _, ag, _, _ = unit_seconds(sc, 0)
    backward_gathers = sum(g for n, g in zip(names, ag, strict=True) if n != "output")
    assert proj.comm_total_s["dp"] == pytest.approx(MICRO * (sum(ag) + backward_gathers + sum(rs) + sum(ar)),
                                                    rel=1e-9)
    rows = {(r.collective, r.group): r for r in step_shapes(sc) if r.collective}
    replica, scatter = rows[("all_reduce", "dp_replicate")], rows[("reduce_scatter", "dp")]
    shard = sc.plan.dp_() // sc.plan.sharding.dp_replicate
    assert replica.count_per_step == scatter.count_per_step == MICRO
    assert replica.size_bytes == pytest.approx(scatter.size_bytes / shard, rel=1e-6)


def _unit(compute_s: float, gather: float, scatter: float, replicate: float = 0.0) -> Unit:
    op = Op("layer.gemm", "gemm", "I", flop=1.0)
    return Unit((Entry(op),), gather_s=(gather,), scatter_s=(scatter,), replicate_s=replicate)


def _builder(compute_s: float) -> ItemBuilder:
    return ItemBuilder(ParallelPlan(), lambda op: compute_s, lambda op: 0.0)


def test_a_groups_gathers_and_reduce_scatters_queue_on_one_stream() -> None:
    """Three backward units with 0.1 s of compute, 1 s gathers and 1 s reduce-scatters: on one communicator the six
    collectives run one after another (at least 6 s); on two streams they would overlap (about 3 s)."""
    items = _builder(0.1).items([_unit(0.1, 1.0, 1.0) for _ in range(3)], backward=True)
    t = run_items(items).seconds
    assert t >= 6.0 - 1e-9


def test_a_launch_waits_for_the_launches_it_follows() -> None:
    after = run_items([launch("dp", 1.0, 1, stream="a"), launch("dp", 1.0, 2, stream="b", after=(1,)), wait(2)])
    alone = run_items([launch("dp", 1.0, 1, stream="a"), launch("dp", 1.0, 2, stream="b"), wait(2)])
    assert after.seconds == pytest.approx(2.0) and alone.seconds == pytest.approx(1.0)


def test_hsdp_replica_all_reduce_overlaps_the_next_units_work() -> None:
    """Unit k's replica all-reduce waits for its reduce-scatter but not for unit k+1's collectives: two units with
    1 s reduce-scatters and 1 s all-reduces and no gathers end at 3 s (RS0, then RS1 beside AR0, then AR1)."""
    items = _builder(0.0).items([_unit(0.0, 0.0, 1.0, 1.0) for _ in range(2)], backward=True)
    assert run_items([run("gemm", 0.0), *items]).seconds == pytest.approx(3.0)



def test_pipelined_fsdp_with_reshard_gathers_once_per_backward() -> None:
    """Under pipelining reshard-after-backward is off: with reshard after forward (the "always" policy, which
    TorchTitan passes to the [norm, output] unit too), each backward re-gathers its unit and the next forward finds
    it unsharded (the warm-up forwards' gathers are not priced): one gather per microbatch, one reduction."""
    sc = scenario(pp=2, reshard=True)
    proj = project(sc)
    _, ag, rs, _ = unit_seconds(sc, proj.breakdown_rank)
    assert proj.comm_total_s["dp"] == pytest.approx(MICRO * sum(ag) + sum(rs), rel=1e-9)
    rows = [(r.collective, r.count_per_step) for r in step_shapes(sc)
            if r.rank_type == "pp1" and r.collective in ("all_gather", "reduce_scatter")]
    assert sorted(rows) == [("all_gather", MICRO), ("reduce_scatter", 1)]


def test_hsdp_shards_experts_inside_the_replica_and_all_reduces_them_across() -> None:
    """TorchTitan's HSDP shards the experts over (dp_replicate, dp_shard_mod_ep) like the dense parameters: the
    expert reduce-scatter runs over edp / replicas and its shard is then all-reduced over the replicas."""
    from projection.perf.placement import expert_dp_placement, expert_shard_placements

    moe = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                    moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1024})
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=16)
    plan = ParallelPlan(dp=16, ep=2, sharding={"zero_stage": 3, "fsdp": "torch_fsdp2", "dp_replicate": 2})
    sc = Scenario(model=moe, training=training, plan=plan, framework="torchtitan",
                  cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=2, gpus_per_node=8))
    shard, replicate = expert_shard_placements(sc.cluster, plan)
    assert plan.edp() == 8 and shard.n_ranks == 4 and replicate is not None and replicate.n_ranks == 2
    assert expert_dp_placement(sc.cluster, plan).n_ranks == 8
    rows = {(r.collective, r.group) for r in step_shapes(sc) if r.collective}
    assert {("all_reduce", "dp_replicate"), ("all_reduce", "edp_replicate")} <= rows
    (slot,) = split_stages(sc.model, sc.plan)
    params = stage_params(sc.model, sc.plan, slot)
    names = [n for n, _, _ in params.components]
    sizes = FsdpSizes(sc, default_cost_model(sc))
    _, _, ar = sizes.unit_seconds(params, names)
    sizes.expert_replicate = None  # the same units without the experts' replica all-reduce
    _, _, dense_ar = sizes.unit_seconds(params, names)
    layers = [k for k, n in enumerate(names) if n.startswith("layer")]
    assert layers and all(ar[k] > dense_ar[k] > 0 for k in layers)


def test_hsdp_replicas_must_split_the_expert_group() -> None:
    """HSDP shards the experts inside each replica: ep 8 on 8 GPUs leaves one expert-data-parallel rank, which two
    replicas cannot split (TorchTitan refuses it), so the layout is refused, not priced over a zero-rank group."""
    from projection.specs.scenario import RawScenario
    from projection.specs.validate import layout_problems

    moe = ModelSpec(num_layers=2, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                    moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 1024})
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=8)
    for ep, refused in ((8, True), (4, False)):
        plan = ParallelPlan(dp=8, ep=ep, sharding={"zero_stage": 3, "fsdp": "torch_fsdp2", "dp_replicate": 2})
        problems = layout_problems(RawScenario("t.toml", "torchtitan"), moe, training, plan, 8)
        assert any(p.key == "plan.ep" and "HSDP" in p.message for p in problems) == refused

