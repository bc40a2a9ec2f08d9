"""Measured on real GPUs: the projected step time against the `iteration-time` Megatron-LM's functional tests
measured on DGX H100 (issue 6, "Must show": within 15 % median).

Expected values: shared/fixtures/megatron/CASES.md, the median of TensorBoard `iteration-time` over steps >= 3 (interval
time / iterations, on global rank world_size - 1); world sizes from the same table. Each case's model_config.yaml is
loaded with `projection.api.load` on h100-sxm with the table's nodes x GPUs and projected with the shipped default
calibration (`projection.perf.default_cost_model`). These are small models (a step of 0.05 - 1.9 s): launch and
framework overheads matter, and are whatever the performance model says they are (the device YAML's host time per
kernel times the framework host factor that benchmarks/bench_megatron_host.py measured, calibrations/README.md);
nothing is fitted to these values.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

import pytest

from projection import api
from tests.oracle.megatron_cases import cases

MEGATRON = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "megatron"
MEDIAN_LIMIT = 0.15  # issue 6

pytestmark = pytest.mark.skipif(not (MEGATRON / "CASES.md").is_file(),
                                reason="shared/fixtures/megatron absent (user clone)")



def test_cases_table_found() -> None:
    found = cases()
    assert len(found) >= 19 and all(c.iteration_s > 0 for c in found)


@pytest.mark.xfail(strict=True, reason=(
    "issue-6 threshold not met (measured 2026-12-01): median |error| 44.0 % (limit 15 %), max 67.6 % over 19 cases, "
    "every one projected too fast: gpt3_7b_tp1_pp4_memory_speed (32 x 4096, GPU-bound) -12.5 %; the 18 small models "
    "(host-bound: Megatron's A100 and GB200 golden values are 1.15-1.75x the H100's) -25 .. -68 %. Priced: the host "
    "issue per kernel (eager HF trace, 31.6 us, profiler on) times the framework host factor measured by "
    "benchmarks/bench_megatron_host.py (Megatron-Core local layer against the HF layer under the trace's profiler "
    "settings: 3.40 forward, 1.12 backward per modelled kernel; 3.38-3.62 / 1.11-1.17 run to run), host syncs, "
    "NaN/Inf checks, MoE token-count reads, DDP hooks, logging work. Not priced: Transformer Engine's own module "
    "host time beyond the local spec's (TE needs a GPU to measure), "
    "the host of the DGX itself (the trace's host is an EPYC 9654), achieved PCIe rates. "
    "Not the oracle's own spread: against the fastest stored Megatron-LM version of each golden file the median is "
    "still 38.3 % (benchmarks/functional_drift.py)"))
def test_step_time_matches_dgx_h100() -> None:
    rows = _rows()
    print(f"\n{'case':<86} {'layout':<30} {'measured s':>10} {'projected s':>11} {'error':>7}")
    for name, layout, meas, projected, err in rows:
        print(f"{name:<86} {layout:<30} {meas:>10.4f} {projected:>11.4f} {err:>+7.1%}")
    errors = [abs(r[4]) for r in rows]
    med, worst = statistics.median(errors), max(errors)
    print(f"median |error| {med:.1%} (limit {MEDIAN_LIMIT:.0%}), max |error| {worst:.1%} over {len(rows)} cases")
    assert med <= MEDIAN_LIMIT


def test_misses_no_worse() -> None:
    """The strict xfail above stays green however far the cases move; the median and the largest |error| are held to
    those it records, plus tests/oracle/test_known_misses.py's DRIFT (a regression guard, not an accuracy claim)."""
    from tests.oracle.test_known_misses import DRIFT

    errors = [abs(r[4]) for r in _rows()]
    assert statistics.median(errors) <= 0.440 + DRIFT
    assert max(errors) <= 0.676 + DRIFT


@functools.cache
def _rows() -> list[tuple[str, str, float, float, float]]:
    """(case, layout, measured s, projected s, error) of every case."""
    from projection.perf import default_cost_model, project

    rows = []
    for c in cases():
        sc = api.load(MEGATRON / c.name / "model_config.yaml", nodes=c.nodes, gpus_per_node=c.gpus_per_node,
                      hardware="h100-sxm")
        assert sc.world_size == c.nodes * c.gpus_per_node
        proj = project(sc, default_cost_model(sc))
        err = proj.step_time_s / c.iteration_s - 1.0
        plan = sc.plan
        layout = (f"tp{plan.tp} pp{plan.pp} cp{plan.cp} ep{plan.ep} dp{plan.dp_()} "
                  f"mb{sc.training.num_microbatches(plan.dp_())}")
        rows.append((c.name, layout, c.iteration_s, proj.step_time_s, err))
    return rows


def test_gpu_bound_case_within_the_limit() -> None:
    """The strict xfail above stays failing while the small host-bound cases miss; the one GPU-bound case (7B, 32
    sequences of 4096 per step; its A100/H100 golden-value ratio 2.5-2.8 follows the compute ratio) is held to the
    issue's 15 % on its own, so a regression in the GPU-side model cannot hide behind the host-bound misses."""
    from projection.perf import default_cost_model, project

    (case,) = [c for c in cases() if c.name == "gpt3_7b_tp1_pp4_memory_speed"]
    sc = api.load(MEGATRON / case.name / "model_config.yaml", nodes=case.nodes, gpus_per_node=case.gpus_per_node,
                  hardware="h100-sxm")
    err = project(sc, default_cost_model(sc)).step_time_s / case.iteration_s - 1.0
    print(f"\n{case.name}: measured {case.iteration_s:.4f} s, error {err:+.1%}")
    assert abs(err) <= MEDIAN_LIMIT
