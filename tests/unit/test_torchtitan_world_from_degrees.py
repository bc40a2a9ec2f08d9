"""A TorchTitan job whose degrees fix its world size is projected on that many GPUs (projection/api.py
_nodes_from_degrees): with data_parallel_shard_degree given, TorchTitan's ParallelDims asserts
replicate x shard x cp x tp x pp = world, so the file names its GPU count (found by the scaling audit: such a file
failed at the default one node, and --target-nodes could not find where to start)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from projection import api
from projection.errors import PlanError
from projection.perf import extrapolate

REPO = Path(__file__).resolve().parents[2]
T4 = REPO / "benchmarks" / "torchtitan_runs" / "t4_llama31_70b_fsdp32_tp8.toml"  # shard 32 x tp 8 = 256 GPUs


def toml(tmp: Path, shard: int, tp: int = 2, rep: int = 1) -> Path:
    path = tmp / "job.toml"
    path.write_text(textwrap.dedent(f"""
        [model]
        name = "llama3"
        flavor = "8B"
        [training]
        local_batch_size = 2
        seq_len = 8192
        [parallelism]
        data_parallel_replicate_degree = {rep}
        data_parallel_shard_degree = {shard}
        tensor_parallel_degree = {tp}
        """), encoding="utf-8")
    return path


def test_the_files_world_sets_the_nodes() -> None:
    sc = api.load(T4, hardware="h100-sxm")
    assert (sc.cluster.nodes, sc.world_size) == (32, 256)
    assert "data_parallel_shard_degree" in sc.origins["cluster.nodes"]
    assert extrapolate(sc, 64).plan.dp == 64  # --target-nodes 64 starts from the file's 32 nodes


def test_hsdp_degrees_and_the_command_line(tmp_path: Path) -> None:
    assert api.load(toml(tmp_path, 8, tp=2, rep=2), hardware="h100-sxm").cluster.nodes == 4  # 2 x 8 x 2 = 32 GPUs
    assert api.load(toml(tmp_path, 8, tp=2, rep=2), hardware="h100-sxm", gpus_per_node=4).cluster.nodes == 8
    with pytest.raises(PlanError, match="dp = 8, but world 32"):  # --nodes wins, and the layout check says why
        api.load(toml(tmp_path, 8, tp=2), hardware="h100-sxm", nodes=4)


def test_a_derived_shard_degree_leaves_the_default(tmp_path: Path) -> None:
    assert api.load(toml(tmp_path, -1), hardware="h100-sxm").cluster.nodes == 1
    # 3 x 2 = 6 GPUs: not whole nodes of 8, so the default node and the layout check's own message
    with pytest.raises(PlanError, match="dp = 3"):
        api.load(toml(tmp_path, 3), hardware="h100-sxm")
