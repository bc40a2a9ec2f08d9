"""What the memory estimate prices as something else says so (MemoryReport.notes). A TorchTitan job without FSDP
under TP or PP runs in fp32; with float8 converters projection prices it with bf16
mixed precision (fp8 is modelled over bf16 or fp16 params). `performance` said so; an audit found `memory` printing
the same bf16 figures without a word. Both now carry one note, in the table and in the JSON; a job that does run
mixed precision carries none."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection import api
from projection.memory.estimate import estimate_memory
from projection.perf import project
from projection.specs.validate import FP8_WITHOUT_AMP

TOML = Path(__file__).resolve().parents[2].parent / "shared/fixtures/torchtitan/llama3_405b.toml"


def test_memory_and_performance_say_what_they_price() -> None:
    if not TOML.is_file():
        pytest.skip("shared/fixtures/torchtitan absent (user clone)")
    sc = api.load(TOML)
    assert sc.training.fp8 is not None and sc.plan.sharding.zero_stage == 0 and sc.plan.tp * sc.plan.pp > 1
    report = estimate_memory(sc)
    assert report.notes == (FP8_WITHOUT_AMP,) and report.to_dict()["notes"] == [FP8_WITHOUT_AMP]
    assert f"note: {FP8_WITHOUT_AMP}" in report.to_table()
    assert FP8_WITHOUT_AMP in project(sc).notes
    fsdp = api.load(TOML, nodes=4)  # dp_shard 4: FSDP's mixed precision, as priced
    assert fsdp.plan.sharding.zero_stage == 3 and estimate_memory(fsdp).notes == ()
    assert FP8_WITHOUT_AMP not in project(fsdp).notes


def test_a_split_backward_schedule_says_its_deferred_weight_gradients_are_not_counted() -> None:
    """The memory estimate counts microbatches in flight until their input-gradient pass; what a zero-bubble
    schedule keeps until the deferred weight-gradient pass is not counted. The report says so, for the split
    schedules only (Primus's own projection refuses recompute with them for this reason, primus-projection.md
    §4.7), and the performance projection's memory verdict carries the same note."""
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"
    for schedule, split in (("1f1b", False), ("zb_h1", True), ("zb_h2", True)):
        sc = api.load(example, overrides={"plan.schedule": schedule, "plan.vpp": 1})
        notes = [n for n in estimate_memory(sc).notes if "weight-gradient pass" in n]
        assert bool(notes) == split, schedule
        assert [n for n in project(sc).notes if "weight-gradient pass" in n] == notes



def test_oversubscription_on_rails_says_where_it_applies() -> None:
    """An audit set oversubscription 2 on the default rail-optimised fabric at 1024 nodes: nothing moved and nothing
    was said. The projection now says which traffic it slows there; on a fat tree, where it slows every inter-node
    byte, and at 1, it says nothing."""
    example = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"
    for topology, over, said in (("rail_optimized", 2, True), ("rail_optimized", 1, False), ("fat_tree", 2, False)):
        sc = api.load(example, overrides={"cluster.oversubscription": over, "cluster.inter_node_topology": topology})
        assert any("slows only traffic between rails" in n for n in project(sc).notes) == said
