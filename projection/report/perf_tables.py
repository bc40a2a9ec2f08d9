"""The tables of `projection performance`: the `--scaling` rows (with scaling efficiency) and the `--schedule all`
comparison with the schedule it recommends (the fastest that fits)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from projection.perf.result import Projection
    from projection.specs.scenario import Scenario


def title(scenario: Scenario) -> str:
    plan = scenario.plan
    return (f"{scenario.model.name} on {scenario.cluster.device.name}: tp {plan.tp} pp {plan.pp} cp {plan.cp} "
            f"ep {plan.ep}, global batch {scenario.training.resolved_global_batch(plan.dp_())}")


def _verdict(proj: Projection) -> str:
    return proj.memory.verdict if proj.memory is not None else "not modelled"


def _scaling_row(proj: Projection) -> dict[str, Any]:
    sc = proj.scenario
    dp = sc.plan.dp_()
    return {"nodes": sc.cluster.nodes, "world_size": proj.world_size, "dp": dp, "microbatches": proj.n_microbatches,
            "step_time_s": proj.step_time_s, "tokens_per_s_per_gpu": proj.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": proj.model_tflops_per_gpu, "mfu": proj.mfu, "peak_dtype": proj.peak_dtype,
            "exposed_comm_s": proj.exposed_comm_s, "bubble_ratio": proj.sim.bubble_ratio,
            "peak_gib": proj.memory.peak_bytes / 2**30 if proj.memory is not None else None,
            "memory_verdict": _verdict(proj), "notes": list(proj.notes)}


def scaling_rows(projs: Sequence[Projection]) -> list[dict[str, Any]]:
    """The rows of `--scaling`, each with its scaling efficiency: tokens/s/GPU over the first row's."""
    rows = [_scaling_row(p) for p in projs]
    first = rows[0]["tokens_per_s_per_gpu"] if rows else 0.0
    for r in rows:
        r["scaling_efficiency"] = r["tokens_per_s_per_gpu"] / first if first else None
    return rows


def scaling_table(rows: Sequence[Projection], scenario: Scenario) -> str:
    lines = [f"scaling at fixed global batch (dp grows, microbatches per rank shrink): {title(scenario)}",
             f"{'nodes':>6} {'world':>7} {'dp':>6} {'microbatches':>12} {'step s':>10} {'tokens/s/GPU':>13} "
             f"{'TFLOP/s/GPU':>12} {'MFU':>7} {'vs peak':>7} {'scaling':>7} {'exposed comm s':>14} {'bubble':>7} "
             f"{'peak GiB':>9}  memory"]
    for r in scaling_rows(rows):
        peak = f"{r['peak_gib']:>9.2f}" if r["peak_gib"] is not None else f"{'-':>9}"
        lines.append(f"{r['nodes']:>6d} {r['world_size']:>7d} {r['dp']:>6d} {r['microbatches']:>12d} "
                     f"{r['step_time_s']:>10.4g} {r['tokens_per_s_per_gpu']:>13.1f} {r['model_tflops_per_gpu']:>12.1f} "
                     f"{r['mfu']:>7.1%} {r['peak_dtype']:>7} {r['scaling_efficiency']:>7.1%} "
                     f"{r['exposed_comm_s']:>14.4g} {r['bubble_ratio']:>7.1%} {peak}  {r['memory_verdict']}")
    # the projections' notes; one that holds at some node counts only (e.g. TorchTitan without FSDP runs in fp32)
    # explains a row that breaks the trend: printed with the counts it applies to
    for note in dict.fromkeys(n for p in rows for n in p.notes):
        at = [p.scenario.cluster.nodes for p in rows if note in p.notes]
        lines.append(f"note at {', '.join(map(str, at))} node{'s' if at != [1] else ''}: {note}"
                     if len(at) < len(rows) else f"note: {note}")
    return "\n".join(lines)


def chosen_schedule(projs: Sequence[Projection]) -> Projection | None:
    """The schedule `--schedule all` recommends: the fastest that fits in memory, else the fastest; among equally
    fast ones (within 1e-6) the one that fits rather than is at risk, then the smaller peak, then the first listed.
    Its row is marked, its trace written and its name is the JSON's `chosen`."""
    fitting = [p for p in projs if p.memory is not None and p.memory.verdict != "out of memory"]
    pool = fitting or list(projs)
    if not pool:
        return None
    fastest = min(p.step_time_s for p in pool)
    ties = [p for p in pool if p.step_time_s <= fastest * (1 + 1e-6)]
    return min(ties, key=lambda p: (p.memory is None or p.memory.verdict != "fits",
                                    p.memory.peak_bytes if p.memory is not None else 0))


def schedules_table(projs: Sequence[Projection], scenario: Scenario) -> str:
    lines = [f"schedules compared: {title(scenario)}, {projs[0].n_microbatches if projs else 0} microbatches",
             f"{'schedule':<18} {'vpp':>4} {'step s':>10} {'tokens/s/GPU':>13} {'TFLOP/s/GPU':>12} {'MFU':>7} "
             f"{'bubble':>7}  memory"]
    chosen = chosen_schedule(projs)
    fits = chosen is not None and chosen.memory is not None and chosen.memory.verdict != "out of memory"
    for p in projs:
        mark = ("  <- fastest that fits" if fits else "  <- fastest (none fits)") if p is chosen else ""
        lines.append(f"{p.schedule:<18} {p.scenario.plan.vpp_:>4} {p.step_time_s:>10.4g} "
                     f"{p.tokens_per_s_per_gpu:>13.1f} {p.model_tflops_per_gpu:>12.1f} {p.mfu:>7.1%} "
                     f"{p.sim.bubble_ratio:>7.1%}  {_verdict(p)}{mark}")
    return "\n".join(lines)
