"""`projection plan` against `projection performance` / `projection memory` with the equivalent --set: a framework
file searched from a searched base carries the framework's own keys for every axis (Primus's zero-bubble schedule and
its refusals, the DeepEP dispatcher), a refused row lists every reason the loader gives, and --top K holds in JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from projection import api
from projection.cli import main
from projection.errors import ProjectionError

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures"
MI300X = FIXTURES / "primus" / "examples" / "megatron" / "configs" / "MI300X"
LLAMA = MI300X / "llama3.1_8B-BF16-pretrain.yaml"
MIXTRAL = MI300X / "mixtral_8x7B_v0.1-BF16-pretrain.yaml"
TITAN = FIXTURES / "torchtitan" / "llama3_8b.toml"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"shared fixtures absent at {FIXTURES}")
# zero bubble on a file whose own layout (mbs 2, dp 32 > global batch 24) fails on 4 nodes: plan starts from a
# searched layout
ZB = {"patch_zero_bubble": "true", "overlap_grad_reduce": "false", "overlap_param_gather": "false",
      "gradient_accumulation_fusion": "true", "global_batch_size": "24"}


def _sets(overrides: dict[str, str]) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]


def _plan(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict[str, Any]]:
    assert main(["plan", *argv, "--format", "json"]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["candidates"]
    return rows


def _performance(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(["performance", *argv, "--format", "json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@needs_fixtures
def test_primus_rows_from_a_searched_base_are_what_performance_gives(capsys: pytest.CaptureFixture[str]) -> None:
    """Every row, the one sharing the starting layout's tp and pp included, is priced with Primus's rules for its own
    layout: tp 1 pp 4 runs zb_h1 at 0.9917 s (it was 1f1b 1.23 s, checked against the file's pp)."""
    rows = _plan(capsys, ["--config", str(LLAMA), "--nodes", "4", *_sets(ZB), "--tp", "1,2", "--pp", "2,4",
                          "--mbs", "1"])
    fitting = [r for r in rows if r["status"] == "fits"]
    assert {(r["tp"], r["pp"]) for r in fitting} == {(1, 4), (2, 2), (2, 4)}
    for row in fitting:
        perf = _performance(capsys, ["--config", str(LLAMA), "--nodes", "4", *_sets(ZB), *_sets({
            "tensor_model_parallel_size": row["tp"], "pipeline_model_parallel_size": row["pp"],
            "micro_batch_size": "1"})])
        assert row["schedule"] == perf["schedule"] == "zb_h1", row
        assert row["step_time_s"] == pytest.approx(perf["step_time_s"], rel=1e-9)


@needs_fixtures
def test_primus_refusals_follow_the_layout_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """Without gradient-accumulation fusion Primus refuses zero bubble (performance exits 2): no row fits, each says
    why (tp 1 pp 4 used to fit, checked against the file's pp 1)."""
    zb = {**ZB, "gradient_accumulation_fusion": "false"}
    rows = _plan(capsys, ["--config", str(LLAMA), "--nodes", "4", *_sets(zb), "--tp", "1,2", "--pp", "2,4",
                          "--mbs", "1"])
    assert [r["status"] for r in rows] == ["refused"] * 4
    assert all(any("gradient-accumulation fusion" in p for p in r["problems"]) for r in rows)
    assert main(["performance", "--config", str(LLAMA), "--nodes", "4", *_sets(zb),
                 "--set", "pipeline_model_parallel_size=4", "--set", "micro_batch_size=1"]) == 2
    capsys.readouterr()


@needs_fixtures
def test_primus_moe_dispatcher_follows_the_rows_tp(capsys: pytest.CaptureFixture[str]) -> None:
    """Mixtral on 4 nodes starts from tp 2 (its own tp 1 fails the global batch): the tp 2 row is priced with the
    dispatcher Primus picks at tp 2 (it was 0.980 s with the tp 1 'flex' dispatcher; performance gives 0.9944 s)."""
    rows = _plan(capsys, ["--config", str(MIXTRAL), "--nodes", "4", "--tp", "1,2,4"])
    for row in (r for r in rows if r["status"] == "fits"):
        perf = _performance(capsys, ["--config", str(MIXTRAL), "--nodes", "4",
                                     "--set", f"tensor_model_parallel_size={row['tp']}"])
        assert row["schedule"] == perf["schedule"]
        assert row["step_time_s"] == pytest.approx(perf["step_time_s"], rel=1e-9)
    assert {r["tp"] for r in rows if r["status"] == "fits"} == {2, 4}


@needs_fixtures
def test_a_refused_torchtitan_row_lists_every_loader_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """tp 3 on 32 GPUs: the row lists what `projection memory --set parallelism.tensor_parallel_degree=3` lists
    (world size, heads, KV heads, ffn, sequence), not the world size alone."""
    rows = _plan(capsys, ["--config", str(TITAN), "--nodes", "4", "--tp", "3"])
    with pytest.raises(ProjectionError) as err:
        api.load(TITAN, nodes=4, overrides={"parallelism.tensor_parallel_degree": 3})
    expected = [p.message for p in err.value.problems]
    assert len(expected) >= 5
    assert [r["status"] for r in rows] == ["refused"]
    assert rows[0]["problems"] == expected


def test_top_limits_the_fitting_layouts_in_json_as_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    """--top 2: two fitting layouts in JSON, as in the table; every out-of-memory and refused one in both."""
    argv = ["--config", str(REPO / "examples" / "llama3.1_70B-mi300x.yaml"), "--nodes", "4", "--tp", "2,4,8",
            "--pp", "1,2,4,8"]
    everything = _plan(capsys, argv)
    rows = _plan(capsys, [*argv, "--top", "2"])
    fits = [r for r in everything if r["status"] in ("fits", "at risk")]  # projected, fastest first
    assert len(fits) > 2
    assert rows == fits[:2] + [r for r in everything if r["status"] not in ("fits", "at risk")]
    assert main(["plan", *argv, "--top", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    listed = [line for line in table[2:] if not line.startswith("refused")]
    assert len(listed) == 2 + sum(r["status"] == "out of memory" for r in rows)
    assert sum(line.startswith("refused") for line in table) == sum(r["status"] == "refused" for r in rows)


class _Terminal:
    """A stand-in for a terminal's stderr: what is written, and isatty() True."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_a_long_search_shows_its_progress_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A search of thousands of layouts ran for minutes printing nothing (fuzz audit): on a terminal, `plan: done /
    all layouts` is redrawn while it runs (here from the first layout on) and erased before the table; a pipe or a
    log gets nothing. The API's callback counts every layout once, in order."""
    import projection.cli_plan as cli_plan
    from projection.perf.search import search_layouts

    config = str(REPO / "examples" / "llama3.1_70B-mi300x.yaml")
    argv = ["plan", "--config", config, "--tp", "4,8", "--pp", "2,4", "--top", "1"]
    assert main(argv) == 0
    piped = capsys.readouterr()
    assert "plan:" not in piped.err and "layouts of" in piped.out
    monkeypatch.setattr(cli_plan, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(cli_plan, "PROGRESS_EVERY_S", 0.0)
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(argv) == 0
    assert terminal.text == "".join(f"\rplan: {i} / 4 layouts" for i in range(1, 5)) + "\r\033[K", terminal.text
    assert capsys.readouterr().out == piped.out
    calls: list[tuple[int, int]] = []
    search_layouts(api.load(config), tp=[4, 8], pp=[2, 4], progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i, 4) for i in range(1, 5)]
