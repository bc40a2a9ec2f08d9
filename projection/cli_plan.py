"""`projection plan`: search the parallel layouts of the config's cluster and global batch (perf/search.py), memory
first, then step time, and print the fastest that fit, the out-of-memory ones and why the others are refused.

    projection plan --config F [--nodes N] [--hardware NAME] [--gpus-per-node G] [--set KEY=VALUE ...]
                    [--tp 1,2,4,8] [--pp 1,2,4] [--vpp 1,2] [--cp 1,2] [--ep 1,8] [--mbs 1,2]
                    [--recompute none,selective,full] [--zero 0,1,2,3]
                    [--top K] [--format table|json] [--primus-root DIR]

A list not given keeps the config's own value. Wiring (cli.py): `add_parser(subparsers)`, `run(args, env)`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from projection.cli_args import add_scenario_args, count_problems, load_scenario, name_items, whole_numbers
from projection.errors import COMMAND_LINE, ConfigError, PlanError, Problem, ProjectionError

NUMERIC = ("tp", "pp", "vpp", "cp", "ep", "mbs")  # positive whole numbers, one --flag each
PROGRESS_AFTER_S, PROGRESS_EVERY_S = 2.0, 0.5  # a search's progress on a terminal: after 2 s, twice a second
AXES = (*NUMERIC, "zero")  # zero: ZeRO stages 0-3, its own help


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "plan", help="search tp / pp / vpp / cp / ep / micro batch / recompute / ZeRO layouts: the fastest that fit",
        description="Every layout of the given values on the config's cluster and global batch: memory first (the "
        "layouts that do not fit are not projected), then step time; refused layouts with every reason.")
    add_scenario_args(p)
    for axis in NUMERIC:
        p.add_argument(f"--{axis}", metavar="N,N,...", help=f"{axis} values to try (default: the config's)")
    p.add_argument("--zero", metavar="Z,Z,...", help="ZeRO stages to try, of 0 (plain data parallelism), 1 (the "
                   "distributed optimizer), 2 (gradients sharded too), 3 (FSDP: the config's implementation, "
                   "Megatron-FSDP where the job runs it, else PyTorch FSDP2); default: the config's")
    p.add_argument("--recompute", metavar="G,G,...", help="recompute granularities to try, of none, selective "
                   "(the config's modules, else the framework's default: Megatron core_attn, TorchTitan its "
                   "selective_ac_option), full (the config's method, else every layer); default: the config's")
    p.add_argument("--top", type=int, default=10, help="fitting layouts to list (default 10)")
    return p


def _values(args: argparse.Namespace) -> tuple[dict[str, list[Any] | None], list[Problem]]:
    from projection.perf.search import RECOMPUTE

    out: dict[str, list[Any] | None] = {}
    problems = []
    for axis in AXES:
        text = getattr(args, axis)
        if text is None:
            out[axis] = None
            continue
        values, bad = whole_numbers(text, f"--{axis}", f"{axis} values", allow_zero=axis == "zero")
        if axis == "zero" and not bad and any(v > 3 for v in values):
            bad = [Problem(f"cannot read ZeRO stages {text!r}: stages are 0, 1, 2 and 3", key="--zero",
                           file=COMMAND_LINE, fix="give a comma list of 0, 1, 2, 3")]
        out[axis] = values or None
        problems += bad
    out["recompute"] = None
    if args.recompute is not None:  # as whole_numbers: every item named, none empty, each once in RECOMPUTE's order
        items = args.recompute.replace(" ", "").split(",")
        wrong = [x for x in items if x not in RECOMPUTE]
        if wrong:
            problems.append(Problem(f"cannot read recompute granularities {args.recompute!r}: {name_items(wrong)} "
                                    f"not one of {', '.join(RECOMPUTE)}",
                                    key="--recompute", file=COMMAND_LINE,
                                    fix=f"give a comma list of {', '.join(RECOMPUTE)}"))
        else:
            out["recompute"] = [g for g in RECOMPUTE if g in items]
    if args.top < 1:
        problems.append(Problem(f"must be a positive whole number (got {args.top})", key="--top", file=COMMAND_LINE,
                                fix="give a whole number of at least 1"))
    return out, problems


_CANONICAL = {"tp": "plan.tp", "pp": "plan.pp", "vpp": "plan.vpp", "cp": "plan.cp", "ep": "plan.ep",
              "mbs": "training.micro_batch_size"}


def _searched_base(args: argparse.Namespace, env: Mapping[str, str] | None,
                   values: Mapping[str, list[Any] | None]) -> tuple[Any, dict[str, Any]]:
    """The scenario with the searched axes set to the first of their combinations under which the file loads (its
    own layout, e.g. tp 3 on 8 GPUs, fails on this cluster, but every value it holds for a searched axis is
    replaced by the search anyway), and the keys that set them; (None, {}) when none loads, or no layout axis is
    searched. At most 64 combinations are tried. A framework file (Primus, TorchTitan: perf/search_reload.py) is
    loaded again with the framework's own keys for that layout (`layout_overrides(every=True)`): projection's keys
    (plan.tp) apply after the framework's rules, which would then be checked against the file's values (Primus's
    zero-bubble schedule and its refusals from pp, the DeepEP dispatcher from tp), not the layout shown. Where the
    framework refuses every such reload, the first layout that loaded with projection's keys is the base, so each
    candidate is refused with the framework's own reasons."""
    from projection.perf.search_reload import layout_overrides, needs_reload

    axes = [a for a in _CANONICAL if values.get(a)]
    if not axes:
        return None, {}
    fallback: tuple[Any, dict[str, Any]] = (None, {})
    for combo in itertools.islice(itertools.product(*(values[a] or () for a in axes)), 64):
        extra = {_CANONICAL[a]: v for a, v in zip(axes, combo, strict=True)}
        try:
            scenario = load_scenario(args, env, extra=extra)
            if not needs_reload(scenario):
                return scenario, extra
            plan, picked = scenario.plan, dict(zip(axes, combo, strict=True))
            keys = layout_overrides(scenario, picked.get("tp", plan.tp), picked.get("pp", plan.pp), picked.get("vpp"),
                                    picked.get("cp", plan.cp), picked.get("ep", plan.ep), picked.get("mbs"),
                                    plan.recompute, every=True)
            if isinstance(keys, list):  # the framework cannot take this layout: try the next
                continue
            if fallback[0] is None:
                fallback = (scenario, keys)
            return load_scenario(args, env, extra=keys), keys
        except ProjectionError:
            continue
    # the framework refuses every searched layout (e.g. zero bubble without gradient-accumulation fusion): search
    # anyway, so each candidate, reloaded with the framework's keys, is refused with the framework's own reasons
    return fallback


