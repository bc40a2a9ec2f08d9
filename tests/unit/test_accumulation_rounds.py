"""TorchTitan's gradient accumulation under PP (specs/accumulation.py, perf/rounds.py): `train_step` calls
`pp_schedule.step()` once per accumulation step over local_batch_size / microbatch_size microbatches, each with its
own fill, drain and gradient reduction; the optimizer steps once. Megatron runs all of a step's microbatches in one
schedule."""

from __future__ import annotations

import pytest

from projection.memory.estimate import estimate_memory
from projection.perf import project
from projection.specs.accumulation import one_round, rounds, schedule_microbatches
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec

MODEL = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000)


def scenario(style: str, schedule: str = "1f1b") -> Scenario:
    # pp 2 x dp 4; local batch 4 of microbatch 1: 4 microbatches per schedule; global batch 48 = 3 rounds
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, local_batch_size=4, global_batch_size=48)
    plan = ParallelPlan(pp=2, dp=4, schedule=schedule, schedule_style=style,
                        sharding={"zero_stage": 3, "fsdp": "torch_fsdp2", "reshard_after_forward": False})
    device = load_device("h100-sxm")
    return Scenario(model=MODEL, training=training, plan=plan, framework="torchtitan" if style == "torch" else "native",
                    cluster=ClusterSpec(device=device, nodes=1, gpus_per_node=8))


def test_torchtitan_runs_one_schedule_per_accumulation_step() -> None:
    sc = scenario("torch")
    assert (rounds(sc), schedule_microbatches(sc)) == (3, 4)
    full, one = project(sc), project(one_round(sc))
    # every round ends when the slowest rank's exposed parameter gather does; the last adds the slowest optimizer
    pipeline = one.sim.step_time_s
    gathers, optimizers = one.param_gather_exposed_s, one.optimizer_s
    last = pipeline + max(o + g for o, g in zip(optimizers, gathers, strict=True))
    assert one.step_time_s == pytest.approx(last, rel=1e-12)
    assert full.step_time_s == pytest.approx(2 * (pipeline + max(gathers)) + last, rel=1e-12)
    assert sum(full.breakdown_s.values()) == pytest.approx(full.step_time_s, rel=1e-12)
    assert full.n_microbatches == 12 and full.comm_total_s["dp"] == pytest.approx(3 * one.comm_total_s["dp"])
    # the same global batch as one schedule of 12 microbatches (local batch 12) pays one fill and drain, not three
    single = sc.model_copy(update={"training": sc.training.model_copy(update={"local_batch_size": 12})})
    assert rounds(single) == 1 and schedule_microbatches(single) == 12
    assert project(single).step_time_s < full.step_time_s


def test_gpipe_holds_one_rounds_microbatches() -> None:
    """GPipe keeps every microbatch of its schedule in flight: with rounds, the 4 of one round, not all 12."""
    sc = scenario("torch", "gpipe")
    full, one = estimate_memory(sc), estimate_memory(one_round(sc))
    assert [r.inflight for r in full.ranks] == [r.inflight for r in one.ranks]
    assert max(sum(r.inflight.values()) for r in full.ranks) == 4


def test_megatron_runs_the_step_in_one_schedule() -> None:
    sc = scenario("megatron")
    assert (rounds(sc), schedule_microbatches(sc)) == (1, 12)


def test_torch_style_compares_only_torchs_schedules() -> None:
    """`--schedule all` for a TorchTitan job lists only what torch.distributed.pipelining runs (GPipe, 1F1B, ...),
    not Megatron/Primus's zero-bubble or DualPipe schedules."""
    from projection.perf.project import applicable_schedules

    names = applicable_schedules(scenario("torch"))
    assert {"gpipe", "1f1b"} <= set(names) and not {"zb_h1", "zb_h2", "dualpipe"} & set(names)
    assert {"zb_h1", "zb_h2"} <= set(applicable_schedules(scenario("megatron")))


def test_torch_schedule_set_is_what_the_torchtitan_loader_maps_to() -> None:
    """schedule.registry.TORCH_SCHEDULES and the TorchTitan loader's name table describe the same schedules."""
    from projection.formats.torchtitan_schema import SCHEDULES
    from projection.schedule.registry import TORCH_SCHEDULES

    assert {name for name, _ in SCHEDULES.values()} == TORCH_SCHEDULES


def test_the_trace_draws_every_round_and_one_optimizer_step() -> None:
    """The Chrome trace of a TorchTitan step under pp shows all of its rounds back to back, each with its exposed
    parameter all-gather, then the optimizer once: it ends at the step the projection reports (it used to show one
    round, 1/3 of the step here, then rounds laid out per rank, which drifted apart). Every round starts on all
    ranks together, so a rank never starts a forward before the previous rank's forward of it has ended."""
    from projection.report.trace import chrome_trace

    full = project(scenario("torch"))
    assert full.rounds == 3 and full.to_dict()["rounds"] == 3 and full.n_microbatches == 12
    tails = [(("optimizer", o), ("param all-gather (exposed)", g))
             for o, g in zip(full.optimizer_s, full.param_gather_exposed_s, strict=True)]
    trace = chrome_trace(full.sim, tails, full.rounds)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    end = max(e["ts"] + e["dur"] for e in spans) / 1e6
    assert end == pytest.approx(trace["otherData"]["step_time_s"], rel=1e-12)
    assert end == pytest.approx(full.step_time_s, rel=1e-12)
    first_f = {(e["pid"], e["args"]["round"]): e for e in sorted(spans, key=lambda e: -e["ts"])
               if e.get("cat") == "F" and e["args"].get("microbatch") == 0}
    for k in range(3):  # microbatch 0's forward of round k on rank 1 starts after rank 0's has ended
        a, b = first_f[(0, k)], first_f[(1, k)]
        assert b["ts"] >= a["ts"] + a["dur"] - 1e-6
    assert {e["args"].get("round") for e in spans if e.get("cat") == "F"} == {0, 1, 2}
    assert sum(e["name"] == "optimizer" for e in spans) == sum(o > 0 for o in full.optimizer_s)
    one = chrome_trace(full.sim, tails)  # one round: the schedule alone, as before
    assert one["otherData"]["rounds"] == 1 and one["otherData"]["step_time_s"] < end / 2
