"""Where FSDP2's copies are priced (projection/perf/fsdp_sizes.py; their bytes against FSDP2 itself:
tests/oracle/test_fsdp2_copies_cpu.py): the all-gather copy-out before a gathered unit's compute, in forward and
again in backward when resharded after forward; the gradients' copy into the reduce-scatter buffer after the unit's
backward; the copy-in and the reduced shard's cast on the collectives' streams. None under pipelined FSDP2 (once a
step) or another FSDP."""

from __future__ import annotations

import pytest

from projection.perf import project
from projection.perf.costmodel import default_cost_model
from projection.perf.fsdp_sizes import FsdpSizes, copy_in_op, reduce_cast_op
from projection.perf.stage_params import stage_params
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec
from projection.workload.stages import split_stages

MODEL = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000)


def scenario(pp: int = 1, reshard: bool = True, fsdp: str = "torch_fsdp2", reduce: str = "fp32") -> Scenario:
    dp = 8 // pp
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=4 * dp,
                            optimizer={"main_grads_dtype": reduce})
    plan = ParallelPlan(pp=pp, dp=dp, schedule_style="torch", sharding={
        "zero_stage": 3, "fsdp": fsdp, "reshard_after_forward": reshard})
    return Scenario(model=MODEL, training=training, plan=plan, framework="torchtitan",
                    cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=8))


def sizes(sc: Scenario) -> tuple[FsdpSizes, list[str]]:
    slot = split_stages(sc.model, sc.plan)[0]
    params = stage_params(sc.model, sc.plan, slot)
    names = [n for n, _, _ in params.components]
    fs = FsdpSizes(sc, default_cost_model(sc))
    fs.unit_seconds(params, names)
    return fs, names


def test_each_unit_has_its_copy_out_and_chunk_cat() -> None:
    fs, names = sizes(scenario())
    layer = 16 * 1024 * 1024 + 2 * 1024  # attention 4h^2, gated MLP 12h^2, two norms
    (outs, ins), = [c for n, c in zip(names, fs.copies, strict=True) if n == "layer0"]
    assert [(o.bytes_read, o.bytes_written) for o in outs] == [(2 * layer, 2 * layer)]  # bf16 gathered and split
    assert [(o.bytes_read, o.bytes_written) for o in ins] == [(2 * layer, 4 * layer)]  # bf16 grads, fp32 buffer


def test_the_copies_on_the_collective_streams() -> None:
    """The copy-in casts the fp32 shard to bf16 and copies it into the gather buffer; without a cast it is one copy.
    A bf16 reduce casts the reduced shard back to fp32; an fp32 reduce does not."""
    op = copy_in_op(800, 1600, 4, 8)
    assert (op.bytes_read, op.bytes_written) == (100 * 4 + 200, 2 * 200)
    op = copy_in_op(800, 3200, 4, 8)
    assert (op.bytes_read, op.bytes_written) == (400, 400)
    cast = reduce_cast_op(800, 2, 4, 8)
    assert cast is not None and (cast.bytes_read, cast.bytes_written) == (200, 400)
    assert reduce_cast_op(800, 4, 4, 8) is None


@pytest.mark.parametrize("sc", [scenario(pp=2, reshard=False), scenario(fsdp="megatron_fsdp")],
                         ids=["pipelined FSDP2", "Megatron-FSDP"])
def test_no_copies_priced_where_they_do_not_run_per_unit(sc: Scenario) -> None:
    fs, _ = sizes(sc)
    assert all(c == ((), ()) for c in fs.copies)


def test_the_copies_run_on_the_compute_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each unit's forward runs one copy-out and its backward one chunk_cat, and one more copy-out where the unit is
    re-gathered (resharded after forward; TorchTitan's [norm, output] unit never is): the compute stream's
    memory-bound seconds grow by exactly those, 4 microbatches a step. The step grows by less where the copies
    fill time the rank spent waiting for a gather."""
    sc = scenario()
    fs, names = sizes(sc)
    cm = default_cost_model(sc)
    per_mb = sum(cm.op_seconds(o) * (1 if name == "output" else 2) for name, (outs, _) in zip(names, fs.copies,
                                                                                              strict=True)
                 for o in outs) + sum(cm.op_seconds(o) for _, ins in fs.copies for o in ins)
    with_copies = project(sc)
    monkeypatch.setattr(FsdpSizes, "_unit_copies", lambda self, name, groups: ((), ()))
    without = project(sc)
    grown = with_copies.breakdown_s["compute.memory_bound"] - without.breakdown_s["compute.memory_bound"]
    assert grown == pytest.approx(4 * per_mb, rel=1e-9)
    assert 0 < with_copies.step_time_s - without.step_time_s <= grown * (1 + 1e-9)
