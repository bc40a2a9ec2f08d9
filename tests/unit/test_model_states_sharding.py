"""Distributed-optimizer sharding groups (Megatron-LM): dense optimizer state is sharded over the data-parallel group
*with* context parallelism (DistributedOptimizer is built on `get_data_parallel_group(with_context_parallel=True)`),
so a cp 2 x dp 4 job keeps 1/8 of the fp32 master weights and Adam moments per rank (Rajbhandari et al. 2020: 12 B
per parameter of optimizer state with mixed precision, divided by the shard group)."""

from __future__ import annotations

import pytest

from projection.memory.model_states import model_state_bytes
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.training import TrainingSpec
from projection.workload.params import per_rank_params

MODEL = ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000)
TRAINING = TrainingSpec(seq_length=4096, micro_batch_size=1, global_batch_size=8)


@pytest.mark.parametrize(("dp", "cp", "zero"), [(4, 2, 1), (8, 1, 1), (2, 4, 2), (4, 2, 0)])
def test_optimizer_state_is_sharded_over_dp_times_cp(dp: int, cp: int, zero: int) -> None:
    plan = ParallelPlan(dp=dp, cp=cp, sharding={"zero_stage": zero})
    (rank,) = per_rank_params(MODEL, plan)
    states = model_state_bytes(MODEL, TRAINING, plan, rank)
    group = dp * cp if zero >= 1 else 1
    assert states.optimizer == pytest.approx(12 * rank.params / group, abs=12 * group)
    # ZeRO-2 shards the fp32 main gradients over the same group; below it every rank keeps them whole
    assert states.gradients == pytest.approx(4 * rank.params / (group if zero >= 2 else 1), abs=4 * group)
