"""Calibrated cost model: interpolation over measured tables (projection.calibrate.calibration.Calibration), built
once at construction, with the roofline model outside the measured range (and saying so in `provenance`).

Tables and their interpolation (every table is exact at its measured points):
- GEMM, per (dtype, layout) and pooled over layouts per dtype: log FLOP/s over (log m, log n*batch, log k), BLAS
  shapes. Each row is also entered with m and n swapped (the same kernel seen transposed) unless that point was
  measured itself. Interpolant: a linear radial basis function, f(x) = sum_i w_i * -|x - x_i| + c, whose weights
  solve the interpolation system once (Buhmann 2003, "Radial Basis Functions", ch. 2; with one coordinate varying it
  is piecewise linear, so monotone between neighbouring points), clipped to the measured FLOP/s range.
- Grouped GEMM, per dtype: the same over (log groups, log m, log n, log k); without a grouped table, a grouped GEMM is
  priced as one GEMM with the groups stacked along n (the token dimension).
- Attention, per (direction, head dim, causal, 16-bit or fp8): log FLOP/s over (log batch*heads, log seq_q,
  log seq_kv), FLOPs counted as the ops count them (ops_attention.py).
- Memory-bound: log time against log bytes, piecewise linear (monotone), median of rows of equal size. Rows of a
  named kernel (`gelu`, `rmsnorm.bwd`, ...: ops_base.KERNEL_FNS, as `projection calibrate memory --config` measures
  them) price the ops naming that kernel, per dtype where measured in it; outside their size range the nearest
  row's bytes/s scales the time. Every other row (add, copy, stream, trace kernels) forms the generic curve that
  prices the unnamed ops and named ones without rows.
- Collectives: the alpha-beta fabric of projection/cost/collectives.py with curves fitted to the calibration's
  collective rows (projection.calibrate.fit), else the fallback's analytic fabric; a group is never priced below a
  measured placement inside it (`held_time_s`).
"In range" means inside the bounding box of the table's points in every coordinate.
A calibration of several devices prices the projected one from its own rows only (projection/cost/device_rows.py).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from projection.calibrate.calibration import Calibration, MemoryBoundRow
from projection.cost.above_range import above_range_s
from projection.cost.collectives import (
    CollectiveKind,
    Fabric,
    GroupPlacement,
    MeasuredCurve,
    TierParams,
    collective_time_s,
    curve_time_s,
)
from projection.cost.device_rows import DeviceRows, own_device_rows
from projection.cost.model import collective_op_seconds
from projection.cost.roofline import RooflineCostModel, peak_dtype
from projection.specs.hardware import DeviceSpec
from projection.workload.ops import Op
from projection.workload.ops_base import kernel_fn

OUT_OF_RANGE = "calibrated (out of range -> roofline)"
CLAMPED = "calibrated (out of range -> nearest measured)"


class LogTable:
    """Scattered points x (N, D) with values y (N,): linear-RBF interpolation, exact at the points."""

    def __init__(self, points: Sequence[Sequence[float]], values: Sequence[float], label: str) -> None:
        merged: dict[tuple[float, ...], list[float]] = defaultdict(list)
        for p, v in zip(points, values, strict=True):
            merged[tuple(round(c, 9) for c in p)].append(v)
        self.exact = {p: statistics.fmean(v) for p, v in merged.items()}
        self.x = np.array(list(self.exact), dtype=float)
        self.y = np.array(list(self.exact.values()), dtype=float)
        self.lo, self.hi = self.x.min(axis=0), self.x.max(axis=0)
        self.label, self.rows = label, len(values)
        n = len(self.y)
        system = np.zeros((n + 1, n + 1))
        system[:n, :n] = -np.linalg.norm(self.x[:, None, :] - self.x[None, :, :], axis=-1)
        system[:n, n] = system[n, :n] = 1.0
        solution = np.linalg.solve(system, np.append(self.y, 0.0))
        self.w, self.c = solution[:n], solution[n]

    def contains(self, q: Sequence[float]) -> bool:
        return bool(np.all(np.asarray(q) >= self.lo - 1e-9) and np.all(np.asarray(q) <= self.hi + 1e-9))

    def __call__(self, q: Sequence[float]) -> float:
        key = tuple(round(c, 9) for c in q)
        if key in self.exact:
            return self.exact[key]
        value = float(self.w @ -np.linalg.norm(self.x - np.asarray(q, dtype=float), axis=-1) + self.c)
        return min(max(value, float(self.y.min())), float(self.y.max()))

    def clamp(self, q: Sequence[float]) -> list[float]:
        return [float(v) for v in np.clip(np.asarray(q, dtype=float), self.lo, self.hi)]


class CurveTable:
    """log time against log size, piecewise linear through the medians of equal sizes."""

    def __init__(self, sizes: Sequence[float], times: Sequence[float], label: str) -> None:
        by_size: dict[float, list[float]] = defaultdict(list)
        for s, t in zip(sizes, times, strict=True):
            by_size[float(s)].append(t)
        self.x = np.log(np.array(sorted(by_size)))
        self.y = np.log(np.array([statistics.median(by_size[s]) for s in sorted(by_size)]))
        self.label, self.rows = label, len(sizes)

    def contains(self, size: float) -> bool:
        return size > 0 and self.x[0] - 1e-9 <= math.log(size) <= self.x[-1] + 1e-9

    def __call__(self, size: float) -> float:
        return float(math.exp(np.interp(math.log(max(size, 1.0)), self.x, self.y)))

    def scaled(self, size: float) -> float:
        """Outside the range: the nearest end's time scaled by size (its bytes/s held constant)."""
        end = 0 if math.log(max(size, 1.0)) < self.x[0] else -1
        return float(math.exp(self.y[end]) * max(size, 1.0) / math.exp(self.x[end]))


