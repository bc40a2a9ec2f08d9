"""`projection memory --explain` accounts for every category the table prints: the states by their formulas, and
activations (after recompute, times the microbatches in flight, with the moment's working set), buffers and the
optimizer step's transient buffers ("other") by their named addends, each closed by the table's total."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from projection import api
from projection.memory.buffers import runtime_for
from projection.memory.estimate import estimate_memory
from projection.memory.explain import explain
from projection.specs.training import OptimizerSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"


def _closed(report: object) -> set[str]:
    """The categories whose addends add up to their printed total on every rank; checks each '= total' line."""
    lines = explain(report).splitlines()  # type: ignore[arg-type]
    closed: set[str] = set()
    rank = -1
    addends: list[int] = []
    for line in lines:
        words = line.split()
        if line.startswith("pp_rank "):
            rank, addends = int(words[1].rstrip(":")), []
        elif len(words) == 2 and "." in words[0] and words[1].replace(",", "").isdigit():
            addends.append(int(words[1].replace(",", "")))
        elif words[:1] == ["="] and len(words) == 3:
            total = int(words[2].replace(",", ""))
            assert total == report.ranks[rank].bytes[words[1]], (rank, words)  # type: ignore[attr-defined]
            assert abs(sum(addends) - total) <= len(addends), (rank, words[1], addends, total)  # rounding
            closed.add(words[1])
            addends = []
    return closed


def test_activations_and_buffers_add_up() -> None:
    assert {"activations", "buffers"} <= _closed(estimate_memory(api.load(EXAMPLE)))


def test_the_optimizer_steps_buffers_are_listed_where_they_are_the_peak() -> None:
    sc = api.load(EXAMPLE, overrides=["plan.pp=1", "plan.vpp=1", "plan.tp=8", "plan.sharding.zero_stage=0",
                                      "plan.overlap.param_gather=false", "plan.recompute.granularity=full",
                                      "plan.recompute.method=uniform", "plan.recompute.num_layers=1"])
    sc = sc.model_copy(update={"training": sc.training.model_copy(update={
        "optimizer": OptimizerSpec(main_grads_dtype="bf16")})})
    report = estimate_memory(sc, runtime=replace(runtime_for(sc), megatron=True))
    assert report.ranks[0].bytes["other"] > 0 and "other" in _closed(report)
