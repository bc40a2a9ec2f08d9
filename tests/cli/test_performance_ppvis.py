"""`projection performance --pp-vis DIR`: the projected pipeline as Primus pp_vis JSON (primus-projection.md §3),
read back by the importer of Primus's measured pp_data dumps (projection.report.ppvis.load_pp_data), so a projection
and a measured run can be set side by side in Primus's viewer or compared here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from projection import api
from projection.memory.estimate import estimate_memory
from projection.report.ppvis import load_pp_data
from tests.cli.test_performance_cli import LLAMA, perf, perf_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3.1_70B-mi300x.yaml"  # pp 4, vpp 5, 128 microbatches: interleaved 1F1B


def test_the_dump_reads_back_as_the_projected_pipeline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every forward and backward of every (microbatch, virtual stage) once, the iteration time the simulated
    pipeline's (the step less the optimizer after it), and the viewer's bubble ratio, computed from the files by the
    pp_data importer, equal to the one the projection reports."""
    doc = perf_json(capsys, "--config", str(EXAMPLE), "--pp-vis", str(tmp_path))
    folder = tmp_path / doc["schedule"]
    assert doc["wrote"] == [str(folder)]
    measured = load_pp_data(folder)
    assert (measured.pp, measured.vpp, measured.n_microbatches) == (4, 5, doc["n_microbatches"])
    (it,) = measured.iterations
    for kind in ("F", "B"):
        seen = sorted((a.microbatch, a.chunk * measured.pp + r) for r, acts in enumerate(it.ranks) for a in acts
                      if a.kind == kind)
        assert seen == sorted((mb, s) for mb in range(measured.n_microbatches) for s in range(20))
    tail = max(o + g for o, g in zip(doc["optimizer_s"], doc["param_gather_exposed_s"], strict=True))
    assert it.step_time_s == pytest.approx(doc["step_time_s"] - tail, rel=1e-9)
    assert it.bubble_ratio == pytest.approx(doc["bubble_ratio"], rel=1e-9)


def test_the_activation_track_peaks_at_the_memory_estimate(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Each rank's activation track (a microbatch's saved bytes added at its forward, freed at its backward, walked
    along the simulated timeline) peaks where the memory estimate, which counts the microbatches in flight from the
    schedule's action lists, puts that rank's peak."""
    doc = perf_json(capsys, "--config", str(EXAMPLE), "--pp-vis", str(tmp_path))
    report = estimate_memory(api.load(EXAMPLE))
    for r in report.ranks:
        dumped = json.loads((tmp_path / doc["schedule"] / f"pp_rank_{r.pp_rank}.json").read_text())["0"]
        saved = sum(n * r.microbatch_activation_bytes[st] for st, n in r.inflight.items())
        assert saved > 0
        assert dumped["memory"] == pytest.approx(saved / 2**30, rel=1e-9)
        assert max(dumped["activation_memory_usage"]) == dumped["memory"]
        assert dumped["activation_memory_usage"][-1] == pytest.approx(0.0, abs=1e-9)  # every microbatch freed


def test_schedule_all_writes_one_folder_per_schedule(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = perf_json(capsys, "--config", str(LLAMA), "--schedule", "all", "--pp-vis", str(tmp_path))
    names = [p["schedule"] for p in doc["schedules"]]
    assert len(names) > 1
    assert doc["wrote"] == [str(tmp_path / n) for n in names]
    for p in doc["schedules"]:
        assert load_pp_data(tmp_path / p["schedule"]).iterations[0].bubble_ratio == pytest.approx(
            p["bubble_ratio"], rel=1e-9)


def test_a_pp_vis_file_that_is_an_input_is_refused_and_nothing_is_written(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A calibration JSON where the dump would put its config.json: exit 2 naming --pp-vis, the calibration
    untouched, and the --trace asked for beside it not written either."""
    doc = perf_json(capsys, "--config", str(LLAMA))
    cal = tmp_path / doc["schedule"] / "config.json"
    cal.parent.mkdir()
    cal.write_text((REPO / "calibrations" / "mi300x.json").read_text())
    before = cal.read_text()
    trace = tmp_path / "trace.json"
    code, out, err = perf(capsys, "--config", str(LLAMA), "--calibration", str(cal), "--pp-vis", str(tmp_path),
                          "--trace", str(trace))
    assert code == 2 and "Traceback" not in err and "--pp-vis" in err and str(cal) in err
    assert cal.read_text() == before and not trace.exists() and out == ""


def test_a_pp_vis_folder_under_a_file_is_refused_before_any_work(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = perf(capsys, "--config", str(LLAMA), "--pp-vis", str(blocker / "out"))
    assert code == 2 and "--pp-vis" in err and "is not a directory" in err
