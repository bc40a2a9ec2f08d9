"""Bubble ratios of the simulated built-in schedules against the published closed forms (p2p latency zero).

Source: primus-projection.md §8.2, quoting Primus's pipeline documentation (docs_deprecated/tech_blogs/
primus_pipeline/primus_pipeline.md), p = pp, m = microbatches, v = chunks per rank:
  1F1B (p-1)/(m+p-1); interleaved (p-1)/(m v+p-1); ZB1P (p-1)/(3(m+p-1)); ZBV (p-1)/(p-1+6m).
Our bubble ratio is Primus pp_vis's, 1 - busy / step per rank. The interleaved, 1F1B and ZBV formulas are that
quantity. ZB1P's is the ZB-H1 bubble time (p-1)(F + I - W) measured against the 1F1B step 3(m+p-1) (every pass one
unit); as a share of ZB-H1's own step the same bubble is (p-1)/(3m+p-1). Both are checked. Equal F, I, W (chunk)
costs are what the formulas assume; ZB1P and ZBV also hold with B = I + W split in any ratio where stated.
"""

from __future__ import annotations

import pytest

from projection.schedule.registry import build_schedule
from projection.sim import closed_form
from projection.sim.costs import StageCosts
from projection.sim.dag import walk

GRID = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 3 * p, 8 * p)]


def ratio(name: str, p: int, m: int, v: int, f: float = 1.0, b: float = 2.0) -> float:
    s = build_schedule(name, p, m, v)
    res = walk(s, StageCosts.uniform(s.n_stages, f, b, b / 2, 0.0))
    assert res.bubble_ratio == pytest.approx(1 - m * len(s.route(0)) / p * (f + b) / res.step_time_s)
    return res.bubble_ratio


@pytest.mark.parametrize(("p", "m"), GRID)
def test_1f1b_and_gpipe(p: int, m: int) -> None:
    expected = (p - 1) / (m + p - 1)
    for f, b in ((1.0, 2.0), (0.7, 1.9)):
        assert ratio("1f1b", p, m, 1, f, b) == pytest.approx(expected, rel=1e-12)
        assert ratio("gpipe", p, m, 1, f, b) == pytest.approx(expected, rel=1e-12)
    assert float(closed_form.bubble_ratio("1f1b", p, m, 1.0, 2.0)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("p", "m"), GRID)
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved(p: int, m: int, v: int) -> None:
    expected = (p - 1) / (m * v + p - 1)
    assert ratio("interleaved_1f1b", p, m, v) == pytest.approx(expected, rel=1e-12)
    assert float(closed_form.bubble_ratio("interleaved_1f1b", p, m, 1.0, 2.0, vpp=v)) == pytest.approx(expected)


@pytest.mark.parametrize(("p", "m"), GRID)
def test_zb1p(p: int, m: int) -> None:
    s = build_schedule("zb_h1", p, m)
    res = walk(s, StageCosts.uniform(p, 1.0, 2.0, 1.0, 0.0))  # F = I = W = 1
    bubble = res.step_time_s - res.busy_s[0]
    assert all(b == res.busy_s[0] for b in res.busy_s)
    assert bubble / (3 * (m + p - 1)) == pytest.approx((p - 1) / (3 * (m + p - 1)), rel=1e-12)
    assert res.bubble_ratio == pytest.approx((p - 1) / (3 * m + p - 1), rel=1e-12)
    # the paper's form with B split unevenly (W <= I, W <= F): bubble (p-1)(F + I - W)
    res = walk(s, StageCosts.uniform(p, 1.3, 2.5, 0.9, 0.0))
    assert res.step_time_s - res.busy_s[0] == pytest.approx((p - 1) * (1.3 + 1.6 - 0.9), rel=1e-12)


@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (2, 3, 4, 8) for m in (2 * p, 3 * p, 8 * p)])
def test_zbv(p: int, m: int) -> None:
    assert ratio("zbv", p, m, 2) == pytest.approx((p - 1) / (p - 1 + 6 * m), rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zb_h2_has_no_bubble_inside_a_rank(p: int) -> None:
    """ZB-H2 (F = I = W): each rank, once started, runs without a gap (the paper's parallelogram); the only idle
    time is the start-up skew, so the ratio equals ZB-H1's."""
    m = 3 * p
    res = walk(build_schedule("zb_h2", p, m), StageCosts.uniform(p, 1.0, 2.0, 1.0, 0.0))
    for t in res.timeline:
        assert t[-1].end_s - t[0].start_s == pytest.approx(3 * m)
    assert res.bubble_ratio == pytest.approx((p - 1) / (3 * m + p - 1))
