"""Fit the collective model to measured rows: piecewise alpha-beta curves per (device, tier, kind, placement), tier
parameters derived from them, and the fit quality per row, per tier and per op class (collective kind).

Model of one curve: time(S) = alpha_j + bus_factor(kind, n) x S / busbw_j for S in segment j. Segments are contiguous
size ranges: NCCL / RCCL switch protocol (LL, LL128, Simple), algorithm (ring, tree) and channel count at size
thresholds, so a measured curve is a few alpha-beta regimes, not one (a single alpha-beta misses the 8x H100 NVLS
all_reduce of hardware.md §2 by 16 % in time). Each segment is a weighted linear least-squares fit
(non-negative least squares, alpha >= 0 and 1/busbw >= 0) of time against size with weights 1/time, i.e. relative
residuals, so 8 B and 8 GiB messages count alike; the split points minimise the summed squared relative residual
(exact dynamic programme over contiguous ranges). The number of segments is the smallest (1 to 6) whose largest
relative error is within `target`, else the best; each segment holds at least two distinct sizes.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import numpy as np

from projection.calibrate.calibration import Calibration, CollectiveRow
from projection.calibrate.errors import CalibrationError
from projection.cost.collectives import (
    CollectiveKind,
    CurveSegment,
    Fabric,
    MeasuredCurve,
    TierParams,
    bus_factor,
    ring_steps,
)
from projection.errors import Problem, count_of
from projection.specs.base import Spec

MAX_SEGMENTS = 6  # 3 protocols (LL, LL128, Simple) x 2 algorithms (ring, tree)
TARGET_MAX_ERROR = 0.03
FLAT_BUSBW = 1e18  # bytes/s of a segment whose time does not grow with size (latency only)
_RING_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


class FitSegment(Spec):
    """From min_bytes (up to the next segment's): time = alpha_s + bus_factor x size / busbw_bytes_per_s.
    first_bytes / last_bytes: the smallest and largest measured sizes it was fitted to (0: not recorded)."""

    min_bytes: int
    alpha_s: float
    busbw_bytes_per_s: float
    first_bytes: int = 0
    last_bytes: int = 0


class RowResidual(Spec):
    """One measured row against the fitted curve; rel_error = model / measured - 1."""

    size_bytes: int
    time_s: float
    model_time_s: float
    rel_error: float
    in_place: bool
    source: str


class CurveFit(Spec):
    """The fitted curve of one (device, kind, placement) and how well it reproduces its rows."""

    device: str | None
    tier: Literal["intra_node", "inter_node"]
    kind: CollectiveKind
    n_ranks: int
    n_nodes: int
    ranks_per_node: int
    segments: tuple[FitSegment, ...]
    residuals: tuple[RowResidual, ...]
    median_abs_rel_error: float
    max_abs_rel_error: float
    algorithm: str | None = None  # forced on every row (NCCL_ALGO in its source: `forced_algorithm`); None: the tuner's

    def to_curve(self) -> MeasuredCurve:
        """The cost model's view of this fit."""
        return MeasuredCurve(self.kind, self.n_ranks, self.ranks_per_node, self.n_nodes,
                             tuple(CurveSegment(s.min_bytes, s.alpha_s, s.busbw_bytes_per_s, s.first_bytes,
                                                s.last_bytes) for s in self.segments), self.algorithm)

    def time_s(self, size_bytes: float) -> float:
        """Fitted seconds at this curve's own placement."""
        return self.to_curve().time_s(size_bytes)

    def busbw_bytes_per_s(self, size_bytes: float) -> float:
        """Fitted bus bandwidth at size_bytes."""
        return bus_factor(self.kind, self.n_ranks) * size_bytes / self.time_s(size_bytes)


class TierFit(Spec):
    """Tier parameters implied by one curve (`tier_from_curve` below)."""

    tier: Literal["intra_node", "inter_node"]
    alpha_s: float
    beta_bytes_per_s: float
    from_kind: CollectiveKind
    n_ranks: int
    n_nodes: int


class QualityRow(Spec):
    """Fit quality of a set of rows: per tier or per op class."""

    group: Literal["tier", "kind"]
    name: str
    n_rows: int
    median_abs_rel_error: float
    max_abs_rel_error: float


class FittedFabric(Spec):
    """All curve fits of a calibration, the tier parameters they imply, and what could not be fitted."""

    curves: tuple[CurveFit, ...] = ()
    tiers: tuple[TierFit, ...] = ()
    skipped: tuple[str, ...] = ()

    def quality(self) -> list[QualityRow]:
        """Median and largest |relative error| over the rows of each tier, then of each collective kind."""
        out = []
        for group in ("tier", "kind"):
            errors: dict[str, list[float]] = defaultdict(list)
            for c in self.curves:
                errors[getattr(c, group)].extend(abs(r.rel_error) for r in c.residuals)
            out += [QualityRow(group=group, name=name, n_rows=len(e), median_abs_rel_error=statistics.median(e),
                               max_abs_rel_error=max(e)) for name, e in errors.items() if e]
        return out

    def apply(self, fabric: Fabric) -> Fabric:
        """`fabric` with these tier parameters and curves; a curve whose largest-size segment is flat (latency only)
        is not installed: extrapolated, it would price any larger message at that latency."""
        return fabric.with_fit({t.tier: TierParams(t.alpha_s, t.beta_bytes_per_s) for t in self.tiers},
                               [c.to_curve() for c in self.curves if c.segments[-1].busbw_bytes_per_s < FLAT_BUSBW])

    def to_table(self) -> str:
        """Plain-text report: each curve with its segments and errors, quality per tier and kind, tiers, skips."""
        lines = ["collective fits (relative time error of the fitted model against each measured row)",
                 f"{'tier':<11} {'kind':<15} {'ranks':>5} {'nodes':>5} {'rows':>5} {'median':>7} {'max':>7}  "
                 "segments (from size: alpha, busbw)"]
        for c in self.curves:
            segs = " | ".join(f"{_size(s.min_bytes)}: {s.alpha_s * 1e6:.1f} us, " +
                              ("flat" if s.busbw_bytes_per_s >= FLAT_BUSBW else f"{s.busbw_bytes_per_s / 1e9:.1f} GB/s")
                              for s in c.segments)
            lines.append(f"{c.tier:<11} {c.kind:<15} {c.n_ranks:>5} {c.n_nodes:>5} {len(c.residuals):>5} "
                         f"{c.median_abs_rel_error:>7.1%} {c.max_abs_rel_error:>7.1%}  {segs}"
                         + (f"  [{c.device}]" if c.device else "") + (f"  [NCCL_ALGO={c.algorithm}]" if c.algorithm
                                                                       else ""))
        lines.append("")
        lines.append(f"{'quality per':<11} {'name':<15} {'rows':>5} {'median':>7} {'max':>7}")
        lines += [f"{q.group:<11} {q.name:<15} {q.n_rows:>5} {q.median_abs_rel_error:>7.1%} "
                  f"{q.max_abs_rel_error:>7.1%}" for q in self.quality()]
        if self.tiers:
            lines.append("")
            lines += [f"tier {t.tier}: alpha {t.alpha_s * 1e6:.2f} us per step, beta {t.beta_bytes_per_s / 1e9:.1f} "
                      f"GB/s per GPU (from {t.from_kind}, {t.n_ranks} ranks on {count_of(t.n_nodes, 'node')})"
                      for t in self.tiers]
        lines += [f"skipped: {s}" for s in self.skipped]
        return "\n".join(lines)


def nnls2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin |a x - b| over x >= 0 for a two-column `a` (what scipy.optimize.nnls computes, without importing
    scipy: half a second of start-up). The problem is convex: the unconstrained minimiser if it is feasible, else the
    best point with one coordinate at zero (each a one-variable problem, clipped at 0)."""
    x = np.linalg.lstsq(a, b, rcond=None)[0]
    if x[0] >= 0.0 and x[1] >= 0.0:
        return np.asarray(x, dtype=float)
    best, best_r = np.zeros(2), float(b @ b)
    for j in (0, 1):
        col = a[:, j]
        norm = float(col @ col)
        cand = np.zeros(2)
        cand[j] = max(0.0, float(col @ b) / norm) if norm > 0 else 0.0
        r = float(np.sum((a @ cand - b) ** 2))
        if r < best_r:
            best, best_r = cand, r
    return best


def fit_curve(sizes: np.ndarray, times: np.ndarray, factor: float, *, max_segments: int = MAX_SEGMENTS,
              target: float = TARGET_MAX_ERROR) -> list[FitSegment]:
    """Piecewise alpha-beta fit of times (s) against sizes (bytes, distinct, increasing) for one bus factor."""
    n = len(sizes)
    if n < 2 or np.any(np.diff(sizes) <= 0) or np.any(times <= 0):
        raise ValueError("need at least two distinct increasing sizes and positive times")
    line: dict[tuple[int, int], tuple[float, float, float]] = {}  # (i, j) -> alpha, slope, sum sq rel residual

    def segment(i: int, j: int) -> tuple[float, float, float]:
        if (i, j) not in line:
            s, t = sizes[i:j], times[i:j]
            a = np.column_stack([np.ones_like(s), factor * s]) / t[:, None]
            coef = nnls2(a, np.ones_like(t))
            line[(i, j)] = (float(coef[0]), float(coef[1]), float(np.sum((a @ coef - 1.0) ** 2)))
        return line[(i, j)]

    best: list[FitSegment] | None = None
    best_err = math.inf
    for k in range(1, min(max_segments, n // 2) + 1):
        cuts = _split(n, k, lambda i, j: segment(i, j)[2])
        segs = [FitSegment(min_bytes=0 if i == 0 else int(round(math.sqrt(sizes[i - 1] * sizes[i]))),
                           alpha_s=segment(i, j)[0],
                           busbw_bytes_per_s=1.0 / segment(i, j)[1] if segment(i, j)[1] > 1.0 / FLAT_BUSBW
                           else FLAT_BUSBW, first_bytes=int(sizes[i]), last_bytes=int(sizes[j - 1]))
                for i, j in zip(cuts[:-1], cuts[1:], strict=True)]
        err = max(abs(_model(segs, factor, s) / t - 1.0) for s, t in zip(sizes, times, strict=True))
        if err < best_err - 1e-12:
            best, best_err = segs, err
        if best_err <= target:
            break
    assert best is not None
    return best


def fit_calibration(cal: Calibration, fabric: Fabric | None = None, *, max_segments: int = MAX_SEGMENTS,
                    target: float = TARGET_MAX_ERROR, file: str | None = None) -> FittedFabric:
    """Fit every (device, tier, kind, n_ranks, n_nodes) group of the calibration's collective rows.

    fabric: the cluster's analytic fabric, for the tier parameters (mesh share, oversubscription); default a
    switch with no oversubscription. Rows of size 0, rows without a node count (profiler traces) and groups with
    fewer than two sizes are listed in `skipped`, except a single bandwidth-bound size, which is used with the
    fabric's latency (`_one_size_segment`, also noted there). CalibrationError if nothing can be fitted, naming
    `file` (the calibration file, when it came from one) else the sources recorded in its provenance."""
    groups: dict[tuple[str | None, str, int, int], list[CollectiveRow]] = defaultdict(list)
    skipped: list[str] = []
    unknown_nodes = [r for r in cal.collective if r.n_nodes is None]
    if unknown_nodes:
        files = sorted({r.source.split(":")[0] for r in unknown_nodes})
        skipped.append(f"{len(unknown_nodes)} rows without a node count (tier unknown): {', '.join(files)}")
    for r in cal.collective:
        if r.n_nodes is not None and r.size_bytes > 0 and r.n_ranks > 1:
            groups[(r.device, r.kind, r.n_ranks, r.n_nodes)].append(r)
    curves: list[CurveFit] = []
    for (device, kind, n_ranks, n_nodes), rows in groups.items():
        by_size: dict[int, list[float]] = defaultdict(list)
        for r in rows:
            by_size[r.size_bytes].append(r.time_s)
        where = f"{kind} on {n_ranks} ranks / {n_nodes} nodes{f' ({device})' if device else ''}"
        sizes = np.array(sorted(by_size), dtype=float)
        times = np.array([math.exp(statistics.fmean(math.log(t) for t in by_size[int(s)])) for s in sizes])
        factor = bus_factor(kind, n_ranks)
        if len(by_size) < 2:
            one = _one_size_segment(kind, n_ranks, n_nodes, int(sizes[0]), float(times[0]), fabric)
            if one is None:
                why = "no device is known to take a latency from" if fabric is None else \
                    "at which the device's latency is not negligible"
                skipped.append(f"{where}: 1 message size, {why}; a fit needs two or more sizes")
                continue
            skipped.append(f"{where}: 1 message size ({_size(int(sizes[0]))}); its bandwidth is used with the device "
                           f"YAML's latency ({one.alpha_s * 1e6:.1f} us for the collective), which it cannot fit")
            segs = [one]
        else:
            segs = fit_curve(sizes, times, factor, max_segments=max_segments, target=target)
        residuals = tuple(RowResidual(size_bytes=r.size_bytes, time_s=r.time_s,
                                      model_time_s=_model(segs, factor, r.size_bytes),
                                      rel_error=_model(segs, factor, r.size_bytes) / r.time_s - 1.0,
                                      in_place=r.in_place, source=r.source) for r in rows)
        errs = [abs(x.rel_error) for x in residuals]
        forced = {forced_algorithm(r.source) for r in rows}
        curves.append(CurveFit(device=device, tier="intra_node" if n_nodes == 1 else "inter_node", kind=kind,
                               n_ranks=n_ranks, n_nodes=n_nodes, ranks_per_node=-(-n_ranks // n_nodes),
                               segments=tuple(segs), residuals=residuals, median_abs_rel_error=statistics.median(errs),
                               max_abs_rel_error=max(errs), algorithm=forced.pop() if len(forced) == 1 else None))
    if not curves:
        held = ", ".join(f"{n} {name} row{'s' * (n != 1)}" for name, n in cal.row_counts().items() if n)
        why = "; ".join(skipped) or (f"it holds only {held}" if held else "it holds no rows")
        raise CalibrationError(Problem(f"no collective rows to fit ({why})",
                                       file=file or ", ".join(sorted({f for p in cal.provenance
                                                                      for f in p.source_files})) or None,
                                       fix="import nccl-tests / rccl-tests sweeps (several message sizes), or run "
                                           "`projection calibrate collective`, into this calibration"))
    tiers = _tiers(curves, fabric)
    if fabric is not None and "intra_node" not in {t.tier for t in tiers}:
        skipped += [f"intra_node {c.kind} {c.n_ranks} ranks: bus bandwidth above the link's line rate (an in-network "
                    "reduction such as NVLS, not a ring): it prices that collective only; the intra-node tier keeps "
                    "the device YAML's ring bandwidth" for c in curves
                    if c.tier == "intra_node" and c.kind in _RING_KINDS
                    and _in_network(tier_from_curve(c.to_curve(), fabric).beta_bytes_per_s, fabric)]
    skipped += [f"{c.tier} {c.kind} {c.n_ranks} ranks: its largest measured sizes fit a flat (latency-only) segment, "
                "so the curve is reported but not used to price collectives (measure larger messages)"
                for c in curves if c.segments[-1].busbw_bytes_per_s >= FLAT_BUSBW]
    skipped += [f"{t} tier: no bandwidth (every ring-kind curve is flat, latency only, over its measured sizes: "
                "measure larger messages)" for t in ("intra_node", "inter_node")
                if any(c.tier == t and c.kind in _RING_KINDS for c in curves) and t not in {x.tier for x in tiers}]
    return FittedFabric(curves=tuple(curves), tiers=tiers, skipped=tuple(skipped))


def forced_algorithm(source: str) -> str | None:
    """The one algorithm a row's source says the library was forced to (`NCCL_ALGO=Ring` -> "ring"; RCCL reads the
    same variable, ROCm RCCL docs "RCCL environment variables"), else None. NCCL reads NCCL_ALGO as a comma list of
    the algorithms left to the tuner, '^' excluding instead (parseList, NVIDIA/nccl src/graph/tuning.cc): a list, an
    exclusion or a per-collective rule leaves a choice, and reads as None."""
    m = re.search(r"NCCL_ALGO\s*=\s*[\"']?([\w^,:;]+)", source)
    return m.group(1).lower() if m and re.fullmatch(r"[a-z]\w*", m.group(1), re.IGNORECASE) else None


def _one_size_segment(kind: str, n_ranks: int, n_nodes: int, size: int, time_s: float,
                      fabric: Fabric | None) -> FitSegment | None:
    """One measured size can give a bandwidth but not a latency: with the device's own latency (the fabric tier's
    alpha per ring step x ring steps, the inverse of tier_from_curve) the row is reproduced exactly by
    time = alpha + bus_factor x size / busbw. Only where that latency is under a tenth of the measured time (a
    bandwidth-bound message, e.g. rccl-tests' 16 GiB smoke test), else None; None without a fabric."""
    if fabric is None:
        return None
    alpha = (fabric.intra if n_nodes == 1 else fabric.inter).alpha_s * max(ring_steps(kind, n_ranks), 1)
    if alpha >= 0.1 * time_s:
        return None
    return FitSegment(min_bytes=0, alpha_s=alpha, busbw_bytes_per_s=bus_factor(kind, n_ranks) * size / (time_s - alpha),
                      first_bytes=size, last_bytes=size)


def _tiers(curves: list[CurveFit], fabric: Fabric | None) -> tuple[TierFit, ...]:
    """Per tier: from the ring-kind curve with the most rows (all_reduce first), its implied alpha and beta, the
    bandwidth from its largest-size segment that is not flat (FLAT_BUSBW marks latency-only segments: they carry no
    bandwidth); a tier whose curves are all flat gets no parameters."""
    fabric = fabric or Fabric(gpus_per_node=8, intra=TierParams(0.0, 1.0), inter=TierParams(0.0, 1.0))
    out = []
    for tier in ("intra_node", "inter_node"):
        usable = [c for c in curves if c.tier == tier and c.kind in _RING_KINDS
                  and any(s.busbw_bytes_per_s < FLAT_BUSBW for s in c.segments)]
        for c in sorted(usable, key=lambda c: (c.kind == "all_reduce", len(c.residuals), c.n_ranks), reverse=True):
            curve = c.to_curve()
            last = max(i for i, s in enumerate(c.segments) if s.busbw_bytes_per_s < FLAT_BUSBW)
            params = tier_from_curve(replace(curve, segments=curve.segments[:last + 1]), fabric)
            if tier == "intra_node" and _in_network(params.beta_bytes_per_s, fabric):
                continue  # next curve, or the device YAML's tier
            out.append(TierFit(tier=c.tier, alpha_s=params.alpha_s, beta_bytes_per_s=params.beta_bytes_per_s,
                               from_kind=c.kind, n_ranks=c.n_ranks, n_nodes=c.n_nodes))
            break
    return tuple(out)


def _in_network(beta_bytes_per_s: float, fabric: Fabric) -> bool:
    """A curve implying more bus bandwidth than the link's line rate is no ring: an in-network reduction (NVLink
    SHARP / NVLS) moves less than a ring over the wire, and "neither the algbw nor busbw correspond to the bandwidth
    on the wire" (NCCL's developers, NVIDIA/nccl-tests#212). It prices all_reduce at its own placement only; the tier
    (all-gather, reduce-scatter, all-to-all, p2p) stays on the device YAML's ring bandwidth."""
    line = fabric.intra_line_rate_bytes_per_s
    return line is not None and beta_bytes_per_s > line


def _split(n: int, k: int, cost: Callable[[int, int], float]) -> list[int]:
    """Boundaries 0 = b0 < ... < bk = n (each part >= 2 points) minimising the summed cost(i, j): dynamic programme."""
    best: dict[tuple[int, int], tuple[float, list[int]]] = {(0, 0): (0.0, [0])}
    for parts in range(1, k + 1):
        for j in range(2 * parts, n - 2 * (k - parts) + 1):
            options = [(best[(parts - 1, i)][0] + cost(i, j), best[(parts - 1, i)][1] + [j])
                       for i in range(2 * (parts - 1), j - 1) if (parts - 1, i) in best]
            if options:
                best[(parts, j)] = min(options, key=lambda o: o[0])
    return best[(k, n)][1]


def _model(segs: list[FitSegment] | tuple[FitSegment, ...], factor: float, size: float) -> float:
    seg = segs[0]
    for s in segs[1:]:
        if size >= s.min_bytes:
            seg = s
    return seg.alpha_s + factor * size / seg.busbw_bytes_per_s


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def tier_from_curve(curve: MeasuredCurve, fabric: Fabric) -> TierParams:
    """Tier parameters implied by a measured curve: alpha = the smallest-size segment's latency per ring step;
    beta = the largest-size segment's bus bandwidth divided by what one unit of tier bandwidth gives this placement
    (intra: the mesh share of r ranks; inter: r NICs in parallel, the ring's inter-node bottleneck)."""
    ref = curve.placement
    alpha = curve.segments[0].alpha_s / max(ring_steps(curve.kind, ref.n_ranks), 1)
    busbw = curve.segments[-1].busbw_bytes_per_s
    fabric = replace(fabric, oversubscription=1.0)  # a sweep runs under one leaf (_scaled_segment_time_s)
    if ref.tier == "intra_node":
        unit = replace(fabric, intra=TierParams(alpha, 1.0))
        per_unit = unit.intra_bandwidth(ref.ranks_per_node) if curve.kind != "send_recv" else unit.pair_bandwidth(True)
    else:
        unit = replace(fabric, inter=TierParams(alpha, 1.0))
        per_unit = (ref.ranks_per_node if curve.kind != "send_recv" else 1) * unit.nic_bandwidth(ref.rail_aligned)
    return TierParams(alpha_s=alpha, beta_bytes_per_s=busbw / per_unit)
