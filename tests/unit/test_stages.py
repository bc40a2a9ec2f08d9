"""Pipeline stage split: Megatron layouts, uneven first/last stages, account-for flags, V-shaped placement."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from projection import api
from projection.errors import PlanError
from projection.specs.model import ModelSpec
from projection.specs.plan import ParallelPlan
from projection.workload.stages import LayoutError, expand_layout, layer_counts, split_stages, stage_rank


def model(layers: int, mtp: int = 0) -> ModelSpec:
    return ModelSpec(num_layers=layers, hidden_size=256, num_attention_heads=4, ffn_hidden_size=512,
                     vocab_size=1000, mtp_num_layers=mtp)


def test_expand_deepseek_proxy_layout() -> None:
    # Megatron functional test deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release: 14 layers, pp 4, vpp 2.
    assert expand_layout("Et*2|(tt|)*5t|tmL") == ["Ett", "tt", "tt", "tt", "tt", "tt", "t", "tmL"]
    plan = ParallelPlan(pp=4, vpp=2, schedule="interleaved_1f1b", pipeline_layout="Et*2|(tt|)*5t|tmL")
    slots = split_stages(model(14, mtp=1), plan)
    assert [len(s.layers) for s in slots] == [2, 2, 2, 2, 2, 2, 1, 1]
    assert slots[0].embedding and slots[-1].loss and slots[-1].mtp_layers == 1
    # virtual stage s lives on rank s % pp (chunk s // pp)
    assert [(s.pp_rank, s.chunk) for s in slots] == [(r % 4, r // 4) for r in range(8)]
    assert slots[-1].layers == (13,)


def test_layout_commas_and_errors() -> None:
    assert expand_layout("E,t*3|t*3,L") == ["Ettt", "tttL"]
    with pytest.raises(LayoutError, match="unknown symbols"):
        expand_layout("Et*3|x")
    with pytest.raises(LayoutError, match="layout has 2 stages"):
        layer_counts(model(6), ParallelPlan(pp=4, pipeline_layout="Et*3|t*3L"))
    with pytest.raises(LayoutError, match="places 6 decoder layers"):
        layer_counts(model(8), ParallelPlan(pp=2, pipeline_layout="Et*3|t*3L"))


def test_even_split_with_vpp() -> None:
    # Llama-3.1-70B: 80 layers, pp 4, vpp 5 -> 4 layers per virtual stage; rank 0 holds layers 0-3, 16-19, ...
    slots = split_stages(model(80), ParallelPlan(pp=4, vpp=5, schedule="interleaved_1f1b"))
    assert all(len(s.layers) == 4 for s in slots)
    rank0 = [i for s in slots if s.pp_rank == 0 for i in s.layers]
    assert rank0 == [*range(0, 4), *range(16, 20), *range(32, 36), *range(48, 52), *range(64, 68)]


def test_account_for_embedding_and_loss() -> None:
    # 30 layers + 2 slots over 4 stages = 8 each; first and last stage give one slot up.
    plan = ParallelPlan(pp=4, account_for_embedding=True, account_for_loss=True)
    assert layer_counts(model(30), plan) == [7, 8, 8, 7]


def test_uneven_first_last() -> None:
    assert layer_counts(model(61), ParallelPlan(pp=8, first_stage_layers=5, last_stage_layers=2)) == \
        [5, 9, 9, 9, 9, 9, 9, 2]
    with pytest.raises(LayoutError, match="leave 53 of the 60 layers for the other 6 pipeline ranks"):
        layer_counts(model(60), ParallelPlan(pp=8, first_stage_layers=5, last_stage_layers=2))
    # pp 2 has no middle stage: the messages say what is wrong (they said "-8 layers for 1 middle stages")
    with pytest.raises(LayoutError, match="add up to 40, more than the model's 32 layers"):
        layer_counts(model(32), ParallelPlan(pp=2, first_stage_layers=40))
    with pytest.raises(LayoutError, match="leave 14 of the 32 layers for no other pipeline rank \\(the first and last"):
        layer_counts(model(32), ParallelPlan(pp=2, first_stage_layers=9, last_stage_layers=9))
    assert layer_counts(model(32), ParallelPlan(pp=2, first_stage_layers=9)) == [9, 23]


def test_uneven_not_divisible() -> None:
    with pytest.raises(LayoutError, match="cannot be split evenly"):
        layer_counts(model(30), ParallelPlan(pp=4))


def test_v_shape_placement() -> None:
    # ZB-V / DualPipeV: stages 0..pp-1 go down the ranks, pp..2pp-1 come back up (rank 0 holds first and last).
    assert [stage_rank(s, 4, True)[0] for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    slots = split_stages(model(16), ParallelPlan(pp=4, vpp=2, schedule="zbv"))
    assert slots[0].pp_rank == 0 and slots[-1].pp_rank == 0 and slots[-1].loss


def test_explicit_stage_layers() -> None:
    plan = ParallelPlan(pp=2, vpp=2, schedule="interleaved_1f1b", stage_layers=(3, 4, 4, 3))
    assert [s.layers for s in split_stages(model(14), plan)] == [(0, 1, 2), (3, 4, 5, 6), (7, 8, 9, 10),
                                                                 (11, 12, 13)]


def test_account_for_flags_with_uneven_first_or_last_stages_are_refused() -> None:
    """Megatron-Core's get_num_layers_to_build asserts "Does not support standalone embedding stage and standalone
    loss stage with uneven pp": the projection used to drop the account-for flag silently."""
    script = ("torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 30 --hidden-size 1024 --num-attention-heads 16 "
              "--seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 "
              "--global-batch-size 8 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
              "--account-for-loss-in-pipeline-split\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.sh"
        path.write_text(script)
        with pytest.raises(PlanError, match="standalone embedding or loss stage with uneven pp") as err:
            api.load(path)
        assert err.value.problems[0].key == "--account-for-loss-in-pipeline-split"
        path.write_text(script.replace(" --account-for-loss-in-pipeline-split", ""))
        assert api.load(path).plan.first_stage_layers == 6
