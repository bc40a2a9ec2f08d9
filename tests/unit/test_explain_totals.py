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


STAGE_LINE = r"\s+stage \d+ \((\d+) layers?([^,)]*)(?:, ([\d,]+) a layer)?\): (\d+) x ([\d,]+) = ([\d,]+)$"


def _rebuilt(text: str) -> list[tuple[int, int, int]]:
    """Per rank, from the printed numbers only: (the sum of the stages' in-flight x saved lines, the printed saved
    total, the sum of the printed activations.* addends); asserts each stage line's product and per-layer split."""
    import re

    out, stages, total, addends = [], 0, 0, 0
    for line in text.splitlines() + ["pp_rank end"]:
        if line.startswith("pp_rank "):
            if total:
                out.append((stages, total, addends))
            stages = total = addends = 0
        elif m := re.match(STAGE_LINE, line):
            layers, per_layer = int(m[1]), int((m[3] or "0").replace(",", ""))
            n, each, product = int(m[4]), int(m[5].replace(",", "")), int(m[6].replace(",", ""))
            assert n * each == product, line
            assert not per_layer or per_layer * layers == each, line
            stages += product
        elif m := re.match(r"\s+= saved activations \(the activations\.\* terms\)\s+([\d,]+)$", line):
            total = int(m[1].replace(",", ""))
        elif m := re.match(r"\s+activations\.\w+\s+([\d,]+)$", line):
            addends += int(m[1].replace(",", ""))
        elif m := re.match(r"\s+weights \(params\).*P_dense=(\d+), P_expert=(\d+).* -> ([\d,]+)$", line):
            assert 2 * (int(m[1]) + int(m[2])) == int(m[3].replace(",", "")), line  # bf16 weights, in full
    return out


def test_the_saved_activations_are_rebuilt_from_the_printed_numbers() -> None:
    """--explain prints, per virtual stage, the microbatches in flight times one microbatch's saved bytes after
    recompute, which add up to the activations.* terms; an audit found only the size before recompute printed (17x
    the real one under full recompute) and parameter counts to 6 digits."""
    full = ["plan.recompute.granularity=full", "plan.recompute.method=uniform", "plan.recompute.num_layers=1"]
    block = ["plan.recompute.granularity=full", "plan.recompute.method=block", "plan.recompute.num_layers=2"]
    for over in (None, full, block, ["training.fp8.format=hybrid"]):
        report = estimate_memory(api.load(EXAMPLE, overrides=over))
        rebuilt = _rebuilt(explain(report))
        assert len(rebuilt) == len(report.ranks), over
        for r, (stages, total, addends) in zip(report.ranks, rebuilt, strict=True):
            assert stages == total == addends, (over, r.pp_rank, stages, total, addends)
            assert total == sum(v for k, v in r.terms.items() if k.startswith("activations."))
        # a block recompute keeps the first 2 layers of each chunk as inputs, the other 2 whole: no one size a
        # layer to print (a mean of the two would mislead)
        assert ("a layer)" in explain(report)) == (over is not block), over


BRIDGE = Path(__file__).resolve().parents[2] / "benchmarks" / "bridge_runs"


def _weights_add_up(report: object) -> int:
    """Ranks whose weights lines add up: the formula's value, less the fp8 linear weights' saving, plus each addend,
    equals the '= weights' total and the table's weights (an audit read 4.80e9 + 2.14e9 printed as = 4.80e9)."""
    checked = 0
    for block in explain(report).split("pp_rank ")[1:]:  # type: ignore[arg-type]
        rank = int(block.split(":", 1)[0])
        lines = block.splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("weights (params)"))
        total = int(lines[start].rsplit("-> ", 1)[1].replace(",", ""))
        for line in lines[start + 1:]:
            words = line.split()
            value = int(words[-1].replace(",", ""))
            if words[0] == "-":
                total -= value
            elif words[0] == "+":
                total += value
            else:
                assert words[:2] == ["=", "weights"] and value == total, (rank, line, total)
                break
        else:
            raise AssertionError("no '= weights' line")
        assert total == report.ranks[rank].bytes["weights"]  # type: ignore[attr-defined]
        checked += 1
    return checked


def test_fp8_param_gather_weights_add_up() -> None:
    for name, nodes in (("perf_llama3_70b_64xh100_fp8cs.yaml", 8), ("perf_llama3_8b_8xh100_fp8cs.yaml", 1),
                        ("perf_qwen3_30b_a3b_16xh100_fp8cs.yaml", 2)):
        sc = api.load(BRIDGE / name, hardware="h100-sxm", nodes=nodes)
        assert sc.training.fp8 is not None and sc.training.fp8.param_gather
        report = estimate_memory(sc)
        assert _weights_add_up(report) == len(report.ranks)


def test_the_optimizer_line_names_a_master_copy_only_where_one_is_kept() -> None:
    """FSDP2 keeps its fp32 master as the sharded parameter (the weights line, 4 B each): the optimizer line holds
    the moments only; an audit read 'optimizer (master + moments) 8*P/d' on a TorchTitan job."""
    megatron = explain(estimate_memory(api.load(EXAMPLE)))
    assert "optimizer (master + moments)   12*P_dense" in megatron
    titan = Path(__file__).resolve().parents[2] / "benchmarks" / "torchtitan_runs" / "t1_llama31_8b_fsdp8.toml"
    text = explain(estimate_memory(api.load(titan, hardware="h100-sxm")))
    assert "optimizer (moments)            8*P_dense/d_dense" in text and "(master + moments)" not in text
    assert "weights (params)               4*P_dense/d_dense" in text
