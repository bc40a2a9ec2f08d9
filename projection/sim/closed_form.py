"""Closed-form step time and bubble ratio of uniform pipelines, vectorised: numpy arrays (or scalars) in, arrays out.

For pruning sweeps before the exact engines run. Every stage costs the same; all times are seconds per virtual stage
(chunk) and microbatch: f forward, b full backward (= i + w), w weight-gradient part, L p2p seconds per boundary
crossing (each stage on its own rank, looped placement). p = pp ranks, m microbatches, v = vpp chunks per rank.

The step is the longest path through the schedule's dependency graph, so each form below is a maximum of linear
functions of (f, i, w, L) whose coefficients count the passes and boundary crossings on a candidate critical path.
They were derived by hand for the orders of projection.schedule and checked against dag.walk (which they equal to
rounding error in the stated domains; tests/property/test_sim_differential.py):

gpipe (v = 1)  (m + p - 1)(f + b) + 2 (p - 1) L: the first microbatch's forward and the last one's backward each
               cross p - 1 boundaries.
1f1b           (m + p - 1)(f + b) + 2 (p - 1) L + 2 L (m - 2 - floor((m - 2) / p)). The naive (m + p - 1)(f + b)
               misses the last term: in the steady state a microbatch's forward and backward each wait one p2p per
               1F1B cycle, except once every p microbatches when the warm-up slack absorbs it.
interleaved    max over (f, b) orderings of (m v + p - 1)(f + b) + 2 (p v - 1) L and
(Megatron,     (N - (v - 1)(m - p)) f + N b + (2 (p v - 1) + (v - 1)(m - p)) L, N = m v + p - 1. Exact for group
 group = p)    size p (m a multiple of p) when L <= min(f, b) per chunk; beyond that the ring of p ranks becomes
               latency bound and the form is a lower bound.
zb_h1          the maximum of five paths (q = floor((m - 2) / p)):
               max(m, p) f + (m + p - 1) i + m w + 2 (p - 1) L;
               (m + p - 1) f + max(m, p) i + W2 w + L2 L;   (m + p - 1) f + m (i + w) + min(3 (p - 1), L2) L;
               (m + p - 1)(f + i) + W4 w + L4 L;   (m + p - 1)(f + i) + (m - p + 1) w + min(4 (p - 1), L4) L;
               L4 = 2 (p - 1) + 2 (m - 2) - 2 q, L2 = L4 - (p - 1) + max(0, p - m), W2 = min(m, q + p + 1),
               W4 = max(1, W2 - p + 1). With L = 0 and f = i = w this is 3m + p - 1: the paper's bubble
               (p - 1)(f + i - w) (Qi et al. 2023, section 3).
Bubble ratio = 1 - (busy per rank) / step = 1 - m v (f + b) / step (Primus pp_vis's definition).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
CLOSED_FORMS = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")


def _f(x: ArrayLike) -> FloatArray:
    return np.asarray(x, dtype=np.float64)


def _i(x: ArrayLike) -> NDArray[np.int64]:
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"pp, microbatches and vpp must be integers, got {a.dtype}")
    return a.astype(np.int64)


def gpipe_step_s(pp: ArrayLike, m: ArrayLike, f_s: ArrayLike, b_s: ArrayLike, p2p_s: ArrayLike = 0.0) -> FloatArray:
    """GPipe (one stage per rank): all forwards, then all backwards."""
    p, n, f, b, lat = _i(pp), _i(m), _f(f_s), _f(b_s), _f(p2p_s)
    return np.asarray((n + p - 1) * (f + b) + 2 * (p - 1) * lat, dtype=np.float64)


def one_f_one_b_step_s(pp: ArrayLike, m: ArrayLike, f_s: ArrayLike, b_s: ArrayLike,
                       p2p_s: ArrayLike = 0.0) -> FloatArray:
    """1F1B (PipeDream-Flush), including the p2p wait of the steady-state cycle."""
    p, n, f, b, lat = _i(pp), _i(m), _f(f_s), _f(b_s), _f(p2p_s)
    steady = (n - 2) - (n - 2) // p  # integer counts: floor division of integers, not of times
    return np.asarray((n + p - 1) * (f + b) + 2 * (p - 1) * lat + 2 * lat * steady, dtype=np.float64)


def interleaved_step_s(pp: ArrayLike, m: ArrayLike, vpp: ArrayLike, f_s: ArrayLike, b_s: ArrayLike,
                       p2p_s: ArrayLike = 0.0) -> FloatArray:
    """Megatron interleaved 1F1B with the default group size pp (m a multiple of pp); f, b per chunk. vpp = 1
    falls back to 1F1B, as Megatron does."""
    p, n, v, f, b, lat = _i(pp), _i(m), _i(vpp), _f(f_s), _f(b_s), _f(p2p_s)
    lat = np.where(p > 1, lat, 0.0)  # one rank: every stage is local, no p2p
    big_n = n * v + p - 1
    lat_base = 2 * (p * v - 1)
    lag = (v - 1) * (n - p)
    out = np.maximum.reduce([big_n * (f + b) + lat_base * lat,
                             (big_n - lag) * f + big_n * b + (lat_base + lag) * lat,
                             big_n * f + (big_n - lag) * b + (lat_base + lag) * lat])
    return np.asarray(np.where(v == 1, one_f_one_b_step_s(p, n, f, b, lat), out), dtype=np.float64)


def zb_h1_step_s(pp: ArrayLike, m: ArrayLike, f_s: ArrayLike, b_s: ArrayLike, w_s: ArrayLike,
                 p2p_s: ArrayLike = 0.0) -> FloatArray:
    """ZB-H1 (Qi et al. 2023) as built by projection.schedule.zero_bubble; b = i + w, w the weight-gradient part."""
    p, n, f, b, w, lat = _i(pp), _i(m), _f(f_s), _f(b_s), _f(w_s), _f(p2p_s)
    i = b - w
    q = (n - 2) // p
    l4 = 2 * (p - 1) + 2 * (n - 2) - 2 * q
    l2 = l4 - (p - 1) + np.maximum(0, p - n)
    w2 = np.minimum(n, q + p + 1)
    w4 = np.maximum(1, w2 - p + 1)
    top, mp = n + p - 1, np.maximum(n, p)
    return np.asarray(np.maximum.reduce([
        mp * f + top * i + n * w + 2 * (p - 1) * lat,
        top * f + mp * i + w2 * w + l2 * lat,
        top * f + n * (i + w) + np.minimum(3 * (p - 1), l2) * lat,
        top * (f + i) + w4 * w + l4 * lat,
        top * (f + i) + (n - p + 1) * w + np.minimum(4 * (p - 1), l4) * lat,
    ]), dtype=np.float64)


def step_time_s(schedule: str, pp: ArrayLike, m: ArrayLike, f_s: ArrayLike, b_s: ArrayLike, *, vpp: ArrayLike = 1,
                w_s: ArrayLike | None = None, p2p_s: ArrayLike = 0.0) -> FloatArray:
    """Step seconds of `schedule` (one of CLOSED_FORMS) for uniform stages; arguments broadcast like numpy.
    `w_s` (default b/2) only matters for zb_h1."""
    if schedule == "gpipe":
        if np.any(np.asarray(vpp) != 1):
            raise ValueError("the gpipe closed form covers vpp = 1 only")
        return gpipe_step_s(pp, m, f_s, b_s, p2p_s)
    if schedule == "1f1b":
        return one_f_one_b_step_s(pp, m, f_s, b_s, p2p_s)
    if schedule == "interleaved_1f1b":
        return interleaved_step_s(pp, m, vpp, f_s, b_s, p2p_s)
    if schedule == "zb_h1":
        w = 0.5 * _f(b_s) if w_s is None else w_s
        return zb_h1_step_s(pp, m, f_s, b_s, w, p2p_s)
    raise ValueError(f"no closed form for {schedule!r}; closed forms exist for {', '.join(CLOSED_FORMS)}")


def is_exact(schedule: str, pp: int, m: int, f_s: float, b_s: float, *, vpp: int = 1, p2p_s: float = 0.0) -> bool:
    """Whether `step_time_s` is exact for these values (f, b per chunk) or only a lower bound: the interleaved form
    is exact for m a multiple of pp and p2p at most a chunk's f and b (module docstring); the others everywhere."""
    if schedule != "interleaved_1f1b" or vpp == 1 or pp == 1:
        return True
    return p2p_s <= min(f_s, b_s) and m % pp == 0


def bubble_ratio(schedule: str, pp: ArrayLike, m: ArrayLike, f_s: ArrayLike, b_s: ArrayLike, *, vpp: ArrayLike = 1,
                 w_s: ArrayLike | None = None, p2p_s: ArrayLike = 0.0) -> FloatArray:
    """1 - m * vpp * (f + b) / step: the idle fraction of every rank (uniform stages keep ranks equally busy)."""
    step = step_time_s(schedule, pp, m, f_s, b_s, vpp=vpp, w_s=w_s, p2p_s=p2p_s)
    busy: Any = _i(m) * _i(vpp) * (_f(f_s) + _f(b_s))
    return np.asarray(1.0 - busy / step, dtype=np.float64)
