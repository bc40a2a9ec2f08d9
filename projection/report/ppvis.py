"""Primus pp_vis JSON: export a simulation for Primus's viewer, and import Primus's measured pp_data dumps.

Format (primus-projection.md §3; Primus tools/visualization/pp_vis):
  simulator dump  <dir>/<schedule>/config.json = {pp_size, vpp_size, micro_batches};
                  pp_rank_<i>.json = {"0": {total, memory, fwd_start, fwd_end, fwd_minibatch, fwd_chunk, bwd_...,
                  wgrad_..., activation_memory_usage}}; times in ms from the step start, memory in GB.
  training dump   config.json = {world_size, dp_size, tp_size, ep_size, pp_size, vp_size, num_mbs, train_iters};
                  pp_rank_<p>.json = {"<iter 1..N>": {total, memory, fwd_start[], fwd_end[], bwd_start[], bwd_end[],
                  [wgrad_*], [fwd_minibatch, fwd_chunk, bwd_minibatch, bwd_chunk]}}, ms relative to the iteration
                  start. Dumps without the minibatch/chunk lists are in Megatron's execution order, which the
                  importer rebuilds (1F1B: microbatches in order; interleaved: Megatron's schedule table, group pp).
`chunk` is the index of a virtual stage among its rank's stages; a full backward B goes to the bwd lists, I to bwd
and W to wgrad (the viewer's convention). The bubble ratio is the viewer's: (iteration - sum F, B, W) / iteration.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from projection.errors import ConfigError, Problem
from projection.fileio import atomic_write_text
from projection.schedule.interleaved import schedule_table
from projection.sim.costs import StageCosts
from projection.sim.result import SimResult

_LIST = {"F": "fwd", "B": "bwd", "I": "bwd", "W": "wgrad"}


def pp_vis_dump(result: SimResult, activation_gb: float | Sequence[float] = 0.0) -> dict[str, Any]:
    """{"config.json": ..., "pp_rank_<i>.json": ...} for one simulation. `activation_gb` (per virtual stage or
    one number) drives memory: F adds it, B frees it, I and W free half each (Primus's simulator convention)."""
    sched = result.schedule
    act = [float(activation_gb)] * sched.n_stages if isinstance(activation_gb, int | float) else list(activation_gb)
    vpp = max(len(sched.stages_of(r)) for r in range(sched.n_ranks))
    files: dict[str, Any] = {"config.json": {"pp_size": sched.n_ranks, "vpp_size": vpp,
                                             "micro_batches": sched.n_microbatches}}
    for r, entries in enumerate(result.timeline):
        chunk_of = {s: k for k, s in enumerate(sorted(sched.stages_of(r)))}
        d: dict[str, Any] = {f"{p}_{f}": [] for p in ("fwd", "bwd", "wgrad")
                             for f in ("start", "end", "minibatch", "chunk")}
        mem, peak, usage = 0.0, 0.0, []
        # Megatron's combined 1F1B: a steady forward's activations count with the backward it runs with
        # (schedule/inflight.py), so the forward adds nothing and that backward adds what it frees
        steady_from = sched.warmup[r] if sched.combined and sched.warmup else None
        forwards, deferred = 0, 0.0
        for e in entries:
            if e.stream != "compute" or e.action is None:
                continue
            a = e.action
            p = _LIST[a.kind]
            d[f"{p}_start"].append(e.start_s * 1e3)
            d[f"{p}_end"].append(e.end_s * 1e3)
            d[f"{p}_minibatch"].append(a.microbatch)
            d[f"{p}_chunk"].append(chunk_of[a.stage])
            delta = {"F": 1.0, "B": -1.0, "I": -0.5, "W": -0.5}[a.kind] * act[a.stage]
            if a.kind == "F":
                forwards += 1
                if steady_from is not None and forwards > steady_from:
                    delta, deferred = 0.0, delta
            elif a.kind == "B" and deferred:
                delta, deferred = delta + deferred, 0.0
            mem += delta
            peak = max(peak, mem)
            usage.append(mem)
        files[f"pp_rank_{r}.json"] = {"0": {"total": result.step_time_s * 1e3, "memory": peak, **d,
                                            "activation_memory_usage": usage}}
    return files


def pp_vis_files(result: SimResult, out_dir: str | Path, name: str | None = None) -> list[Path]:
    """The files write_pp_vis writes for `result`: config.json and one pp_rank_<i>.json per pipeline rank."""
    target = Path(out_dir) / (name or result.schedule.name)
    return [target / "config.json", *(target / f"pp_rank_{r}.json" for r in range(len(result.timeline)))]


def write_pp_vis(result: SimResult, out_dir: str | Path, name: str | None = None,
                 activation_gb: float | Sequence[float] = 0.0) -> Path:
    """Write <out_dir>/<name or schedule name>/config.json and pp_rank_<i>.json; returns that directory."""
    target = Path(out_dir) / (name or result.schedule.name)
    target.mkdir(parents=True, exist_ok=True)
    for fname, content in pp_vis_dump(result, activation_gb).items():
        atomic_write_text(target / fname, json.dumps(content))
    return target


@dataclass(frozen=True, slots=True)
class MeasuredAction:
    """One measured pass on one rank: kind F, B or W, chunk (index among the rank's stages), seconds."""

    kind: str
    chunk: int
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class MeasuredIteration:
    iteration: int
    total_s: tuple[float, ...]  # per rank, as dumped
    ranks: tuple[tuple[MeasuredAction, ...], ...]  # per rank, sorted by start

    @property
    def step_time_s(self) -> float:
        """The iteration's time: the longest rank total."""
        return max(self.total_s)

    @property
    def bubble_ratio(self) -> float:
        """Mean over ranks of (iteration - busy) / iteration (the viewer's definition)."""
        step = self.step_time_s
        busy = [sum(a.end_s - a.start_s for a in acts) for acts in self.ranks]
        return statistics.fmean((step - b) / step for b in busy)


@dataclass(frozen=True)
class MeasuredPipeline:
    """A Primus pp_data dump: pp, vpp, microbatches and the measured iterations (seconds)."""

    source: str
    pp: int
    vpp: int
    n_microbatches: int
    iterations: tuple[MeasuredIteration, ...]

    def steady(self, skip: int = 1) -> tuple[MeasuredIteration, ...]:
        """Iterations after the first `skip` (warm-up: allocator, autotuning, first NCCL calls)."""
        if skip >= len(self.iterations):
            raise ConfigError(Problem(f"{self.source} holds {len(self.iterations)} iterations; cannot skip {skip}",
                                      key="skip", fix="skip fewer iterations"))
        return self.iterations[skip:]

    def select(self, iterations: Sequence[int]) -> MeasuredPipeline:
        """The same dump restricted to the given iteration numbers (as dumped, 1-based)."""
        keep = set(iterations)
        return MeasuredPipeline(self.source, self.pp, self.vpp, self.n_microbatches,
                                tuple(it for it in self.iterations if it.iteration in keep))

    def step_time_s(self, skip: int = 1) -> float:
        return statistics.fmean(it.step_time_s for it in self.steady(skip))

    def bubble_ratio(self, skip: int = 1) -> float:
        return statistics.fmean(it.bubble_ratio for it in self.steady(skip))

    def mean_durations_s(self, kind: str, skip: int = 1) -> list[float]:
        """Mean seconds of `kind` passes per virtual stage (looped placement: stage = chunk * pp + rank)."""
        sums = [0.0] * (self.pp * self.vpp)
        counts = [0] * (self.pp * self.vpp)
        for it in self.steady(skip):
            for r, acts in enumerate(it.ranks):
                for a in acts:
                    if a.kind == kind:
                        sums[a.chunk * self.pp + r] += a.end_s - a.start_s
                        counts[a.chunk * self.pp + r] += 1
        return [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]

    def p2p_estimate_s(self, skip: int = 1) -> float:
        """Median gap between F(s, mb 0) ending and F(s+1, mb 0) starting on the next rank: the p2p time plus the
        host work between the two measured passes (the first microbatch never waits for anything else)."""
        gaps = []
        for it in self.steady(skip):
            first = {}
            for r, acts in enumerate(it.ranks):
                for a in acts:
                    if a.kind == "F" and a.microbatch == 0:
                        first[a.chunk * self.pp + r] = a
            gaps += [first[s + 1].start_s - first[s].end_s for s in range(len(first) - 1)
                     if s in first and s + 1 in first]
        return max(0.0, statistics.median(gaps)) if gaps else 0.0

    def stage_costs(self, skip: int = 1, p2p_s: float | None = None) -> StageCosts:
        """Measured mean F and B per virtual stage (W = 0 unless the dump has wgrad lists), with the measured p2p."""
        f, b, w = (self.mean_durations_s(k, skip) for k in ("F", "B", "W"))
        lat = self.p2p_estimate_s(skip) if p2p_s is None else p2p_s
        return StageCosts.from_lists(f, [x + y for x, y in zip(b, w, strict=True)], w, lat)


def _num(d: dict[str, Any], key: str, where: str) -> int:
    if key not in d or not isinstance(d[key], int) or isinstance(d[key], bool) or d[key] < 1:
        raise ConfigError(Problem(f"missing, non-integer or non-positive {key!r}", key=key, file=where,
                                  fix="point at a Primus pp_data directory (config.json + pp_rank_<i>.json)"))
    return int(d[key])


def _order(kind: str, n: int, m: int, vpp: int, pp: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) of the k-th measured pass in Megatron's execution order."""
    if vpp == 1:
        return [(k, 0) for k in range(n)]
    table = schedule_table(m, vpp, pp)
    return [(mb, c if kind == "F" else vpp - 1 - c) for mb, c in table[:n]]


def _rank_actions(d: dict[str, Any], m: int, vpp: int, pp: int) -> tuple[MeasuredAction, ...]:
    out = []
    for kind, p in (("F", "fwd"), ("B", "bwd"), ("W", "wgrad")):
        starts, ends = d.get(f"{p}_start") or [], d.get(f"{p}_end") or []
        mbs, chunks = d.get(f"{p}_minibatch"), d.get(f"{p}_chunk")
        order = list(zip(mbs, chunks, strict=True)) if mbs and chunks else _order(kind, len(starts), m, vpp, pp)
        for (mb, c), s, e in zip(order, starts, ends, strict=True):
            out.append(MeasuredAction(kind, int(c), int(mb), float(s) / 1e3, float(e) / 1e3))
    return tuple(sorted(out, key=lambda a: (a.start_s, a.end_s)))


def load_pp_data(directory: str | Path) -> MeasuredPipeline:
    """Read a Primus pp_data directory (config.json and pp_rank_<p>.json for p < pp_size)."""
    root = Path(directory)
    cfg_path = root / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(Problem(f"cannot read a pp_data config: {e}", file=str(cfg_path),
                                  fix="point at a directory with config.json and pp_rank_<i>.json")) from e
    pp = _num(cfg, "pp_size", str(cfg_path))
    try:
        vpp = int(cfg.get("vp_size") or cfg.get("vpp_size") or 1)
        m = int(cfg.get("num_mbs") or cfg.get("micro_batches") or 0)
    except (TypeError, ValueError) as e:
        raise ConfigError(Problem(f"vp_size / num_mbs must be whole numbers: {e}", file=str(cfg_path),
                                  fix="point at a Primus pp_data directory (config.json + pp_rank_<i>.json)")) from e
    per_rank = []
    for r in range(pp):
        path = root / f"pp_rank_{r}.json"
        try:
            per_rank.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(Problem(f"cannot read rank {r}: {e}", file=str(path),
                                      fix=f"the dump needs one pp_rank_<i>.json per pipeline rank (pp_size = {pp})"
                                      )) from e
    out = []
    try:
        for it in sorted(set.intersection(*(set(d) for d in per_rank)), key=int):
            ranks = tuple(_rank_actions(d[it], m, vpp, pp) for d in per_rank)
            out.append(MeasuredIteration(int(it), tuple(float(d[it]["total"]) / 1e3 for d in per_rank), ranks))
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # unequal lists, non-numbers, missing keys
        raise ConfigError(Problem(f"malformed pp_data record: {type(e).__name__}: {e}", file=str(root),
                                  fix="each pp_rank_<i>.json maps iteration -> {fwd_start, fwd_end, bwd_start, "
                                      "bwd_end, ..., total} with equal-length lists of numbers")) from e
    return MeasuredPipeline(str(root), pp, vpp, m, tuple(out))
