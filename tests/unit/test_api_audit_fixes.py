"""The Python API audit's defects (the API and the planning notebook against the CLI), each failing before its fix:
a layout search whose `reload` loads another cluster, framework-scheduled pipelines compared or relabelled without
their framework's rules, an at-risk layout shown as fitting, strong scaling called weak, the plot, and bad
arguments that escaped as TypeError / AttributeError."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from projection import api
from projection.cli import main
from projection.errors import ConfigError, ProjectionError
from projection.perf import compare_schedules, default_cost_model, project
from projection.perf.scaling import extrapolate, scaling_table
from projection.perf.search import search_layouts

REPO = Path(__file__).resolve().parents[2]
L70 = REPO / "examples" / "llama3.1_70B-mi300x.yaml"  # tp 8 pp 4 vpp 5 on 4 MI300X nodes
BRIDGE = REPO / "benchmarks" / "bridge_runs" / "perf_llama3_8b_8xh100_fp8cs.yaml"
FIXTURES = REPO.parent / "shared" / "fixtures"
TITAN = FIXTURES / "torchtitan" / "llama3_8b.toml"
PRIMUS = FIXTURES / "primus" / "examples" / "megatron" / "configs" / "MI300X"
TITAN_PP2 = ["parallelism.pipeline_parallel_degree=2", "training.local_batch_size=8",
             "parallelism.pipeline_parallel_microbatch_size=1"]
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"{FIXTURES} (the shared fixtures) is absent")


def _cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    capsys.readouterr()
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)


# D1: a reload that loads another cluster is refused; api.reloader gives the CLI's numbers


def test_a_reload_on_another_device_or_cluster_is_refused_naming_every_difference() -> None:
    sc = api.load(BRIDGE, hardware="h100-sxm", nodes=1)
    with pytest.raises(ConfigError) as err:
        search_layouts(sc, tp=[1, 2], reload=lambda over: api.load(BRIDGE, overrides=over))
    text = err.value.render()
    assert "reload" in text and "h100-sxm" in text and "mi300x" in text, text
    assert "hardware=" in text, text  # the fix names the arguments to pass


def test_a_reload_that_drops_the_users_overrides_is_refused() -> None:
    cluster: dict[str, Any] = {"hardware": "h100-sxm", "nodes": 1}
    sc = api.load(BRIDGE, overrides={"model.num_layers": 16}, **cluster)
    with pytest.raises(ConfigError) as err:
        search_layouts(sc, tp=[1, 2], reload=lambda over: api.load(BRIDGE, overrides=over, **cluster))
    assert "model.num_layers 32" in err.value.render()


def test_reloader_searches_as_projection_plan_does(capsys: pytest.CaptureFixture[str]) -> None:
    sc = api.load(BRIDGE, hardware="h100-sxm", nodes=1)
    found = search_layouts(sc, tp=[1, 2], pp=[1, 2], reload=api.reloader(BRIDGE, hardware="h100-sxm", nodes=1))
    cli = _cli_json(capsys, "plan", "--config", str(BRIDGE), "--hardware", "h100-sxm", "--nodes", "1",
                    "--tp", "1,2", "--pp", "1,2", "--format", "json")["candidates"]
    assert [(c.tp, c.pp, c.status, c.projection.step_time_s if c.projection else None) for c in found] == [
        (r["tp"], r["pp"], r["status"], r["step_time_s"]) for r in cli]
    assert all(c.scenario is None or c.scenario.cluster == sc.cluster for c in found)


@needs_fixtures
def test_reloader_keeps_the_node_count_it_was_given() -> None:
    path = PRIMUS / "llama3.1_8B-FP8-pretrain.yaml"
    sc = api.load(path, nodes=2)
    found = search_layouts(sc, tp=[1, 2], pp=[1, 2], reload=api.reloader(path, nodes=2))
    assert [c.status for c in found] == ["fits"] * 4 and all(c.scenario.world_size == 16 for c in found)


def test_reloader_checks_its_arguments() -> None:
    with pytest.raises(ConfigError) as err:
        api.reloader(L70, node=4)
    assert "node" in err.value.render() and "nodes" in err.value.render()


# D2: framework-scheduled pipelines are compared as the CLI compares them, and never relabelled


@needs_fixtures
def test_compare_schedules_of_a_torchtitan_pipeline_is_the_clis_schedule_all(
        capsys: pytest.CaptureFixture[str]) -> None:
    sc = api.load(TITAN, overrides=TITAN_PP2)
    with pytest.raises(ConfigError) as err:
        compare_schedules(sc)
    assert "reload" in err.value.render()
    got = compare_schedules(sc, reload=api.reloader(TITAN, overrides=TITAN_PP2).schedule)
    flags = [x for o in TITAN_PP2 for x in ("--set", o)]
    cli = _cli_json(capsys, "performance", "--config", str(TITAN), *flags, "--schedule", "all", "--format", "json")
    assert [(p.schedule, p.step_time_s) for p in got] == [(s["schedule"], s["step_time_s"]) for s in
                                                          cli["schedules"]]
    assert got[0].schedule == "zbv"
    assert [p.memory.verdict for p in got] == [s["memory"]["verdict"] for s in cli["schedules"]]  # type: ignore


@needs_fixtures
def test_project_refuses_a_schedule_the_framework_would_load_otherwise() -> None:
    sc = api.load(TITAN, overrides=TITAN_PP2)
    with pytest.raises(ConfigError) as err:
        project(sc, schedule="interleaved_1f1b")
    text = err.value.render()
    assert "interleaved_1f1b" in text and "schedule=" in text and "TorchTitan" in text, text
    assert project(sc, schedule=sc.plan.schedule).step_time_s == project(sc).step_time_s  # its own: as before


def test_project_refuses_a_schedule_the_plan_cannot_run() -> None:
    sc = api.load(L70, overrides={"plan.vpp": None, "plan.schedule": "1f1b"})
    with pytest.raises(ConfigError) as err:
        project(sc, schedule="interleaved_1f1b")
    assert "interleaved_1f1b" in err.value.render() and "vpp" in err.value.render()
    assert project(sc, schedule="gpipe").schedule == "gpipe"


# D3 / D4: the memory verdict in every row


def test_an_at_risk_layout_is_not_called_fitting_and_ranks_as_projection_plan_ranks_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    sc = api.load(L70)
    found = search_layouts(sc, tp=[2, 4], recompute=["none", "full"])
    (risk,) = [c for c in found if c.tp == 2 and c.recompute == "none"]
    assert risk.status == "at risk" and risk.memory is not None and risk.memory.verdict == "at risk"
    assert risk.projection is not None
    cli = _cli_json(capsys, "plan", "--config", str(L70), "--tp", "2,4", "--recompute", "none,full",
                    "--format", "json")["candidates"]
    assert [(c.tp, c.recompute, c.status) for c in found] == [(r["tp"], r["recompute"], r["status"]) for r in cli]


def _notebook_output() -> tuple[dict[str, Any], str]:
    import matplotlib

    matplotlib.use("Agg")
    cells = json.loads((REPO / "notebooks" / "planning.ipynb").read_text(encoding="utf-8"))["cells"]
    namespace: dict[str, Any] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for cell in cells:
            if cell["cell_type"] == "code":
                exec(compile("".join(cell["source"]), "planning.ipynb", "exec"), namespace)  # noqa: S102
    return namespace, out.getvalue()


@pytest.fixture(scope="module")
def notebook() -> tuple[dict[str, Any], str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        return _notebook_output()


def test_the_notebook_prints_each_verdict_and_the_reserved_peak(notebook: tuple[dict[str, Any], str]) -> None:
    ns, text = notebook
    gpipe = [line for line in text.splitlines() if line.startswith("gpipe ")]
    assert gpipe and "out of memory" in gpipe[0], gpipe
    risky = [line for line in text.splitlines() if line.startswith("tp 2 pp 4 vpp 5:")]
    assert risky and "at risk" in risky[0] and "reserved" in risky[0], risky
    assert ns["best"].status == "fits"


def test_the_scaling_plot_starts_at_zero_with_node_ticks(notebook: tuple[dict[str, Any], str]) -> None:
    ax = notebook[0]["ax"]
    assert ax.get_ylim()[0] == 0
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8", "16"]


# D5 / D6 / D9: wording


def test_fixed_global_batch_scaling_is_not_called_weak_scaling(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("memory", "performance"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "weak" not in capsys.readouterr().out.lower()
    import projection.cli_performance as perf_cli

    assert "weak" not in (perf_cli.__doc__ or "").lower()
    assert "weak scal" not in (REPO / "README.md").read_text(encoding="utf-8").lower()
    assert "weak" not in (REPO / "notebooks" / "planning.ipynb").read_text(encoding="utf-8").lower()


def test_notebook_readme_installs_the_plot_extra_and_readme_names_both_spellings() -> None:
    assert '.[plot]' in (REPO / "notebooks" / "README.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "RankMemory.inflight" in readme and "api.reloader" in readme
    assert "reload=lambda over: api.load(path, overrides=over)" not in readme


# D8: bad arguments raise the project's errors, naming the argument


@needs_fixtures
def test_env_values_must_be_strings() -> None:
    with pytest.raises(ConfigError) as err:
        api.load(PRIMUS / "deepseek_v2_lite-BF16-pretrain.yaml", env={"PRIMUS_TP": 2})  # type: ignore[dict-item]
    assert "PRIMUS_TP" in err.value.render() and "'2'" in err.value.render()


@pytest.mark.parametrize("kwargs", [{"nodes": "4"}, {"nodes": 8.0}, {"nodes": True}, {"gpus_per_node": "8"},
                                    {"default_nodes": "2"}, {"schedule": 3}])
def test_load_refuses_counts_that_are_not_whole_numbers(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        api.load(L70, **kwargs)
    assert f"api.load({next(iter(kwargs))}=" in err.value.render()


@pytest.mark.parametrize("call", [
    lambda sc: project(sc, "x"),
    lambda sc: compare_schedules(None),
    lambda sc: compare_schedules(sc, "x"),
    lambda sc: search_layouts(None),
    lambda sc: search_layouts(sc, cost_model="x"),
    lambda sc: search_layouts(sc, tp="4"),
    lambda sc: search_layouts(sc, recompute=["fulll"]),
    lambda sc: extrapolate(None, 2),  # these four raised AttributeError
    lambda sc: scaling_table(None, [2]),
    lambda sc: scaling_table(sc, [4], "x"),
    lambda sc: default_cost_model(None),
    lambda sc: default_cost_model(sc, 5),  # a TypeError from Path(5)
])
def test_wrong_arguments_are_config_errors(call: Any) -> None:
    sc = api.load(L70)
    with pytest.raises(ConfigError):
        call(sc)


def test_a_bare_value_is_one_value_to_search() -> None:
    sc = api.load(L70)
    assert [(c.tp, c.recompute, c.zero) for c in search_layouts(sc, tp=4, recompute="full", zero=1)] == [
        (4, "full", 1)]


def test_errors_are_projection_errors_not_raw_exceptions() -> None:
    sc = api.load(L70)
    with pytest.raises(ProjectionError):
        project(sc, 3)  # type: ignore[arg-type]
    assert default_cost_model(sc) is not None
