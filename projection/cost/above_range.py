"""A collective above the largest size its measured curve was fitted to (projection/cost/calibrated.py).

Nothing was measured there, so the curve's last segment is an extrapolation. A sweep cut short (nccl-tests
`-e 8M`) ends in a segment fitted where NCCL still runs its low-latency protocols on few channels: its bus bandwidth
is a fraction of the large-message one (A100 8 x all_reduce cut at 8 MiB: 147 GB/s from 2.8 MiB, against 233 GB/s
from 11 MiB up in the full sweep to 8 GiB), and carried to a 64 MiB tensor-parallel all-reduce it made TP a third
slower than the full sweep does. The README's rule for a calibrated model is the roofline outside the measured range;
a bus bandwidth does not fall as the message grows (the tuner moves to LL128 and Simple and more channels: NVIDIA/nccl
src/graph/tuning.cc), so the bytes beyond the largest measured size S_max are carried at the faster of

* the last segment's bandwidth (what was measured; an NVLS sweep can beat the device YAML's ring figure), and
* the roofline's: the analytic fabric of the device YAML (`Fabric.from_specs`: link bandwidth x its ring efficiency)
  for this group and kind,

on top of the time at S_max (so the price stays continuous and never falls as the size grows):

    t(S) = t(S_max) + min(t_curve(S) - t_curve(S_max), t_roofline(S) - t_roofline(S_max)),  S > S_max.

Inside the measured sizes nothing changes. Below the smallest measured size the curve's own rules apply
(`MeasuredCurve.covers`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from projection.cost.collectives import CollectiveKind, Fabric, GroupPlacement, MeasuredCurve, collective_time_s


def largest_measured_bytes(curve: MeasuredCurve | None) -> int:
    """The largest size the curve was fitted to (0: not recorded, or no curve)."""
    return max((s.last_bytes for s in curve.segments), default=0) if curve is not None else 0


def above_range_s(kind: CollectiveKind, size_bytes: float, group: GroupPlacement, curve: MeasuredCurve | None,
                  roofline: Fabric | None, priced: Callable[[float], float]) -> tuple[float, str]:
    """Seconds of `size_bytes` per the module rule (priced: the calibrated price at a size) and what carried the
    bytes beyond S_max: "" (inside the measured sizes, or no roofline: the price as it is), "roofline" or
    "segment"."""
    hi = largest_measured_bytes(curve)
    t = priced(size_bytes)
    if roofline is None or not hi or size_bytes <= hi:
        return t, ""
    bare = replace(roofline, curves=(), measured_on=None)
    at_hi = priced(float(hi))
    by_roofline = collective_time_s(kind, size_bytes, group, bare) - collective_time_s(kind, float(hi), group, bare)
    by_segment = t - at_hi
    if by_roofline < by_segment:
        return at_hi + max(by_roofline, 0.0), "roofline"
    return at_hi + max(by_segment, 0.0), "segment"
