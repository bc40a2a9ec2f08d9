"""A TorchTitan TOML that gives data_parallel_shard_degree (not -1): TorchTitan's ParallelDims asserts that the
degrees multiply to the world, and derives only a shard degree of -1. So scaling at a fixed global batch grows
replicas (HSDP) and keeps the shard group the file fixed, also at a replicate degree of 1; and a layout search keeps
each candidate on the searched cluster, refusing a layout the fixed shard degree no longer fills instead of pricing it
on more GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.errors import ConfigError
from projection.perf import extrapolate
from projection.perf.search import search_layouts

TOML = Path(__file__).resolve().parents[2] / "benchmarks" / "torchtitan_runs" / "t1_llama31_8b_fsdp8.toml"


def test_weak_scaling_grows_replicas_of_the_files_shard_group() -> None:
    sc = api.load(TOML)
    assert (sc.world_size, sc.plan.dp, sc.plan.sharding.dp_replicate) == (8, 8, 1)
    at2 = extrapolate(sc, 2)
    assert (at2.world_size, at2.plan.dp, at2.plan.sharding.dp_replicate) == (16, 16, 2)


def test_plan_candidates_stay_on_the_searched_cluster() -> None:
    sc = api.load(TOML)
    found = search_layouts(sc, tp=[1, 2], zero=[3],
                           reload=lambda over: api.load(TOML, nodes=sc.cluster.nodes, overrides=over))
    priced = [c for c in found if c.projection is not None]
    assert priced and all(c.projection.world_size == 8 for c in priced)
    tp2 = [c for c in found if c.tp == 2]
    assert tp2 and all(c.projection is None and c.problems for c in tp2)
    # a reload that sizes its own cluster from the degrees is refused by the search itself, naming the reload
    with pytest.raises(ConfigError) as err:
        search_layouts(sc, tp=[2], zero=[3], reload=lambda over: api.load(TOML, overrides=over))
    assert [(p.key, p.message.split(",")[0]) for p in err.value.problems] == [
        ("reload", "reload loaded the layout tp 2 pp 1 cp 1 with cluster.nodes 2")]


def test_a_refused_interleaved_layout_gives_its_own_reasons_only() -> None:
    """A vpp 2 layout refused on other counts (16 GPUs on 8, 12 layers over 8 stages) is judged as interleaved
    1F1B, as a layout that holds would be: no 'vpp must be 1' from the file's 1F1B, which the search would not have
    run."""
    from projection.perf.search import search_layouts as search

    example = Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_inline.yaml"
    sc = api.load(example, overrides=["model.num_layers=12"])
    found = search(sc, tp=[4], pp=[4], vpp=[2])
    assert found and all(c.projection is None for c in found)
    messages = [p.message for c in found for p in c.problems]
    assert any("cannot be split evenly" in m for m in messages) and any("not divisible" in m for m in messages)
    assert not any("vpp must be 1" in m for m in messages), messages


def test_a_layout_the_fixed_shard_degree_does_not_fill_is_refused_for_that_alone() -> None:
    """The local batch of a refused pipeline layout is sized by the data-parallel size the file fixes, so the refusal
    is the shard degree's alone, not also TorchTitan's batch rule checked against a local batch sized for another
    dp."""
    sc = api.load(TOML, hardware="h100-sxm")
    found = search_layouts(sc, tp=[1, 2], pp=[1, 2],
                           reload=lambda over: api.load(TOML, hardware="h100-sxm", nodes=sc.cluster.nodes,
                                                        overrides=over))
    refused = [c for c in found if c.projection is None and c.memory is None]
    assert len(refused) == 3
    for c in refused:
        assert [p.message.split(",")[0] for p in c.problems] == ["dp = 8"], (c.tp, c.pp, c.problems)
