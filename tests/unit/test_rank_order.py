"""Megatron's rank order with --use-tp-pp-dp-mapping: tp-cp-ep-pp-dp (megatron/training/initialize.py:
`order='tp-cp-ep-dp-pp' if not args.use_tp_pp_dp_mapping else 'tp-cp-ep-pp-dp'`), the pipeline inside data
parallelism. The fast placements (projection/perf/placement.py) equal the generic walk over every rank
(projection.cost.collectives.group_placement) in both orders, and a small grid checked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from projection.cost.collectives import GroupPlacement, group_placement
from projection.formats.megatron_files import load_megatron
from projection.perf.placement import boundary_placement, grid_placement, op_placements
from projection.specs.hardware import ClusterSpec, load_device
from projection.specs.plan import ParallelPlan

DEVICE = load_device("h100-sxm")
ALT = "tp-cp-ep-pp-dp"
FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "megatron"


@pytest.mark.parametrize("order", ["tp-cp-ep-dp-pp", ALT])
def test_fast_placements_equal_the_rank_walk(order: str) -> None:
    for sizes, gpn in [((2, 2, 1, 4, 2), 8), ((8, 1, 1, 2, 4), 8), ((1, 2, 2, 2, 2), 4), ((4, 1, 2, 1, 2), 2),
                       ((2, 1, 1, 2, 2), 4)]:
        cluster = ClusterSpec(device=DEVICE, nodes=math.prod(sizes) // gpn, gpus_per_node=gpn)
        for axis in ("tp", "cp", "ep", "dp", "pp", "dp-cp", "tp-cp-dp-pp"):
            fast = grid_placement(cluster, sizes, axis, order)
            assert fast == group_placement(cluster, *sizes, axis, order), (sizes, axis, order)


def test_pp_inside_dp_puts_data_parallelism_across_nodes() -> None:
    """tp 2, pp 2, dp 2 on 2 nodes of 4 GPUs. Default: ranks tp_i + 2 dp_i + 4 pp_i, so a dp pair (0, 2) shares a
    node and a pipeline pair (0, 4) does not. With the mapping: tp_i + 2 pp_i + 4 dp_i, the other way round."""
    cluster = ClusterSpec(device=DEVICE, nodes=2, gpus_per_node=4)
    default = op_placements(cluster, ParallelPlan(tp=2, pp=2, dp=2))
    mapped = op_placements(cluster, ParallelPlan(tp=2, pp=2, dp=2, rank_order=ALT))
    assert (default["dp"].n_nodes, default["pp"].n_nodes) == (1, 2)
    assert (mapped["dp"].n_nodes, mapped["pp"].n_nodes) == (2, 1)
    # the activations between pipeline ranks 0 and 1: GPUs 0 and 4 by default, GPUs 0 and 2 with the mapping
    assert boundary_placement(cluster, ParallelPlan(tp=2, pp=2, dp=2), 0, 1) == GroupPlacement(2, 1, 2, True)
    assert boundary_placement(cluster, ParallelPlan(tp=2, pp=2, dp=2, rank_order=ALT), 0, 1).n_nodes == 1


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared fixtures absent (user clone)")
def test_the_flag_reaches_the_plan() -> None:
    """Two functional-test configs that differ in --use-tp-pp-dp-mapping (the other difference, etp, is inert on a
    dense model)."""
    plain = load_megatron(FIXTURES / "gpt3_mcore_te_tp2_pp2_cp2_calculate_per_token_loss_nondeterministic"
                          / "model_config.yaml")
    mapped = load_megatron(FIXTURES / "gpt3_mcore_te_tp2_pp2_cp2_etp4_nondeterministic_dp_last" / "model_config.yaml")
    assert plain.get("plan.rank_order") is None and mapped.get("plan.rank_order") == ALT
    assert mapped.origins["plan.rank_order"].key == "--use-tp-pp-dp-mapping"


def test_pp_inside_dp_needs_one_data_parallel_size_for_experts_and_attention(tmp_path: Path) -> None:
    """parallel_state.initialize_model_parallel: "When not using pp-last rank ordering, the data parallel size of the
    attention and moe layers must be the same" (pp > 1): 8 experts at ep 4 on 16 GPUs, pp 2, leave the experts a
    data-parallel size of 2 beside the attention's 8. With ep 1 (edp = dp) the order is accepted."""
    from projection import api
    from projection.errors import PlanError

    script = tmp_path / "train.sh"
    base = ("torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --num-layers 4 --hidden-size 512 "
            "--num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 --vocab-size 32000 "
            "--micro-batch-size 1 --global-batch-size 16 --pipeline-model-parallel-size 2 --num-experts 8 "
            "--moe-grouped-gemm --bf16 --use-tp-pp-dp-mapping ")
    script.write_text(base + "--expert-model-parallel-size 4 --sequence-parallel\n")
    with pytest.raises(PlanError, match="world / \\(etp \\* ep \\* pp\\) = 2, equal to the attention's \\(8\\)"):
        api.load(script)
    script.write_text(base + "\n")
    assert api.load(script).plan.rank_order == ALT