def _log2(*values: float) -> list[float]:
    return [math.log2(max(v, 1)) for v in values]


def _dtype_class(dtype: str) -> str:
    return "16bit" if dtype in ("bf16", "fp16") else dtype


def _scaled_tier(fitted: TierParams, cluster: TierParams, measured_on: TierParams) -> TierParams:
    """A fitted tier moved to another cluster: its bandwidth times the ratio of the two clusters' analytic ones (the
    efficiency the measurement showed, kept), its per-step latency plus their difference (as the curves take it)."""
    return TierParams(max(0.0, fitted.alpha_s + cluster.alpha_s - measured_on.alpha_s),
                      fitted.beta_bytes_per_s * cluster.beta_bytes_per_s / measured_on.beta_bytes_per_s)


def subgroup_floor(kind: CollectiveKind, size_bytes: float, group: GroupPlacement,
                   fabric: Fabric) -> tuple[float, MeasuredCurve | None]:
    """The slowest measured placement inside `group` (no more ranks, ranks per node or nodes; not its own), priced on
    this fabric, and its curve ((0.0, None): none). A group does the work of each group it holds -- an all_reduce of
    the same S bytes, an all_gather or reduce_scatter of the same per-rank share (S x n_sub / n bytes in nccl-tests'
    size convention, hardware.md §0) -- so it is no faster. Other kinds: (0.0, None)."""
    best: tuple[float, MeasuredCurve | None] = (0.0, None)
    if kind not in ("all_reduce", "all_gather", "reduce_scatter"):
        return best
    own = (group.n_ranks, group.ranks_per_node, group.n_nodes)
    for c in fabric.curves:
        if c.kind == kind and c.n_ranks <= own[0] and c.ranks_per_node <= own[1] and c.n_nodes <= own[2] \
                and (c.n_ranks, c.ranks_per_node, c.n_nodes) != own:
            share = size_bytes if kind == "all_reduce" else size_bytes * c.n_ranks / group.n_ranks
            if not c.covers(share):  # below its smallest measured size the subgroup's time is no measurement
                continue
            best = max(best, (curve_time_s(c, share, c.placement, fabric), c), key=lambda b: b[0])
    return best


