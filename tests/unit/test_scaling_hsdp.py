"""Weak scaling of an HSDP job (projection/perf/scaling.py): TorchTitan derives only a shard degree of -1 from the
world size (ParallelDims asserts replicate x shard x cp x tp x pp = world), so a TOML that gives the shard degree
scales by replicas, and one that leaves it at -1 by the shard group. Oracle: the same job written for the target
node count and loaded there directly."""

from __future__ import annotations

from pathlib import Path

from projection import api
from projection.api import estimate_memory
from projection.perf import extrapolate, project

TOML = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = {local}
seq_len = 8192
[parallelism]
data_parallel_replicate_degree = {rep}
data_parallel_shard_degree = {shard}
"""


def load(tmp: Path, name: str, nodes: int, rep: int, shard: int, local: int) -> object:
    path = tmp / f"{name}.toml"
    path.write_text(TOML.format(rep=rep, shard=shard, local=local), encoding="utf-8")
    return api.load(path, hardware="h100-sxm", nodes=nodes)


def test_a_given_shard_degree_scales_by_replicas(tmp_path: Path) -> None:
    """2 replicas x 8 shards on 2 nodes, scaled to 8 nodes at the same global batch (128 sequences): 8 replicas x 8
    shards, as the same job written for 8 nodes (local batch 2) loads."""
    scaled = extrapolate(load(tmp_path, "start", 2, 2, 8, 8), 8)
    direct = load(tmp_path, "direct", 8, 8, 8, 2)
    assert (scaled.plan.dp, scaled.plan.sharding.dp_replicate) == (64, 8)
    assert scaled.plan == direct.plan
    # the same training but for the global batch, which the scaled job states and the direct one derives
    assert scaled.training.resolved_global_batch(64) == direct.training.resolved_global_batch(64) == 128
    assert scaled.training.model_copy(update={"global_batch_size": None}) == direct.training
    assert estimate_memory(scaled).reserved_bytes == estimate_memory(direct).reserved_bytes
    assert project(scaled).step_time_s == project(direct).step_time_s


def test_a_derived_shard_degree_grows_the_shard_group(tmp_path: Path) -> None:
    """The same with data_parallel_shard_degree = -1: 2 replicas x 32 shards at 8 nodes, as TorchTitan derives it."""
    scaled = extrapolate(load(tmp_path, "start", 2, 2, -1, 8), 8)
    direct = load(tmp_path, "direct", 8, 2, -1, 2)
    assert (scaled.plan.dp, scaled.plan.sharding.dp_replicate) == (64, 2)
    assert scaled.plan == direct.plan
    assert project(scaled).step_time_s == project(direct).step_time_s


def test_the_plan_line_names_replicas_and_shards(tmp_path: Path) -> None:
    proj = project(extrapolate(load(tmp_path, "start", 2, 2, 8, 8), 8))
    assert "dp 64 (8 replicas x 8 shards)" in proj.to_table()
