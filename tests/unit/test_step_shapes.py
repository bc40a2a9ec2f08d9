"""`projection shapes` (projection/workload/shapes.py) against what the performance model prices."""

from __future__ import annotations

import pytest

from projection.perf import project
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.specs.scenario import Scenario
from projection.specs.training import TrainingSpec
from projection.workload.shapes import step_shapes

MODEL = ModelSpec(num_layers=8, hidden_size=1024, num_attention_heads=16, ffn_hidden_size=4096, vocab_size=32000,
                  tie_embeddings=True)


@pytest.mark.parametrize(("schedule", "vpp", "ranks"), [("1f1b", 1, {0, 3}), ("zbv", 2, set())])
def test_shapes_list_the_tied_embedding_gradient_reduction_that_is_priced(schedule: str, vpp: int,
                                                                          ranks: set[int]) -> None:
    """Tied embeddings over pipeline stages: the embedding's and the output layer's ranks all-reduce the
    word-embedding gradient once per step (Megatron _allreduce_word_embedding_grads); a V-shaped schedule puts both
    on rank 0, so nothing is reduced. `projection shapes` lists the reduction with the bytes the data-parallel
    pricing (perf/dp.py) charges, on those ranks only."""
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=8)
    sc = Scenario(model=MODEL, training=training, plan=ParallelPlan(tp=2, pp=4, vpp=vpp, dp=1, schedule=schedule),
                  cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=8))
    priced = {(b.pp_rank, b.size_bytes) for b in project(sc).dp.grad_buckets if b.group == "embedding"}
    listed = [(r.rank_type, r.size_bytes, r.count_per_step) for r in step_shapes(sc) if r.group == "embedding"]
    size = MODEL.padded_vocab(2) * 1024 // 2 * 4  # vocab shard x hidden, fp32 main gradients
    assert priced == {(r, size) for r in ranks}
    assert [(n, c) for _, n, c in listed] == [(size, 1)] * len(ranks)
    assert len({t for t, _, _ in listed}) == len(ranks), listed


@pytest.mark.parametrize("tied", [False, True])
def test_mtp_stage_all_reduces_its_embedding_copy(tied: bool) -> None:
    """With multi-token prediction the last stage keeps a copy of the word embedding (counted in its parameters) and
    Megatron all-reduces its gradient with the first stage's, tied or not (finalize_model_grads
    _allreduce_word_embedding_grads: "If use Multi-Token Prediction (MTP), we also need to maintain duplicated
    embedding weights in mtp process stage")."""
    model = MODEL.model_copy(update={"tie_embeddings": tied, "mtp_num_layers": 1})
    training = TrainingSpec(seq_length=1024, micro_batch_size=1, global_batch_size=8)
    sc = Scenario(model=model, training=training, plan=ParallelPlan(tp=2, pp=4, dp=1),
                  cluster=ClusterSpec(device=load_device("h100-sxm"), nodes=1, gpus_per_node=8))
    size = MODEL.padded_vocab(2) * 1024 // 2 * 4
    priced = {(b.pp_rank, b.size_bytes) for b in project(sc).dp.grad_buckets if b.group == "embedding"}
    assert priced == {(0, size), (3, size)}
    assert [r.size_bytes for r in step_shapes(sc) if r.group == "embedding"] == [size, size]