def held_time_s(kind: CollectiveKind, size_bytes: float, group: GroupPlacement,
                fabric: Fabric) -> tuple[float, MeasuredCurve | None]:
    """collective_time_s held at `subgroup_floor`, and the curve holding it (None: not held). Not where the group's own
    placement was measured: with the tuner free the curve is the price there; with a forced algorithm that
    algorithm's measured time caps the floor (the tuner can run it, and picks the least time: NVIDIA/nccl
    src/graph/tuning.cc)."""
    if group.n_ranks < 2 or size_bytes <= 0:
        return 0.0, None
    t = collective_time_s(kind, size_bytes, group, fabric)  # "auto": the closest curve's price, else the fastest
    curve = fabric.curve_for(kind, group)
    if curve is not None and curve.stands_at(group, size_bytes):
        return t, None
    floor_s, held = subgroup_floor(kind, size_bytes, group, fabric)
    if curve is not None and curve.measured_at(group):
        floor_s = min(floor_s, curve_time_s(curve, size_bytes, group, fabric, as_measured=True))
    return (t, None) if t >= floor_s else (floor_s, held)


class CalibratedCostModel:
    """Prices ops from a Calibration; `fallback` (a roofline model) prices what the tables do not cover, and its
    cluster placement and fabric price collectives. Without a fallback, out-of-range queries use the nearest
    measured point (for devices without a DeviceSpec, e.g. a CPU). `fabric` replaces the fallback's fabric as the
    base the calibration's collective curves are fitted onto (a CPU calibration has no fallback to take it from)."""

    def __init__(self, calibration: Calibration, fallback: RooflineCostModel | None = None, *,
                 fabric: Fabric | None = None, groups: Mapping[str, GroupPlacement] | None = None,
                 name: str = "calibration", path: Path | None = None, measured_on: Fabric | None = None,
                 measured_device: DeviceSpec | None = None) -> None:
        self.calibration, self.fallback, self.name = calibration, fallback, name
        # the device the compute tables were measured on, where the priced one is an edit of it (a what-if's peak
        # FLOP/s or HBM bandwidth): a measured time is scaled by the ratio of the two (compute_ratio)
        self.measured_device = measured_device
        # a mixed-device calibration prices the projected device from its own rows only (cost/device_rows.py)
        self.device_rows = own_device_rows(calibration, fallback.device) if fallback is not None \
            else DeviceRows(calibration)
        self.rows = self.device_rows.calibration  # the rows every table below is built from
        self.path = path  # the file it was read from, as given (None: built in memory)
        self.groups: Mapping[str, GroupPlacement] = groups if groups is not None else (
            fallback.groups if fallback is not None else {})
        self.measured_on = measured_on  # the analytic fabric of the machine the collectives were measured on
        self._base_fabric = fabric or (fallback.fabric if fallback is not None else None)
        self.fabric = self._fitted_fabric(self._base_fabric)
        self.gemm = self._gemm_tables()
        self.grouped = self._grouped_tables()
        self.attention = self._attention_tables()
        rows = [r for r in self.rows.memory_bound if r.size_bytes > 0]
        generic = [r for r in rows if not kernel_fn(r.op)]
        self.memory = CurveTable([r.size_bytes for r in generic], [r.time_s for r in generic], "memory_bound") \
            if generic else None
        self.kernels = self._kernel_tables([r for r in rows if kernel_fn(r.op)])
        self.host_kernel_issue_s: float | None = self.rows.host_kernel_issue_s()
        self._cache: dict[Op, tuple[float, str]] = {}

    def device_rows_note(self) -> str | None:
        """What a mixed-device calibration prices the projected device with, table by table (None: used whole)."""
        device = self.fallback.device.name if self.fallback is not None else ""
        return self.device_rows.note(device, self.name)

    # ---- the CostModel interface
    def op_seconds(self, op: Op) -> float:
        if op.kind == "collective":
            return collective_op_seconds(self, op, self.groups)
        return op.count * self._priced(op)[0]

    def collective_seconds(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> float:
        if self.fabric is None:
            raise ValueError("no fabric: give the calibrated model a roofline fallback built with a cluster, or a "
                             "fabric")
        return self._collective(kind, size_bytes, group)[0]

    def _collective(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> tuple[float, str]:
        """Seconds (held_time_s), with the bytes above the curve's largest measured size carried at the faster of its
        last segment and the roofline (cost/above_range.py: "roofline", "segment"; "" inside the measured sizes)."""
        fabric = self.fabric
        assert fabric is not None
        return above_range_s(kind, size_bytes, group, fabric.curve_for(kind, group), self._base_fabric,
                             lambda s: held_time_s(kind, s, group, fabric)[0])

    def provenance(self, op: Op) -> str:
        if op.kind == "collective":
            placement = self.groups.get(op.group or "")
            if placement is None or op.coll is None:
                return "roofline"
            return self.collective_provenance(op.coll, op.coll_bytes, placement)
        return self._priced(op)[1]

    def collective_provenance(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> str:
        """Where one collective's seconds come from: a measured curve of its kind (saying where it is scaled from
        another placement, priced outside the measured sizes or measured with a forced algorithm), the curve of a
        measured placement inside the group where the group is held at its time (`held_time_s`), the
        tier the calibration's curves were fitted to (a kind with no curve of its own, priced with the fitted tier),
        or the analytic fabric ("roofline")."""
        if self.fabric is None:
            return "roofline"
        curve = self.fabric.curve_for(kind, group)
        held = held_time_s(kind, size_bytes, group, self.fabric)[1]
        if held is not None:
            return f"calibrated: {self.name} {kind} curve (held at its {held.n_ranks} ranks on {held.n_nodes} " \
                   "node(s): a group holding them is no faster)"
        if curve is not None:
            notes = [f"measured with NCCL_ALGO={curve.algorithm}: one of the tuner's algorithms"] \
                if curve.algorithm else []
            if (curve.n_ranks, curve.ranks_per_node, curve.n_nodes) != (group.n_ranks, group.ranks_per_node,
                                                                        group.n_nodes):
                notes.append(f"scaled from {curve.n_ranks} ranks on {curve.n_nodes} node(s)")
            lo = min((s.first_bytes for s in curve.segments if s.first_bytes), default=0)
            hi = max((s.last_bytes for s in curve.segments), default=0)
            if hi and size_bytes > hi:
                how = self._collective(kind, size_bytes, group)[1]
                notes.append("above the measured sizes: the bytes beyond the largest at " + (
                    "the roofline's bandwidth" if how == "roofline" else "its last segment's bandwidth"))
            elif hi and size_bytes < lo:
                notes.append("outside the measured sizes")
            return f"calibrated: {self.name} {kind} curve" + (f" ({'; '.join(notes)})" if notes else "")
        tier = "intra" if group.tier == "intra_node" else "inter"
        base = self._base_fabric
        if base is not None and getattr(self.fabric, tier) != getattr(base, tier):
            return f"calibrated: {self.name} {group.tier} tier (fitted to its measured curves)"
        return "roofline"

    # ---- lookups
    def compute_ratio(self, op: Op) -> float:
        """measured / priced device's rate for a compute op's bound: the dtype's peak for GEMMs and attention, the HBM
        bandwidth for memory-bound ops; 1 without a measured device or where either lacks the number."""
        was, now = self.measured_device, self.fallback.device if self.fallback is not None else None
        if was is None or now is None or was == now:
            return 1.0
        if op.kind == "memory_bound":
            return was.hbm_bandwidth_bytes_per_s / now.hbm_bandwidth_bytes_per_s
        a = {str(k): v for k, v in was.peak_flop_per_s.items()}.get(peak_dtype(was, op.dtype))
        b = {str(k): v for k, v in now.peak_flop_per_s.items()}.get(peak_dtype(now, op.dtype))
        return a / b if a and b else 1.0

    def _priced(self, op: Op) -> tuple[float, str]:
        if op not in self._cache:
            seconds, label = self._lookup(op)
            ratio = self.compute_ratio(op) if label.startswith("calibrated:") else 1.0
            if ratio != 1.0:  # a measured table on an edited device (the roofline fallback prices the edit already)
                seconds, label = seconds * ratio, f"{label} (x {1 / ratio:.3g} the measured rate: the device edit)"
            # A measured rate above the device's datasheet peak cannot be this device's (another part's table, or a
            # bad row): never price a compute op faster than its peak.
            bound = self.fallback.peak_seconds(op) if self.fallback is not None else 0.0
            if seconds < bound:
                seconds, label = bound, f"{label} (above the datasheet peak: capped at it)"
            self._cache[op] = (seconds, label)
        return self._cache[op]

    def _lookup(self, op: Op) -> tuple[float, str]:
        if op.kind == "memory_bound":
            size = op.bytes_read + op.bytes_written
            kernel = self.kernels.get((op.kernel, _dtype_class(op.dtype))) or self.kernels.get((op.kernel, "*"))
            if kernel is not None:
                label = f"calibrated: {self.name} memory_bound {op.kernel}"
                return (kernel(size), label) if kernel.contains(size) else (kernel.scaled(size), f"{label} (scaled "
                                                                                                  "by bytes)")
            if self.memory is None:
                return self._outside(op, None)
            if self.memory.contains(size):
                return self.memory(size), f"calibrated: {self.name} memory_bound"
            return self._outside(op, lambda: self.memory(size) if self.memory else 0.0, "memory_bound")
        if op.kind == "attention":
            return self._rate(op, self.attention.get(self._attention_key(op), []),
                              _log2(op.batch * op.heads, op.m, op.n))
        if op.kind == "grouped_gemm":
            tables = self.grouped.get(op.dtype, [])
            if tables:
                return self._rate(op, tables, _log2(op.batch, op.m, op.n, op.k))
            stacked = self.gemm.get((op.dtype, op.layout), []) + self.gemm.get((op.dtype, "*"), [])
            t, source = self._rate(op, stacked, _log2(op.m, op.n * op.batch, op.k))
            return t, source.replace(f"{self.name} gemm", f"{self.name} gemm (groups stacked)")
        if op.kind == "gemm":
            tables = self.gemm.get((op.dtype, op.layout), []) + self.gemm.get((op.dtype, "*"), [])
            return self._rate(op, tables, _log2(op.m, op.n * op.batch, op.k))
        raise ValueError(f"op kind {op.kind!r} is not priced from tables")

    def _rate(self, op: Op, tables: list[LogTable], q: list[float]) -> tuple[float, str]:
        """Time from the first table whose range holds q (log FLOP/s interpolated), else the fallback."""
        for table in tables:
            if table.contains(q):
                return op.flop / math.exp(table(q)), f"calibrated: {self.name} {table.label}"
        if not tables:
            return self._outside(op, None)
        nearest = tables[0]
        return self._outside(op, lambda: op.flop / math.exp(nearest(nearest.clamp(q))), nearest.label)

    def _outside(self, op: Op, clamped: Callable[[], float] | None, table: str = "") -> tuple[float, str]:
        """The fallback's seconds for an op no table holds; its source names the table it fell out of, if any."""
        which = f": {self.name} {table}" if table else ""
        if self.fallback is not None:  # no table for this op's kind and dtype: plain roofline, else flagged
            return self.fallback.single_seconds(op), OUT_OF_RANGE + which \
                if clamped is not None and self.fallback.has_curve(op) else self.fallback.provenance(op)
        if clamped is None:
            raise ValueError(f"no measured table for {op.kind} {op.dtype} ({op.name}) and no roofline fallback")
        return clamped(), CLAMPED + which

    def _kernel_tables(self, rows: Sequence[MemoryBoundRow]) -> dict[tuple[str, str], CurveTable]:
        """Curves per (kernel, dtype class) and per kernel over every dtype ("*")."""
        groups: dict[tuple[str, str], list[MemoryBoundRow]] = defaultdict(list)
        for r in rows:
            groups[(r.op, _dtype_class(r.dtype or ""))].append(r)
            groups[(r.op, "*")].append(r)
        return {key: CurveTable([r.size_bytes for r in g], [r.time_s for r in g], f"memory_bound {key[0]}")
                for key, g in groups.items()}

    @staticmethod
    def _attention_key(op: Op) -> tuple[str, int, bool, str]:
        return ("bwd" if op.phase == "I" else "fwd", op.k, op.causal, _dtype_class(op.dtype))

    # ---- table construction
    def _gemm_tables(self) -> dict[tuple[str, str], list[LogTable]]:
        groups: dict[tuple[str, str], list[tuple[list[float], float]]] = defaultdict(list)
        for r in self.rows.gemm:
            rate = math.log(2.0 * r.m * r.n * r.k * r.batch / r.time_s)
            for key in ((r.dtype, r.layout), (r.dtype, "*")):
                groups[key].append((_log2(r.m, r.n * r.batch, r.k), rate))
        out: dict[tuple[str, str], list[LogTable]] = {}
        for (dtype, layout), pts in groups.items():
            measured = {tuple(p) for p, _ in pts}
            swapped = [([p[1], p[0], p[2]], v) for p, v in pts if (p[1], p[0], p[2]) not in measured]
            label = f"gemm {dtype} {'pooled layouts' if layout == '*' else layout}"
            both = pts + swapped
            out[(dtype, layout)] = [LogTable([p for p, _ in both], [v for _, v in both], label)]
        return out

    def _grouped_tables(self) -> dict[str, list[LogTable]]:
        groups: dict[str, list[tuple[list[float], float]]] = defaultdict(list)
        for r in self.rows.grouped_gemm:
            groups[r.dtype].append((_log2(r.groups, r.m, r.n, r.k), math.log(2.0 * r.groups * r.m * r.n * r.k
                                                                             / r.time_s)))
        return {d: [LogTable([p for p, _ in pts], [v for _, v in pts], f"grouped_gemm {d}")]
                for d, pts in groups.items()}

    def _attention_tables(self) -> dict[tuple[str, int, bool, str], list[LogTable]]:
        groups: dict[tuple[str, int, bool, str], list[tuple[list[float], float]]] = defaultdict(list)
        for r in self.rows.attention:
            full = 4.0 * r.batch * r.heads * r.seq_q * r.seq_kv * r.head_dim  # QK^T + PV, d_qk = d_v
            flop = full * (0.5 if r.causal else 1.0) * (2.0 if r.direction == "bwd" else 1.0)
            key = (r.direction, r.head_dim, r.causal, _dtype_class(r.dtype))
            groups[key].append((_log2(r.batch * r.heads, r.seq_q, r.seq_kv), math.log(flop / r.time_s)))
        return {k: [LogTable([p for p, _ in pts], [v for _, v in pts],
                             f"attention {k[0]} d={k[1]}{' causal' if k[2] else ''}")] for k, pts in groups.items()}

    def _fitted_fabric(self, base: Fabric | None) -> Fabric | None:
        """The base fabric with the calibration's collective curves and the tiers they imply. Where the curves were
        measured on another fabric (`measured_on`: a shipped calibration's machine, when this cluster has other
        NICs, links or GPUs per node), they are fitted on that one, and each fitted tier's bandwidth is scaled by
        this cluster's analytic tier bandwidth over the measured machine's (the efficiency the measurement shows,
        kept); the curves then scale per placement (collectives._scaled_segment_time_s)."""
        rows = [r for r in self.rows.collective if r.n_nodes is not None and r.size_bytes > 0]
        if base is None or not rows:
            return base
        from projection.calibrate.errors import CalibrationError
        from projection.calibrate.fit import fit_calibration

        calibration = self.rows
        ref = self.measured_on
        if ref is not None and replace(ref, oversubscription=base.oversubscription,
                                       inter_topology=base.inter_topology) == base:
            ref = None  # the same machine: the curves price this cluster as they are
        try:
            if ref is None:
                return fit_calibration(calibration, base).apply(base)
            fitted = fit_calibration(calibration, ref).apply(ref)
        except CalibrationError:  # no group could be fitted (one size each, latency-bound): the device's fabric
            return base
        return replace(base, curves=fitted.curves, measured_on=replace(fitted, curves=()),
                       intra=_scaled_tier(fitted.intra, base.intra, ref.intra),
                       inter=_scaled_tier(fitted.inter, base.inter, ref.inter))
