"""Roofline cost model: datasheet peaks of the DeviceSpec, scaled by its size-dependent efficiency curves.

- GEMM / grouped GEMM: max(flop / (peak[dtype] * eff_gemm(flop)), bytes / (hbm * eff_memory(bytes))), the roofline
  of Williams et al. 2009 with Calculon's size-dependent efficiency (Isaev et al. 2023, "Calculon", §3: matrix and
  vector efficiency as a function of the operation's size).
- Attention: hardware FLOPs / (peak * eff_attention(forward FLOP of the call)). The backward runs 2.5x the forward's
  FLOPs (FlashAttention-2 §3.1.2, Dao 2023: dQ, dK, dV, dP and the recomputed scores), i.e. 1.25x the op's
  model-FLOP count (2x the forward); the efficiency curve is read at the forward-equivalent size.
- Memory-bound: bytes / (hbm * eff_memory(bytes)).
- Collectives: the analytic alpha-beta model of projection/cost/collectives.py on the cluster's fabric.
Curves are piecewise linear in log(size) between their points and flat beyond them; a missing curve means
efficiency 1 (the bare datasheet roofline). A 16-bit or 8-bit dtype without a peak uses the nearest one and says
so. fp32 matrix math is never priced at a half-precision peak (15x the FP32 rate on an H100). Where the device has
TF32 tensor cores (`peak_flop_per_s.tf32`) it runs there: Transformer Engine's fp32 GEMMs always do (its cuBLASLt
GEMM uses TF32 for pure-fp32 inputs), and PyTorch's do in NVIDIA's containers (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1);
it takes the bf16 efficiency curve (A: the same tensor-core efficiency at the same FLOP count). Otherwise it runs at
`peak_flop_per_s.fp32` (AMD CDNA: the FP32 matrix rate), taking max(FLOP / FP32 peak, the same GEMM's bf16 time) (A:
never faster than its FP32 peak, nor than the GEMM in bf16, which bounds its latency at small sizes); a device with
neither peak is refused. The cost sources say which.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from projection.cost.collectives import CollectiveKind, Fabric, GroupPlacement, collective_time_s
from projection.cost.model import collective_op_seconds, group_placements
from projection.errors import ConfigError, Problem
from projection.specs.hardware import ClusterSpec, DeviceSpec
from projection.specs.plan import ParallelPlan
from projection.workload.ops import Op

FLASH_BACKWARD_FACTOR = 2.5 / 2.0  # hardware / model FLOPs of the attention backward (FlashAttention-2 §3.1.2)
_FALLBACK_DTYPES = {"fp16": "bf16", "bf16": "fp16", "tf32": "fp32", "fp8": "bf16", "fp4": "fp8"}
_FULL_PRECISION = ("fp32", "tf32")  # no half-precision peak stands in for these
_PEAK_ORDER = {"fp32": ("tf32", "fp32"), "tf32": ("tf32", "fp32")}  # fp32 matrix math on TF32 tensor cores if any


def interpolate_log(points: Sequence[tuple[float, float]], size: float) -> float:
    """Value at `size` of a curve given as (size, value) points sorted by size: linear in log(size), flat outside."""
    if not points:
        return 1.0
    if size <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if size <= x1:
            t = math.log(size / x0) / math.log(x1 / x0)
            return y0 + t * (y1 - y0)
    return points[-1][1]


NO_CURVE = "at 100 % of the datasheet: the device YAML has no efficiency curve for it"


def peak_dtype(device: DeviceSpec, dtype: str) -> str:
    """The dtype whose peak prices `dtype` on `device` (and that MFU is quoted against): itself if the device lists
    it, else a same-speed or nearest class; fp32 / tf32 only each other, TF32 first (ConfigError when the device lists
    neither)."""
    peaks = device.peak_flop_per_s
    for candidate in _PEAK_ORDER.get(dtype, (dtype, _FALLBACK_DTYPES.get(dtype, "bf16"))):
        if candidate in peaks:
            return candidate
    if dtype in _FULL_PRECISION:
        raise ConfigError(Problem(
            f"device {device.name!r} lists no fp32 (or tf32) peak, so {dtype} matrix math cannot be priced",
            key="peak_flop_per_s.fp32", file=f"the {device.name} device YAML",
            fix="add peak_flop_per_s.fp32 (the FP32 rate an fp32 GEMM runs at) to the device YAML, or train in "
                "bf16 (--set training.params_dtype=bf16)"))
    return "bf16" if "bf16" in peaks else str(next(iter(peaks)))


class RooflineCostModel:
    """Peaks and efficiency curves of one device; collectives on `fabric` (default: analytic, from the specs)."""

    def __init__(self, device: DeviceSpec, cluster: ClusterSpec | None = None, plan: ParallelPlan | None = None,
                 fabric: Fabric | None = None) -> None:
        self.device = device
        self._peaks: dict[str, float] = {str(k): v for k, v in device.peak_flop_per_s.items()}
        eff = device.efficiency
        self._gemm: dict[str, list[tuple[float, float]]] = {
            str(k): [(p.flop, p.efficiency) for p in v] for k, v in (eff.gemm.items() if eff else ())}
        self._attention: dict[str, list[tuple[float, float]]] = {
            str(k): [(p.flop, p.efficiency) for p in v] for k, v in (eff.attention.items() if eff else ())}
        self._memory = [(p.bytes, p.efficiency) for p in eff.memory] if eff else []
        self.fabric = fabric or (Fabric.from_specs(device, cluster) if cluster is not None else None)
        self.groups: Mapping[str, GroupPlacement] = (group_placements(cluster, plan)
                                                     if cluster is not None and plan is not None else {})

    # ---- the CostModel interface
    def op_seconds(self, op: Op) -> float:
        if op.kind == "collective":
            return collective_op_seconds(self, op, self.groups)
        return op.count * self.single_seconds(op)

    def collective_seconds(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> float:
        if self.fabric is None:
            raise ValueError("the roofline cost model prices collectives only when built with a cluster (or fabric)")
        return collective_time_s(kind, size_bytes, group, self.fabric)

    def collective_provenance(self, kind: CollectiveKind, size_bytes: float, group: GroupPlacement) -> str:
        """The analytic fabric prices every collective (CalibratedCostModel says where a curve does)."""
        return "roofline"

    def provenance(self, op: Op) -> str:
        notes = []
        if op.kind in ("gemm", "grouped_gemm", "attention") and self.peak_dtype(op.dtype) != op.dtype:
            notes.append(f"{self.peak_dtype(op.dtype)} peak for {op.dtype}")
        if not self.has_curve(op):
            notes.append(NO_CURVE)
        elif op.kind in ("gemm", "grouped_gemm", "attention") and op.dtype in _FULL_PRECISION:
            table = self._attention if op.kind == "attention" else self._gemm
            if not any(d in table for d in _FULL_PRECISION):
                notes.append(f"bf16 efficiency curve for {op.dtype}" if not self._fp32_floor(op) else
                             f"{op.dtype} at the FP32 peak, at least its bf16 time")
        return f"roofline ({'; '.join(notes)})" if notes else "roofline"

    def has_curve(self, op: Op) -> bool:
        """Whether an efficiency curve prices this op (without one the roofline runs at 100 % of the datasheet)."""
        if op.kind == "memory_bound":
            return bool(self._memory)
        if op.kind == "attention":
            return bool(self._curve(self._attention, op.dtype))
        if op.kind in ("gemm", "grouped_gemm"):
            return bool(self._curve(self._gemm, op.dtype))
        return True

    # ---- pieces, public for the calibrated model's fallback and for tests
    def single_seconds(self, op: Op) -> float:
        """Seconds of one invocation of a compute or memory-bound op."""
        hbm = self.device.hbm_bandwidth_bytes_per_s
        moved = op.bytes_read + op.bytes_written
        memory_s = moved / (hbm * self.memory_efficiency(moved)) if moved > 0 else 0.0
        if op.kind == "memory_bound":
            return memory_s
        peak = self._peaks[self.peak_dtype(op.dtype)]
        if op.kind == "attention":
            forward_flop = op.flop / 2 if op.phase == "I" else op.flop
            hw_flop = op.flop * (FLASH_BACKWARD_FACTOR if op.phase == "I" else 1.0)
            return max(hw_flop / (peak * self.attention_efficiency(op.dtype, forward_flop)), memory_s)
        if op.kind in ("gemm", "grouped_gemm"):
            if self._fp32_floor(op):  # module docstring: FP32 peak, never faster than the bf16 GEMM
                bf16_s = op.flop / (self._peaks["bf16"] * self.gemm_efficiency("bf16", op.flop))
                return max(op.flop / peak, bf16_s, memory_s)
            return max(op.flop / (peak * self.gemm_efficiency(op.dtype, op.flop)), memory_s)
        raise ValueError(f"op kind {op.kind!r} has no compute roofline")

    def peak_seconds(self, op: Op) -> float:
        """The least time a compute op can take: its FLOPs at the datasheet peak of its dtype (flash backward's
        recompute counted). 0 for other kinds: a memory-bound op small enough to stay in cache can beat HBM."""
        if op.kind not in ("gemm", "grouped_gemm", "attention"):
            return 0.0
        hw_flop = op.flop * (FLASH_BACKWARD_FACTOR if op.kind == "attention" and op.phase == "I" else 1.0)
        return hw_flop / self._peaks[self.peak_dtype(op.dtype)]

    def _fp32_floor(self, op: Op) -> bool:
        """An fp32 GEMM priced on the FP32 (not TF32) peak without an fp32 curve of its own."""
        return (op.kind in ("gemm", "grouped_gemm") and op.dtype in _FULL_PRECISION and "bf16" in self._peaks
                and self.peak_dtype(op.dtype) == "fp32" and not any(d in self._gemm for d in _FULL_PRECISION))

    def peak_dtype(self, dtype: str) -> str:
        return peak_dtype(self.device, dtype)

    def gemm_efficiency(self, dtype: str, flop: float) -> float:
        return interpolate_log(self._curve(self._gemm, dtype), flop)

    def attention_efficiency(self, dtype: str, forward_flop: float) -> float:
        return interpolate_log(self._curve(self._attention, dtype), forward_flop)

    def memory_efficiency(self, size_bytes: float) -> float:
        return interpolate_log(self._memory, size_bytes)

    @staticmethod
    def _curve(curves: Mapping[str, list[tuple[float, float]]], dtype: str) -> list[tuple[float, float]]:
        if dtype in curves:
            return curves[dtype]
        if dtype in _FULL_PRECISION:
            other = curves.get("tf32" if dtype == "fp32" else "fp32", [])
            return other or curves.get("bf16", [])  # A: the bf16 GEMMs' achieved fraction of peak, same FLOP count
        return curves.get(_FALLBACK_DTYPES.get(dtype, ""), [])
