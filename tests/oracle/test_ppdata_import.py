"""Primus measured pp_data dumps (fixtures/pp_data: Megatron via Primus, 8 GPUs, 64 layers, GBS 16, pp 8 with and
without vpp 2, 20 iterations): import, sanity of the rebuilt order, and the simulator on the measured durations.

The dumps hold only fwd/bwd start/end lists; the importer assigns microbatches and chunks in Megatron's execution
order. Causality checks that assignment: every F(s, mb) starts after F(s-1, mb) ends on the previous rank, and every
B(s, mb) after B(s+1, mb), up to the ranks' clock offsets (under 1 ms; a wrong assignment is off by whole passes,
30-75 ms). Then the same schedule (1F1B, interleaved 1F1B), simulated with the measured mean F and B
per virtual stage and the measured p2p time, must match the measured iteration time within 5% (mean of iterations
2..20; the first is warm-up). The numbers are printed (pytest -s).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from projection.errors import ConfigError
from projection.report.ppvis import load_pp_data
from projection.schedule.registry import build_schedule
from projection.sim.dag import walk

PP_DATA = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "pp_data"
ROOT = PP_DATA / "pp_data_example" / "gpu8_layer64_gbs16"
SKEW_S = 0.002  # ranks time their passes against their own iteration-start event: sub-ms offsets (worst seen 0.71 ms)
CASES = [("pp8", "1f1b", 1), ("pp8_vpp2", "interleaved_1f1b", 2)]

pytestmark = pytest.mark.skipif(not ROOT.is_dir(), reason=f"fixture {ROOT} not present")


@pytest.mark.parametrize(("case", "name", "vpp"), CASES)
def test_import(case: str, name: str, vpp: int) -> None:
    mp = load_pp_data(ROOT / case)
    assert (mp.pp, mp.vpp, mp.n_microbatches, len(mp.iterations)) == (8, vpp, 16, 20)
    for it in mp.iterations:
        for acts in it.ranks:
            for kind in "FB":
                seen = sorted((a.microbatch, a.chunk) for a in acts if a.kind == kind)
                assert seen == [(mb, c) for mb in range(16) for c in range(vpp)]
        end = {(a.kind, a.chunk * 8 + r, a.microbatch): a for r, acts in enumerate(it.ranks) for a in acts}
        for (kind, s, mb), a in end.items():
            before = ("F", s - 1, mb) if kind == "F" else ("B", s + 1, mb)
            if before in end:
                assert a.start_s >= end[before].end_s - SKEW_S, (case, it.iteration, kind, s, mb)
    assert 0.2 < mp.bubble_ratio() < 0.45


@pytest.mark.parametrize(("case", "name", "vpp"), CASES)
def test_simulation_matches_measured_iterations(case: str, name: str, vpp: int) -> None:
    mp = load_pp_data(ROOT / case)
    sched = build_schedule(name, 8, 16, vpp)
    res = walk(sched, mp.stage_costs(skip=1))
    measured = mp.step_time_s(skip=1)
    per_iter = []
    for it in mp.steady(1):
        one = mp.select([it.iteration])
        per_iter.append(walk(sched, one.stage_costs(skip=0)).step_time_s / it.step_time_s - 1)
    err = res.step_time_s / measured - 1
    print(f"\n{case} ({name}, vpp {vpp}): measured {measured * 1e3:.1f} ms per iteration (mean of "
          f"{len(mp.steady(1))}), simulated {res.step_time_s * 1e3:.1f} ms, error {err:+.2%}; "
          f"bubble measured {mp.bubble_ratio():.3f}, simulated {res.bubble_ratio:.3f}; p2p "
          f"{mp.p2p_estimate_s() * 1e3:.3f} ms; per-iteration errors (each simulated on its own durations) "
          f"median {statistics.median(per_iter):+.2%}, range {min(per_iter):+.2%} .. {max(per_iter):+.2%}")
    # the README's claim (within 2.4 %; measured -2.35 % and -1.92 %); per-iteration medians -1.74 / -1.29 %,
    # bubble ratios 0.016 / 0.013 below measured
    assert res.step_time_s == pytest.approx(measured, rel=0.024)
    assert statistics.median(per_iter) == pytest.approx(0.0, abs=0.02)
    assert res.bubble_ratio == pytest.approx(mp.bubble_ratio(), abs=0.02)


def test_bad_dump_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.json"):
        load_pp_data(tmp_path)
    (tmp_path / "config.json").write_text('{"pp_size": 2, "vp_size": 1, "num_mbs": 2}')
    with pytest.raises(ConfigError, match="pp_rank_0.json"):
        load_pp_data(tmp_path)
