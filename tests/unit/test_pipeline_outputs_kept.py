"""torch.distributed.pipelining's `output_chunks` in the memory estimate (memory/pipeline_io.py,
ParallelPlan.pipeline_outputs_kept): which torch release keeps what, the finished-microbatch counts it is weighed by,
and the moments of the step it adds to. The bytes themselves are measured on a real pipeline in
tests/oracle/test_pipeline_io_gloo.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.memory.estimate import estimate_memory
from projection.memory.pipeline_io import boundary_bytes, kept_output_bytes, merge_copy_bytes
from projection.schedule.basic import one_f_one_b
from projection.schedule.inflight import done_matrices, inflight_matrices
from projection.schedule.registry import build_schedule
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan, torch_pipeline_outputs_kept
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec
from projection.workload.stages import split_stages

TT_RUNS = Path(__file__).resolve().parents[2] / "benchmarks" / "torchtitan_runs"


@pytest.mark.parametrize(("version", "kept"), [("2.5.1", "every_stage"), ("2.7.0a0+git1963fc8", "every_stage"),
                                                ("2.8.0", "last_stage"), ("2.9", "last_stage"),
                                                ("2.10.0+rocm7.0", "last_stage"), ("nightly", None)])
def test_torch_release_decides_which_stages_keep_outputs(version: str, kept: str | None) -> None:
    """Up to 2.7 `forward_one_chunk` appends every stage's output; from 2.8 only the last stage's (`if
    self.is_last`, read in the 2.8 and 2.13 wheels)."""
    assert torch_pipeline_outputs_kept(version) == kept


def test_finished_counts_are_the_forwards_less_those_in_flight() -> None:
    """done_matrices counts the B (or I) passes run: with the in-flight counts they add up to the forwards run,
    and every microbatch is finished on every stage when the step ends."""
    for sched in (one_f_one_b(4, 8), build_schedule("interleaved_1f1b", 4, 8, 2, style="torch"),
                  build_schedule("zb_h1", 4, 8)):
        for r, ((stages, live), (stages_done, done)) in enumerate(zip(inflight_matrices(sched), done_matrices(sched),
                                                                      strict=True)):
            assert stages == stages_done
            compute = [a for a in sched.actions[r] if a.kind in ("F", "B", "I", "W")]
            forwards = {st: 0 for st in stages}
            for k, a in enumerate(compute):
                forwards[a.stage] += a.kind == "F"
                assert [live[k, j] + done[k, j] for j in range(len(stages))] == [forwards[st] for st in stages]
            assert list(done[-1]) == [8] * len(stages)


def _scenario(kept: str, pp: int = 2) -> Scenario:
    model = ModelSpec(num_layers=4, hidden_size=256, num_attention_heads=4, ffn_hidden_size=1024, vocab_size=65536)
    training = TrainingSpec(seq_length=2048, micro_batch_size=1, global_batch_size=8)
    plan = ParallelPlan(pp=pp, dp=1, schedule="1f1b", schedule_style="torch", pipeline_outputs_kept=kept)
    return Scenario(model=model, training=training, plan=plan,
                    cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=pp))


def test_the_last_stage_peaks_where_it_merges_its_kept_logits() -> None:
    """A small model with a large vocabulary: the last stage's 8 kept logits and their concatenated copy outweigh
    one microbatch's activations, so its peak is the merge at the end of the step (no activations left, all
    gradients held), and is the peak without output_chunks plus what the merge holds beyond it."""
    with_kept, without = estimate_memory(_scenario("last_stage")), estimate_memory(_scenario("none"))
    sc = _scenario("last_stage")
    slots = split_stages(sc.model, sc.plan)
    logits = kept_output_bytes(sc, slots[-1], len(slots))
    assert logits == 2048 * 65536 * 2  # one microbatch's bf16 logits
    assert merge_copy_bytes(sc, slots, len(slots), 8) == 8 * logits
    last = with_kept.ranks[-1]
    assert last.terms["activations.pipeline_kept_outputs"] == 8 * logits
    assert last.terms["activations.pipeline_output_merge"] == 8 * logits
    assert last.bytes["activations"] == 16 * logits
    base = sum(v for k, v in without.ranks[-1].bytes.items() if k != "activations")
    assert last.peak_bytes == base + 16 * logits
    assert without.ranks[-1].peak_bytes < last.peak_bytes
    # the first stage keeps nothing from torch 2.8: unchanged
    assert with_kept.ranks[0].peak_bytes == without.ranks[0].peak_bytes


def test_up_to_torch_2_7_every_stage_keeps_its_finished_outputs() -> None:
    """Torch-style 1F1B at pp 2 over 8 microbatches: the first stage's peak moves to its last forward, 2 microbatches
    in flight and 6 finished, so it grows by exactly 6 boundary tensors; the last stage keeps its logits either
    way."""
    every, last = estimate_memory(_scenario("every_stage")), estimate_memory(_scenario("last_stage"))
    b = boundary_bytes(_scenario("every_stage"))
    assert every.ranks[0].inflight == {0: 2}
    assert every.ranks[0].terms["activations.pipeline_kept_outputs"] == 6 * b
    assert every.ranks[0].peak_bytes - last.ranks[0].peak_bytes == 6 * b
    assert every.ranks[-1].peak_bytes == last.ranks[-1].peak_bytes


def test_the_optimizer_step_holds_every_kept_output() -> None:
    """Where the optimizer step has transient buffers of its own (Megatron's fp32 copies of 16-bit main gradients,
    given through the runtime here) and peaks, the outputs output_chunks keeps are held beside them."""
    from dataclasses import replace

    from projection.memory.buffers import runtime_for
    from projection.specs.training import OptimizerSpec

    def scenario(kept: str) -> Scenario:
        sc = _scenario(kept)
        training = sc.training.model_copy(update={"optimizer": OptimizerSpec(main_grads_dtype="bf16"),
                                                  "seq_length": 64})
        return sc.model_copy(update={"training": training})

    reports = {k: estimate_memory(scenario(k), runtime=replace(runtime_for(scenario(k)), megatron=True))
               for k in ("every_stage", "none")}
    first = reports["every_stage"].ranks[0]
    assert "optimizer_step.fp32_grad_copies" in first.terms and first.inflight == {0: 0}
    b = boundary_bytes(scenario("every_stage"))
    assert first.terms["activations.pipeline_kept_outputs"] == 8 * b == first.bytes["activations"]
    assert first.peak_bytes - reports["none"].ranks[0].peak_bytes == 8 * b


def test_a_v_schedules_hand_over_is_kept_as_the_next_stages_buffer() -> None:
    """Under the 2.10+ runtime a V schedule's output handed to the same rank's next stage is that stage's receive
    buffer (set_local_fwd_input), counted with the buffers, not kept again."""
    from projection.memory.pipeline_io import kept_output_weights

    model = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=4, ffn_hidden_size=1024, vocab_size=1024)
    plan = ParallelPlan(pp=2, vpp=2, dp=1, schedule="zbv", schedule_style="torch", pipeline_outputs_kept="every_stage")
    sc = Scenario(model=model, training=TrainingSpec(seq_length=128, micro_batch_size=1, global_batch_size=4),
                  plan=plan, cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=2))
    b = boundary_bytes(sc)
    slots = split_stages(sc.model, sc.plan)
    assert [s.pp_rank for s in slots] == [0, 1, 1, 0]
    weights = kept_output_weights(sc, slots)
    assert [weights[i] for i in range(3)] == [b, 0.0, b]
    lockstep = sc.model_copy(update={"plan": plan.model_copy(update={"pipeline_runtime": "lockstep"})})
    assert kept_output_weights(lockstep, slots)[1] == b


def test_merge_peak_has_nothing_in_flight() -> None:
    last = estimate_memory(_scenario("last_stage")).ranks[-1]
    assert "activations.pipeline_output_merge" in last.terms and set(last.inflight.values()) == {0}


def test_pytorch_flag_sets_it_where_nothing_states_it(tmp_path: Path) -> None:
    from projection.errors import ConfigError

    toml = TT_RUNS / "t5_llama31_405b_fsdp8_tp8_pp8_1f1b.toml"
    assert api.load(toml, hardware="h100-sxm", nodes=64).plan.pipeline_outputs_kept == "last_stage"
    assert api.load(toml, hardware="h100-sxm", nodes=64, pytorch="2.7").plan.pipeline_outputs_kept == "every_stage"
    assert api.load(toml, hardware="h100-sxm", nodes=64, pytorch="2.9").plan.pipeline_outputs_kept == "last_stage"
    native = tmp_path / "exp.yaml"
    native.write_text("model: llama2_7B\ntraining: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 8}\n"
                      "plan: {pp: 2, schedule: 1f1b, schedule_style: torch}\n")
    stated = tmp_path / "stated.yaml"
    stated.write_text(native.read_text().replace("schedule_style: torch", "schedule_style: torch, "
                                                 "pipeline_outputs_kept: none"))

    def kept(path: Path, pytorch: str, overrides: tuple[str, ...] = ()) -> str:
        sc = api.load(path, hardware="h100-sxm", gpus_per_node=2, overrides=list(overrides), pytorch=pytorch)
        return sc.plan.pipeline_outputs_kept

    # the file's or --set's own value wins over --pytorch's
    assert kept(stated, "2.10") == "none"
    assert kept(native, "2.12", ("plan.pipeline_outputs_kept=none",)) == "none"
    assert kept(native, "2.7", ("plan.pipeline_outputs_kept=last_stage",)) == "last_stage"
    # return_outputs=False came with torch 2.10: a stated "none" on an older torch is refused where it is written
    for path, overrides, file in ((stated, (), str(stated)), (native, ("plan.pipeline_outputs_kept=none",), "--set")):
        with pytest.raises(ConfigError, match="needs torch 2.10 or later") as err:
            kept(path, "2.9", overrides)
        problem = err.value.problems[0]
        assert problem.file == file and "pipeline_outputs_kept" in str(problem.key)


def test_explain_lists_the_kept_outputs_and_their_merge() -> None:
    from projection.memory.explain import explain

    report = estimate_memory(_scenario("last_stage"))
    lines = explain(report).splitlines()
    last = report.ranks[-1]
    for k in ("activations.pipeline_kept_outputs", "activations.pipeline_output_merge"):
        assert any(line.split() == [k, f"{last.terms[k]:,.0f}"] for line in lines), k