def _reload_keys(base_extra: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """A candidate's keys when the search started from a searched base (`_searched_base`): the framework keys of
    what the candidate changes (perf/search_reload.layout_overrides, relative to the base) over the base's own
    framework keys, so every axis, shared with the base or not, reaches the framework's rules (without the base's
    keys the reload would fall back to the file's own values, which do not hold on this cluster). Only a framework
    file reloads, and its base's keys are the framework's (`_searched_base`)."""
    return {**base_extra, **over}


def _base_layout_note(args: argparse.Namespace, problems: list[Problem]) -> list[Problem]:
    """Why a layout the search would replace stops it: the search starts from the file's own scenario (its model,
    batch and framework rules), so that must hold on the cluster first."""
    searched = [f"--{a}" for a in ("tp", "pp", "cp", "vpp", "ep", "mbs") if getattr(args, a, None)]
    if not searched or not any("not divisible" in p.message for p in problems):
        return []
    return [Problem(f"plan searches from the file's own layout, which must hold on this cluster before "
                    f"{', '.join(searched)} replace it", key="--config", file=COMMAND_LINE,
                    fix="set the file's own sizes to one of the searched layouts with --set (e.g. --set "
                        "plan.tp=4, or the file's own key: tensor_model_parallel_size=4 in Megatron or Primus, "
                        "model.tensor_model_parallel_size=4 in Megatron-Bridge, parallelism.tensor_parallel_degree=4 "
                        "in TorchTitan), or give --nodes for which they divide")]


class Progress:
    """`plan: 120 / 2,592 layouts` on a terminal's stderr while a search runs past PROGRESS_AFTER_S, redrawn at most
    every PROGRESS_EVERY_S and cleared at the end; nothing where stderr is not a terminal (a log, a pipe, a test)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.t0, self.shown_s = stream, time.monotonic(), 0.0
        self.on = bool(getattr(stream, "isatty", lambda: False)())

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.on and now - self.t0 >= PROGRESS_AFTER_S and now - self.shown_s >= PROGRESS_EVERY_S:
            self.stream.write(f"\rplan: {done:,} / {total:,} layouts")
            self.stream.flush()
            self.shown_s = now

    def close(self) -> None:
        if self.shown_s:
            self.stream.write("\r\033[K")  # the line erased, so the table or the error starts clean
            self.stream.flush()


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    from projection.perf.search import search_layouts

    shown_progress = Progress(sys.stderr)
    try:
        values, problems = _values(args)
        problems += count_problems(args, ("nodes", "gpus_per_node"))
        if problems:
            raise ConfigError(problems)
        base_extra: dict[str, Any] = {}
        try:
            scenario = load_scenario(args, env)
        except PlanError as err:  # the file's own layout fails here: start from a searched one that holds
            base, base_extra = _searched_base(args, env, values)
            if base is None:
                raise ConfigError([*err.problems, *_base_layout_note(args, err.problems)]) from None
            scenario = base
        except ProjectionError as err:
            raise ConfigError([*err.problems, *_base_layout_note(args, err.problems)]) from None
        found = search_layouts(scenario, tp=values["tp"], pp=values["pp"], vpp=values["vpp"], cp=values["cp"],
                               ep=values["ep"], micro_batch_size=values["mbs"], recompute=values["recompute"],
                               zero=values["zero"], progress=shown_progress.update,
                               # each candidate on the cluster searched (a TorchTitan TOML that fixes its degrees
                               # would otherwise be loaded on as many GPUs as its degrees multiply to)
                               reload=lambda over: load_scenario(args, env, nodes=scenario.cluster.nodes,
                                                                 extra=_reload_keys(base_extra, over)))
    except ProjectionError as err:
        print(f"error: {err.render()}", file=sys.stderr)
        return 2
    finally:
        shown_progress.close()
    fits = [c for c in found if c.projection is not None]  # status "fits" or "at risk", fastest first
    # --top K: the K fastest projected layouts, whatever the format (README "projection plan"); the out-of-memory and
    # refused ones are all listed, in the table and in JSON alike
    shown = fits[:args.top] + [c for c in found if c.projection is None]
    if args.format == "json":
        print(json.dumps({"world_size": scenario.world_size, "candidates": [_row(c) for c in shown]}, indent=2))
        return 0
    at_risk = sum(c.status == "at risk" for c in fits)
    print(f"layouts of {scenario.model.name} on {scenario.world_size} x {scenario.cluster.device.name}, global batch "
          f"{scenario.training.resolved_global_batch(scenario.plan.dp_())}: {len(fits)} fit"
          f"{f' ({at_risk} at risk)' if at_risk else ''}, "
          f"{sum(c.status == 'out of memory' for c in found)} out of memory, "
          f"{sum(c.status == 'refused' for c in found)} refused")
    print(f"{'tp':>3} {'pp':>3} {'vpp':>3} {'cp':>3} {'ep':>3} {'mbs':>3} {'dp':>4} {'recompute':<9} {'zero':>4} "
          f"{'schedule':<17} "
          f"{'step s':>9} {'tokens/s/GPU':>13} {'MFU':>6} {'vs':>4} {'peak GiB':>9}")
    for c in (c for c in shown if c.status != "refused"):
        r = _row(c)
        step = f"{r['step_time_s']:>9.4g} {r['tokens_per_s_per_gpu']:>13.1f} {r['mfu']:>6.1%} {r['peak_dtype']:>4}" \
            if c.projection else f"{'-':>9} {'-':>13} {'-':>6} {'-':>4}"
        print(f"{c.tp:>3} {c.pp:>3} {c.vpp:>3} {c.cp:>3} {c.ep:>3} {c.micro_batch_size:>3} {r['dp']:>4} "
              f"{c.recompute:<9} {c.zero:>4} {r['schedule']:<17} {step} {r['peak_gib']:>9.2f}"
              + (f"  {r['memory_verdict']}" if r['memory_verdict'] != "fits" else ""))
    for c in (c for c in shown if c.status == "refused"):
        print(f"refused tp {c.tp} pp {c.pp} vpp {c.vpp} cp {c.cp} ep {c.ep} mbs {c.micro_batch_size} "
              f"recompute {c.recompute} zero {c.zero}: "
              + "; ".join(p.message + (f" (fix: {p.fix})" if p.fix else "") for p in c.problems))
    return 0


def _row(c: Any) -> dict[str, Any]:
    sc, p, m = c.scenario, c.projection, c.memory
    return {"tp": c.tp, "pp": c.pp, "vpp": c.vpp, "cp": c.cp, "ep": c.ep, "micro_batch_size": c.micro_batch_size,
            "recompute": c.recompute, "zero": c.zero,
            "recompute_spec": sc.plan.recompute.model_dump(mode="json") if sc is not None else None,
            "status": c.status, "dp": sc.plan.dp_() if sc is not None else None,
            "schedule": sc.plan.schedule if sc is not None else None,
            "step_time_s": p.step_time_s if p else None, "tokens_per_s_per_gpu": p.tokens_per_s_per_gpu if p else None,
            "mfu": p.mfu if p else None, "peak_dtype": p.peak_dtype if p else None,
            "peak_gib": m.peak_bytes / 2**30 if m else None, "reserved_gib": m.reserved_bytes / 2**30 if m else None,
            "memory_verdict": m.verdict if m else None,
            "problems": [pr.message for pr in c.problems]}
