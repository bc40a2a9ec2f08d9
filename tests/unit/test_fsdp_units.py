"""FSDP2 units held unsharded at the peak (TorchTitan): with reshard after forward, the unit computing plus the one
prefetched; the [norm, output] unit is never resharded after forward, so at the start of backward it is held with the
last layer's unit, and with a large vocabulary that pair is the larger one."""

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
    output = model.padded_vocab(1) * 1024 * 2
    expected = max(2 * layer, layer + output) * (1 - 1 / 8)
    assert unsharded_unit_bytes(model, TRAINING, PLAN, rank, output_unit=True) == pytest.approx(expected, rel=1e-9)
    assert unsharded_unit_bytes(model, TRAINING, PLAN, rank) == pytest.approx(2 * layer * (1 - 1 / 8), rel=1e-9)
