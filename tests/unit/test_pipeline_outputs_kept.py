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
    """With every stage keeping its outputs, the first stage's peak can only grow, by at most the m boundary
    tensors it ends the step with."""
    every, last = estimate_memory(_scenario("every_stage")), estimate_memory(_scenario("last_stage"))
    b = boundary_bytes(_scenario("every_stage"))
    grow = every.ranks[0].peak_bytes - last.ranks[0].peak_bytes
    assert 0 <= grow <= 8 * b
    assert every.ranks[-1].peak_bytes == last.ranks[-1].peak_bytes  # the last stage keeps its logits either way


def test_pytorch_flag_sets_it_and_an_explicit_set_wins(tmp_path: Path) -> None:
    toml = TT_RUNS / "t5_llama31_405b_fsdp8_tp8_pp8_1f1b.toml"
    assert api.load(toml, hardware="h100-sxm", nodes=64).plan.pipeline_outputs_kept == "last_stage"
    assert api.load(toml, hardware="h100-sxm", nodes=64, pytorch="2.7").plan.pipeline_outputs_kept == "every_stage"
    assert api.load(toml, hardware="h100-sxm", nodes=64, pytorch="2.9").plan.pipeline_outputs_kept == "last_stage"
    native = tmp_path / "exp.yaml"
    native.write_text("model: llama2_7B\ntraining: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 8}\n"
                      "plan: {pp: 2, schedule: 1f1b, schedule_style: torch}\n")
    sc = api.load(native, hardware="h100-sxm", gpus_per_node=2, overrides=["plan.pipeline_outputs_kept=none"],
                  pytorch="2.7")
    assert sc.plan.pipeline_outputs_kept == "none"


def test_explain_lists_the_kept_outputs_and_their_merge() -> None:
    from projection.memory.explain import explain

    report = estimate_memory(_scenario("last_stage"))
    lines = explain(report).splitlines()
    last = report.ranks[-1]
    for k in ("activations.pipeline_kept_outputs", "activations.pipeline_output_merge"):
        assert any(line.split() == [k, f"{last.terms[k]:,.0f}"] for line in lines), k
