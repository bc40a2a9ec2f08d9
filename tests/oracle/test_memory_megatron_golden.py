"""Measured on real GPUs: the projected per-GPU peak allocated bytes against what Megatron-LM's functional tests
measured on DGX H100 (issue 3, "Measured on real GPUs").

Expected values: shared/fixtures/megatron/CASES.md, the median over logged steps >= 2 of TensorBoard
`mem-max-allocated-bytes` (torch.cuda.memory_stats()["allocated_bytes.all.peak"], never reset), logged by global rank
world_size - 1, the last pipeline stage; world sizes from the same table. Each case's model_config.yaml is loaded with
`projection.api.load` on h100-sxm and estimated with the default schedule in-flight timeline; the rank compared is
the pp_rank CASES.md names. The golden values are the validation set: nothing in the estimator is fitted to them.

Facts the Scenario does not carry yet are read from the same model_config.yaml and passed as a buffers.Runtime:
--transformer-impl, --moe-grouped-gemm, --defer-embedding-wgrad-compute / --wgrad-deferral-limit,
--cross-entropy-fusion-impl (MODEL_ARGS) and CUBLAS_WORKSPACE_CONFIG (ENV_VARS). One loader gap is corrected here:
Megatron accumulates and reduces gradients in fp32 only for bf16 (megatron/training/arguments.py forces
accumulate_allreduce_grads_in_fp32 for --bf16 alone), so --fp16 without --accumulate-allreduce-grads-in-fp32 keeps
fp16 main grads; the correction is a no-op once the loader applies the rule.

The printed table also shows `mem-allocated-bytes` after the step (measured, median of steps >= 2) beside the projected
model states + buffers + optimizer-step transients, to check the static terms separately from the activations.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from projection import api
from projection.memory.report import RankMemory
from projection.specs.scenario import Scenario
from tests.oracle.megatron_cases import Case, cases

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
MEGATRON = FIXTURES / "megatron"
GiB = 2**30
MEDIAN_LIMIT = 3.0  # % (issue 3)
WORST_LIMIT = 10.0  # %
AFTER_MEDIAN_LIMIT = 3.0  # % (no issue limit: a guard on the static terms, at the peak's own limits)
AFTER_WORST_LIMIT = 10.0  # %

pytestmark = pytest.mark.skipif(not (MEGATRON / "CASES.md").is_file(),
                                reason="shared/fixtures/megatron absent (user clone)")



def measured_after_step(case: str) -> float:
    values = json.loads((MEGATRON / case / "golden_values_dev_dgx_h100.json").read_text(encoding="utf-8"))
    v = values["mem-allocated-bytes"]["values"]
    return float(statistics.median(x for step, x in v.items() if int(step) >= 2))


def projected_after_step(sc: Scenario, rank: RankMemory) -> int:
    """Model states, persistent buffers and the optimizer step's own tensors, which outlive the step: Megatron's
    fp32 copies of 16-bit main grads (`main_param.grad`) are freed only by the next step's `optimizer.zero_grad()`,
    before its forward, so `mem-allocated-bytes`, read after the step, holds them (the fp16 cases)."""
    from projection.memory.buffers import optimizer_step_bytes, runtime_for
    from projection.workload.params import per_rank_params

    states = sum(rank.bytes[k] for k in ("weights", "gradients", "optimizer", "buffers"))
    rp = per_rank_params(sc.model, sc.plan)[rank.pp_rank]
    return states + sum(optimizer_step_bytes(sc, runtime_for(sc), rp).values())


def project(c: Case) -> tuple[Scenario, RankMemory]:
    from projection.memory.estimate import estimate_memory

    sc = api.load(MEGATRON / c.name / "model_config.yaml", nodes=c.nodes, gpus_per_node=c.gpus_per_node,
                  hardware="h100-sxm")
    assert sc.world_size == c.nodes * c.gpus_per_node and sc.plan.pp == c.pp
    report = estimate_memory(sc)
    (rank,) = [r for r in report.ranks if r.pp_rank == c.pp_rank]
    return sc, rank


def test_cases_table_found() -> None:
    found = cases()
    assert len(found) >= 19
    assert all(c.pp_rank == c.pp - 1 for c in found)  # world_size - 1 is always the last pipeline stage


def test_peak_allocated_matches_dgx_h100() -> None:
    rows, errors = [], []
    for c in cases():
        sc, rank = project(c)
        err = (rank.peak_bytes - c.measured) / c.measured * 100
        errors.append(err)
        b = rank.bytes
        rows.append((c.name, c.measured / GiB, rank.peak_bytes / GiB, err,
                     (b["weights"] + b["gradients"] + b["optimizer"]) / GiB, b["activations"] / GiB,
                     b["buffers"] / GiB, sum(rank.inflight.values()), measured_after_step(c.name) / GiB,
                     projected_after_step(sc, rank) / GiB))
    header = (f"{'case':<86} {'meas GiB':>9} {'proj GiB':>9} {'err %':>7} {'states':>7} {'activ':>7} {'buffers':>7} "
              f"{'infl':>4} | {'after-step meas':>15} {'proj':>7}")
    print("\n" + header)
    for r in rows:
        print(f"{r[0]:<86} {r[1]:>9.3f} {r[2]:>9.3f} {r[3]:>+7.1f} {r[4]:>7.3f} {r[5]:>7.3f} {r[6]:>7.3f} {r[7]:>4} | "
              f"{r[8]:>15.3f} {r[9]:>7.3f}")
    med = statistics.median(abs(e) for e in errors)
    worst = max(abs(e) for e in errors)
    print(f"median |error| {med:.2f} % (limit {MEDIAN_LIMIT} %), worst {worst:.2f} % (limit {WORST_LIMIT} %)")
    after = [(r[9] - r[8]) / r[8] * 100 for r in rows]
    print(f"after the step: median |error| {statistics.median(abs(e) for e in after):.2f} %, worst "
          f"{max(abs(e) for e in after):.2f} % (limits {AFTER_MEDIAN_LIMIT} / {AFTER_WORST_LIMIT} %)")
    assert med <= MEDIAN_LIMIT
    assert worst <= WORST_LIMIT
    # the static terms on their own (model states, buffers, the optimizer step's tensors), at the peak's limits;
    # measured 2026-11-30: median 1.74 %, worst -7.7 %, all at or below measured. (Before the fp32 copies of the
    # fp16 cases' main grads were counted after the step, the local-spec tp 4 fp16 case missed by -16.6 %.)
    assert statistics.median(abs(e) for e in after) <= AFTER_MEDIAN_LIMIT
    assert max(abs(e) for e in after) <= AFTER_WORST_LIMIT
