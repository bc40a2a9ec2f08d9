"""Measured gains: the ratio of two published rows that differ in one setting (torch.compile, Float8, 8 -> 128 GPUs,
async TP, the schedule, the context-parallel degree, the recompute granularity, the cluster size), against the ratio
of their projections. The two rows of a pair share the hardware, the software and the way throughput was measured, so
what both miss alike (the H100 rows' 500 W HBM2e part projected as the 700 W SXM, a calibration's bias) cancels, and
the ratio checks what the projection says the one setting is worth: the comparisons `--schedule all`, `--scaling` and
`projection plan` rank layouts by. Each ratio is held to RATIO_LIMIT; one beyond it is a strict xfail with its numbers.
Validation only: nothing is fitted to them. The rows, their sources and setups are the benchmarks' (accuracy.py for
Korthikanti 2022 and NeMo 24.07, accuracy_torchtitan.py for TorchTitan's docs/performance.md); this runs without
../shared."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.oracle.bench_modules import load_benchmark

# Half issue 6's per-case 20 %: a ratio carries only the modelling of the one setting its rows differ in
RATIO_LIMIT = 0.10

_TT = "accuracy_torchtitan"
_PUB = "accuracy"
_CP = ("; with 32k tokens per GPU in every row the published throughput falls with cp faster than the projected: "
       "ring attention's exchanges are priced hidden behind each attention chunk (workload/ops_attention.py), and "
       "TorchTitan's context_parallel_rotate_method of the period is not read (accuracy_torchtitan.py)")

# (benchmark, numerator row, denominator row, what differs, strict-xfail reason or None), measured 2026-12-02
PAIRS: list[tuple[str, str, str, str, str | None]] = [
    (_TT, "T1 8B fsdp8 compile", "T1 8B fsdp8", "torch.compile, 8 GPUs", None),  # 1.157 vs 1.185: +2.4 %
    (_TT, "T1 8B fsdp8 compile fp8", "T1 8B fsdp8 compile", "Float8, 8 GPUs", None),  # 1.280 vs 1.304: +1.9 %
    (_TT, "T3 8B fsdp128 compile", "T3 8B fsdp128", "torch.compile, 128 GPUs", None),  # 1.162 vs 1.187: +2.2 %
    (_TT, "T3 8B fsdp128 compile fp8", "T3 8B fsdp128 compile", "Float8, 128 GPUs", None),  # 1.286 vs 1.309
    (_TT, "T3 8B fsdp128", "T1 8B fsdp8", "FSDP over 128 GPUs instead of 8", None),  # 0.973 vs 1.012: +4.0 %
    (_TT, "T3 8B fsdp128 compile", "T1 8B fsdp8 compile", "128 GPUs, compiled", None),  # 0.977 vs 1.014: +3.8 %
    (_TT, "T3 8B fsdp128 compile fp8", "T1 8B fsdp8 compile fp8", "128 GPUs, Float8", None),  # 0.982 vs 1.018
    (_TT, "T4 70B fsdp32 tp8 asyncTP", "T4 70B fsdp32 tp8", "async TP",
     "published 1.057, projected 1.216: +15.0 %; async TP's micro-pipelined matmuls are priced as tp GEMMs of "
     "1/tp of the tokens each, pipelined with their collective's pieces (perf/tp_overlap.py), and in the h100 fp8 "
     "table those pieces (16k token rows) run faster than the whole 131k-row GEMM; which matmuls the 2024 inductor "
     "pass micro-pipelined is not read"),
    (_TT, "T5 405B 3D interleaved", "T5 405B 3D 1F1B", "Interleaved 1F1B (16 x 2 sequences) over 1F1B (8 x 4)",
     "published 1.280, projected 1.437: +12.3 %; the microbatch counts are TorchTitan's defaults of the period, "
     "assumed (accuracy_torchtitan.py)"),
    (_TT, "T2 8B fsdp4 cp2 64k", "T2 8B fsdp8 cp1 32k", "cp 2 at twice the sequence", None),  # 0.653 vs 0.610: -6.6 %
    (_TT, "T2 8B fsdp2 cp4 128k", "T2 8B fsdp8 cp1 32k", "cp 4 at 4x the sequence",
     "published 0.275, projected 0.346: +25.7 %" + _CP),
    (_TT, "T2 8B fsdp1 cp8 256k", "T2 8B fsdp8 cp1 32k", "cp 8 at 8x the sequence",
     "published 0.141, projected 0.185: +31.6 %" + _CP),
    (_TT, "T6 405B 4D fsdp4 cp2 64k", "T6 405B 4D fsdp8 cp1 32k", "cp 2 at twice the sequence, 405B",
     "published 0.618, projected 0.698: +12.9 %" + _CP),
    (_TT, "T6 405B 4D fsdp2 cp4 128k", "T6 405B 4D fsdp8 cp1 32k", "cp 4 at 4x the sequence, 405B",
     "published 0.408, projected 0.450: +10.3 % (+9.8 % before TP-overlapped GEMMs were priced split, which slows the "
     "GEMM-heavier 32k row more)" + _CP),
    (_TT, "T6 405B 4D fsdp1 cp8 256k", "T6 405B 4D fsdp8 cp1 32k", "cp 8 at 8x the sequence, 405B",
     "published 0.211, projected 0.244: +15.9 %" + _CP),
    (_TT, "A 8B fsdp64 sel op", "A 8B fsdp64 sel layer", "per-op over every-other-layer checkpointing", None),
    (_PUB, "22B sel", "22B full", "selective recompute + SP over full recompute, 22B", None),  # 1.291 vs 1.401: +8.6 %
    (_PUB, "175B sel", "175B full", "selective recompute + SP, 175B", None),  # 1.319 vs 1.402: +6.3 %
    (_PUB, "530B sel", "530B full", "selective recompute + SP, 530B", None),  # 1.297 vs 1.354: +4.4 %
    (_PUB, "1T sel", "1T full", "selective recompute + SP, 1T", None),  # 1.321 vs 1.337: +1.2 %
    (_PUB, "GPT3-175B 512g", "GPT3-175B 128g", "512 GPUs at GBS 2048, MBS 2 over 128 at 256, MBS 1", None),  # +0.7 %
]


def _named(names: list[str], label: str) -> list[str]:
    """The row a pair names: the one of that name, else those it begins (accuracy.py's names go on with the layout)."""
    return [label] if label in names else [n for n in names if n.startswith(label + " ")]


@functools.cache
def _rows(stem: str) -> dict[str, Any]:
    """Every row of the benchmark's cases used by a pair, projected as the benchmark projects them, by name."""
    mod = load_benchmark(stem)
    names = [c.name for c in mod.cases()]
    wanted = {n for s, a, b, _, _ in PAIRS if s == stem for label in (a, b) for n in _named(names, label)}
    cases = [c for c in mod.cases() if c.name in wanted]
    return {c.name: row for c, row in zip(cases, mod.evaluate(cases), strict=True)}


def _row(stem: str, label: str) -> Any:
    rows = _rows(stem)
    (name,) = _named(list(rows), label)
    return rows[name]


def _params() -> list[object]:
    return [pytest.param(stem, a, b, what, id=f"{a} over {b}".replace(" ", "-"), marks=() if reason is None else
                         pytest.mark.xfail(strict=True, reason=f"measured 2026-12-02: {a} / {b}: {reason}"))
            for stem, a, b, what, reason in PAIRS]


def test_every_pair_names_two_rows_of_its_benchmark() -> None:
    for stem, a, b, _, _ in PAIRS:
        for label in (a, b):
            assert len(_named([c.name for c in load_benchmark(stem).cases()], label)) == 1, label


@pytest.mark.parametrize(("stem", "numerator", "denominator", "what"), _params())
def test_measured_gain(stem: str, numerator: str, denominator: str, what: str) -> None:
    top, bottom = _row(stem, numerator), _row(stem, denominator)
    measured = top.case.measured / bottom.case.measured
    projected = top.projected / bottom.projected
    print(f"\n{what}: {numerator} / {denominator}: published {measured:.3f}, projected {projected:.3f} "
          f"({projected / measured - 1:+.1%})")
    assert abs(projected / measured - 1) <= RATIO_LIMIT
