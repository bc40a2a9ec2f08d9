"""memory/pipeline_io.py's rules on a V schedule, where two stages of one rank meet: torch hands the output of one
over as the input of the other (the buffers and held outputs themselves are measured on real pipelines in
tests/oracle/test_pipeline_io_gloo.py)."""

from __future__ import annotations


def test_a_v_schedules_hand_over_is_neither_held_nor_a_receive_buffer() -> None:
    """ZB-V places stages pp - 1 and pp on the last rank: torch hands stage pp - 1's output over as stage pp's input
    (set_local_fwd_input), so the first is not held as an output and the second's saved input is not its receive
    buffer; every other boundary is (memory/pipeline_io.py)."""
    from projection.memory.estimate import _with_pipeline_io
    from projection.memory.pipeline_io import boundary_bytes, in_flight_io_bytes
    from projection.specs.hardware import ClusterSpec, load_device
    from projection.specs.model import ModelSpec
    from projection.specs.plan import ParallelPlan
    from projection.specs.scenario import Scenario
    from projection.specs.training import TrainingSpec
    from projection.workload.stages import split_stages

    model = ModelSpec(num_layers=8, hidden_size=256, num_attention_heads=4, ffn_hidden_size=1024, vocab_size=1024)
    plan = ParallelPlan(pp=2, vpp=2, dp=1, schedule="zbv", schedule_style="torch", recompute={"granularity": "full",
                                                                                              "method": "uniform",
                                                                                              "num_layers": 1})
    sc = Scenario(model=model, training=TrainingSpec(seq_length=128, micro_batch_size=1, global_batch_size=4),
                  plan=plan, cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=2))
    slots = split_stages(sc.model, sc.plan)
    assert [s.pp_rank for s in slots] == [0, 1, 1, 0]
    b = boundary_bytes(sc)
    got = [in_flight_io_bytes(sc, s, 4, s.stage < 3 and slots[s.stage + 1].pp_rank == s.pp_rank,
                              s.stage > 0 and slots[s.stage - 1].pp_rank == s.pp_rank) for s in slots]
    assert [held for held, _ in got[:3]] == [b, 0.0, b]
    assert [counted for _, counted in got] == [0.0, b, 0.0, b]
    # and the estimate applies the same rule
    plain = {s.stage: (1.0, {"activations.dense_layers": 1.0 + b}) for s in slots}
    assert _with_pipeline_io(sc, slots[2], slots, plain[2])[1].get("activations.dense_layers") == 1.0 + b


def test_explain_names_the_pipeline_buffers_and_held_outputs() -> None:
    """`projection memory --explain` lists the buffers and held pipeline outputs a rank's peak includes."""
    from pathlib import Path

    from projection import api
    from projection.memory.explain import explain

    toml = Path(__file__).resolve().parents[2] / "benchmarks" / "torchtitan_runs" / \
        "t5_llama31_405b_fsdp8_tp8_pp8_1f1b.toml"
    report = api.estimate_memory(api.load(toml, hardware="h100-sxm", nodes=64))
    text = explain(report)
    lines = text.splitlines()
    for k in ("buffers.pipeline_receive_buffers", "activations.pipeline_outputs"):
        value = report.ranks[0].terms[k]
        assert value > 0 and any(line.split() == [k, f"{value:,.0f}"] for line in lines), k
