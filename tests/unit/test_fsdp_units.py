"""FSDP2 units held unsharded at the peak (TorchTitan), each a whole compute-dtype buffer: with reshard after forward,
the unit computing plus the one prefetched; the [norm, output] unit is never resharded after forward, so at the start
of backward it is held with the last layer's unit, and with a large vocabulary that pair is the larger one."""

from __future__ import annotations

import pytest

from projection.memory.model_states import unsharded_unit_bytes
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec
from projection.workload.params import Sharding, layer_params, per_rank_params

TRAINING = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=8)
PLAN = ParallelPlan(tp=1, pp=1, dp=8, sharding={"zero_stage": 3, "fsdp": "torch_fsdp2"})


@pytest.mark.parametrize("vocab", [1024, 128256])
def test_output_unit_is_held_with_the_last_layer(vocab: int) -> None:
    model = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=vocab)
    (rank,) = per_rank_params(model, PLAN)
    layer = sum(layer_params(model, 0, Sharding(1, 1, 1)).values()) * 2
    output = (model.padded_vocab(1) * 1024 + 1024) * 2  # the output weight and the final RMSNorm
    # FSDP2's unsharded copies are whole buffers (tests/oracle/test_fsdp2_unsharded_cpu.py)
    expected = max(2 * layer, layer + output)
    assert unsharded_unit_bytes(model, TRAINING, PLAN, rank, output_unit=True) == pytest.approx(expected, rel=1e-9)
    assert unsharded_unit_bytes(model, TRAINING, PLAN, rank) == pytest.approx(2 * layer, rel=1e-9)


def test_without_reshard_every_unit_of_the_rank_is_held() -> None:
    """TorchTitan's default policy under PP keeps every unit unsharded from its forward to its backward: the decoder
    layers, the embedding on the first stage and [norm, output] on the last."""
    model = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000)
    plan = PLAN.model_copy(update={"sharding": PLAN.sharding.model_copy(update={"reshard_after_forward": False})})
    (rank,) = per_rank_params(model, plan)
    layers = sum(sum(layer_params(model, i, Sharding(1, 1, 1)).values()) for i in range(4)) * 2
    ends = (2 * model.padded_vocab(1) * 1024 + 1024) * 2  # untied embedding and output, the final RMSNorm
    assert unsharded_unit_bytes(model, TRAINING, plan, rank, output_unit=True) == pytest.approx(layers + ends,
                                                                                                rel=1e-9)


def test_output_unit_is_gathered_once_per_step() -> None:
    """Resharded units are gathered in forward and again in backward; TorchTitan's [norm, output] unit only once."""
    from projection.specs.hardware import ClusterSpec, load_device
    from projection.specs.scenario import Scenario
    from projection.workload.shapes import step_shapes

    model = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000)
    sc = Scenario(model=model, training=TRAINING, plan=PLAN, framework="torchtitan",
                  cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=8))
    (rank,) = per_rank_params(model, PLAN)
    out = rank.by_component["output"] * 2
    gathered = sum(r.size_bytes * r.count_per_step for r in step_shapes(sc) if r.collective == "all_gather")
    assert gathered == 2 * (rank.params * 2 - out) + out
