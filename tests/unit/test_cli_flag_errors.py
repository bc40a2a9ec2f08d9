"""Bad command-line flags of `projection schedule` / `performance` / `memory`: exit code 2 without a traceback, the
message names the flag and the file (the config file, or '<command line>'), and no output file is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from projection.cli import main
from projection.errors import ConfigError, PlanError

REPO = Path(__file__).resolve().parents[2]
L70 = str(REPO / "examples" / "llama3.1_70B-mi300x.yaml")  # tp 8, pp 4, vpp 5, 4 nodes x 8 GPUs, gbs 128
E8 = str(REPO / "examples" / "llama3_8b_inline.yaml")  # tp 2, pp 2 on 1 node x 8 GPUs, gbs 64
SCHED = ["schedule", "--schedule", "1f1b", "--pp", "4", "--microbatches", "8"]


def fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI; assert a user error (exit 2, message on stderr, no traceback); return stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.startswith("error:") and "Traceback" not in err and "<input>" not in err, err
    return err


def files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


# ---- 1. nothing half-written


def test_schedule_png_in_a_missing_folder_writes_no_trace(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = fails(capsys, *SCHED, "--trace", str(tmp_path / "s_ok.json"), "--png", str(tmp_path / "nodir" / "x.png"))
    assert "--png" in err and str(tmp_path / "nodir" / "x.png") in err
    assert files_under(tmp_path) == []


def test_schedule_pp_vis_on_a_file_writes_no_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    exist = tmp_path / "exist.json"
    exist.write_text("{}")
    err = fails(capsys, *SCHED, "--png", str(tmp_path / "ok.png"), "--pp-vis", str(exist))
    assert "--pp-vis" in err and str(exist) in err and "not a directory" in err
    assert files_under(tmp_path) == [exist] and exist.read_text() == "{}"


def test_schedule_removes_what_it_wrote_when_a_later_write_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import projection.report.ppvis as ppvis

    real = ppvis.write_pp_vis

    def disk_full(res: object, out_dir: str | Path, *a: object, **k: object) -> Path:
        target = real(res, out_dir)  # type: ignore[arg-type]
        raise OSError(28, "No space left on device", str(target / "config.json"))

    monkeypatch.setattr(ppvis, "write_pp_vis", disk_full)
    old = tmp_path / "keep.txt"
    old.write_text("mine")
    err = fails(capsys, *SCHED, "--trace", str(tmp_path / "t.json"), "--pp-vis", str(tmp_path / "new" / "deep"))
    assert "--pp-vis" in err and "No space left" in err
    assert files_under(tmp_path) == [old] and old.read_text() == "mine"


def test_performance_checks_every_output_before_projecting(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = fails(capsys, "performance", "--config", E8, "--scaling", "1", "--png", str(tmp_path / "ok.png"),
                "--trace", str(tmp_path / "nodir" / "t.json"))
    assert "--trace" in err and str(tmp_path / "nodir" / "t.json") in err
    assert files_under(tmp_path) == []


# ---- 2. flags named as flags, located at the config file (or '<command line>')


def test_target_nodes_that_tp_cp_pp_do_not_divide(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "performance", "--config", L70, "--target-nodes", "2")
    assert f"{L70}: key '--target-nodes'" in err
    assert "tp * cp * pp = 8 * 1 * 4 = 32" in err and "use 4 or 8 nodes" in err


def test_scaling_names_every_count_that_fails(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "performance", "--config", L70, "--scaling", "1,2,4")
    assert err.count(f"{L70}: key '--scaling'") == 2
    assert "1 node x 8 GPUs" in err and "2 nodes x 8 GPUs" in err and "4 nodes" not in err.split("fix")[0]


def test_scaling_count_whose_dp_does_not_divide_the_batch(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "performance", "--config", L70, "--scaling", "4,12")
    assert f"{L70}: key '--scaling': at 12 nodes (dp 3)" in err and "training.global_batch_size" in err


def test_target_nodes_with_scaling_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "performance", "--config", E8, "--target-nodes", "4", "--scaling", "1,2")
    assert "<command line>: key '--target-nodes'" in err and "--scaling" in err


def test_scaling_hint_with_one_node_is_singular(capsys: pytest.CaptureFixture[str]) -> None:
    # gbs 2 with mbs 1 and dp 2 per node: only the 1-node layout holds the batch
    err = fails(capsys, "performance", "--config", E8, "--set", "training.global_batch_size=2", "--scaling", "1,2")
    assert "use 1 node (" in err and "use 1 nodes" not in err


@pytest.mark.parametrize("counts", ["", "8,,16", "8,16,", "2,x"])
def test_scaling_counts_with_an_empty_or_unreadable_item(capsys: pytest.CaptureFixture[str], counts: str) -> None:
    err = fails(capsys, "performance", "--config", E8, "--scaling", counts)
    assert "<command line>: key '--scaling'" in err and f"cannot read node counts {counts!r}" in err


def test_a_starting_point_the_plan_does_not_fit_is_named_as_such(capsys: pytest.CaptureFixture[str]) -> None:
    """4 nodes x 4 GPUs (the file's nodes, --gpus-per-node 4) hold no tp 8 x pp 4 layout, though 16 nodes would: the
    error says the starting point is the problem and how to give another."""
    err = fails(capsys, "performance", "--config", L70, "--gpus-per-node", "4", "--target-nodes", "16")
    assert "at the starting point --target-nodes scales from: world size 16" in err and "give --nodes N" in err
    assert main(["performance", "--config", L70, "--gpus-per-node", "4", "--nodes", "8", "--target-nodes", "16"]) == 0
    capsys.readouterr()
    # a plan no node count fixes (tp 3 does not divide the heads) keeps its own message, without the starting point
    err = fails(capsys, "performance", "--config", L70, "--set", "plan.tp=3", "--target-nodes", "16")
    assert "tp = 3 does not divide" in err and "starting point" not in err


@pytest.mark.parametrize("name", ["foo", "zbv", "dualpipe"])
def test_schedule_flag_that_does_not_apply(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """The flag's schedule replaces the file's before the plan (vpp 5) is checked: the problem is at the flag."""
    err = fails(capsys, "performance", "--config", L70, "--schedule", name)
    assert "<command line>: key '--schedule'" in err and "plan.schedule" not in err
    assert "interleaved_1f1b" in err.split("fix:")[1]
    assert name == "foo" or "(got 5)" in err


def test_flag_only_problems_say_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "performance", "--config", E8, "--png", "x.png", "--target-nodes", "0")
    assert "<command line>: key '--png'" in err and "<command line>: key '--target-nodes'" in err
    err = fails(capsys, "performance", "--config", E8, "--scaling", "1,two")
    assert "<command line>: key '--scaling'" in err
    err = fails(capsys, "schedule", "--schedule", "zbv", "--pp", "4", "--microbatches", "8")
    assert "<command line>: key '--schedule'" in err


def test_extrapolate_api_names_its_argument() -> None:
    from projection import api
    from projection.perf import extrapolate

    sc = api.load(L70)
    with pytest.raises(PlanError) as info:
        extrapolate(sc, 2)
    (p,) = info.value.problems
    assert p.key == "nodes" and p.file == sc.source and "use 4 or 8 nodes" in (p.fix or "")
    with pytest.raises(PlanError) as info:
        extrapolate(sc, 12, flag="--target-nodes")
    assert info.value.problems[0].key == "--target-nodes" and "at 12 nodes" in info.value.problems[0].message
    assert extrapolate(sc, 8).plan.dp == 2


# ---- 3. unknown hardware names


def test_unknown_device_at_the_given_origin() -> None:
    from projection.specs.hardware import load_device

    with pytest.raises(ConfigError) as info:
        load_device("mi999x", key="--hardware", file="<command line>")
    text = info.value.render()
    assert text.startswith("<command line>: key '--hardware': unknown device 'mi999x'") and "mi300x" in text
    with pytest.raises(ConfigError) as info:
        load_device("mi999x", key="cluster.hardware", file="exp.yaml", line=5)
    assert info.value.render().startswith("exp.yaml:5: key 'cluster.hardware'")
    with pytest.raises(ConfigError) as info:
        load_device("mi999x")  # no origin given: the device folder, key 'device' (as before)
    assert "key 'device'" in info.value.render()


def test_unknown_hardware_flag(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "memory", "--config", E8, "--hardware", "mi999x")
    assert "<command line>: key '--hardware'" in err and "mi300x" in err


def test_unknown_hardware_in_the_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(Path(E8).read_text().replace("hardware: mi300x", "hardware: mi999x"))
    err = fails(capsys, "memory", "--config", str(cfg))
    assert f"{cfg}:" in err and "key 'cluster.hardware'" in err and "mi300x" in err


def test_an_empty_set_value_is_refused_not_reset(capsys: pytest.CaptureFixture[str]) -> None:
    """`--set plan.tp=` would otherwise read as null and quietly put the key back to its default."""
    err = fails(capsys, "performance", "--config", E8, "--set", "plan.tp=", "--set", "plan.pp=2")
    assert "key 'plan.tp'" in err and "no value" in err and "null to clear" in err


@pytest.mark.parametrize("argv", [("performance", "--target-nodes", "1.5"), ("memory", "--nodes", "1.5"),
                                  ("shapes", "--gpus-per-node", "two"), ("inspect", "--nodes", "0")])
def test_counts_that_are_not_whole_numbers_in_the_tools_own_format(capsys: pytest.CaptureFixture[str],
                                                                    argv: tuple[str, ...]) -> None:
    """Not argparse's usage line: the flag, the value and the fix, like every other bad input."""
    err = fails(capsys, *argv, "--config", E8)
    assert f"<command line>: key '{argv[1]}': must be a positive whole number (got " in err
    assert "fix: give a whole number of at least 1" in err and "usage:" not in err


def test_scaling_names_the_item_it_cannot_read(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, "performance", "--config", E8, "--scaling", "0,1")
    assert "'0' is not a positive whole number" in err
    err = fails(capsys, "performance", "--config", E8, "--scaling", "8,,16")
    assert "an empty item is not a positive whole number" in err
    err = fails(capsys, "performance", "--config", E8, "--scaling", "1,\u00b2")  # a digit int() does not read
    assert "'\u00b2' is not a positive whole number" in err
    err = fails(capsys, "performance", "--config", E8, "--scaling", ",")  # each wrong item named once, counted
    assert "',': 2 empty items are not a positive whole number" in err
    err = fails(capsys, "performance", "--config", E8, "--scaling", "x,8,x,")
    assert "'x' and an empty item are not" in err


def test_schedule_flags_are_named_as_given(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Each bad `projection schedule` flag is named as the command spells it, and none is silently ignored."""
    err = fails(capsys, "schedule", "--schedule", "1f1b", "--pp", "0", "--microbatches", "0", "--vpp", "0")
    assert all(f"key '{k}': must be a positive whole number" in err for k in ("--pp", "--microbatches", "--vpp"))
    err = fails(capsys, *SCHED, "--w-s", "3")
    assert "<command line>: key '--w-s'" in err
    err = fails(capsys, *SCHED, "--links", "nic")
    assert "key '--links'" in err and "--engine des" in err
    err = fails(capsys, *SCHED, "--microbatch-group-size", "4")
    assert "key '--microbatch-group-size'" in err and "interleaved_1f1b only" in err
    err = fails(capsys, "schedule", "--schedule", "interleaved_1f1b", "--pp", "4", "--vpp", "2", "--microbatches", "6")
    assert "--microbatch-group-size-per-virtual-pipeline-stage" not in err and "set --microbatch-group-size" in err
    csv = tmp_path / "s.csv"
    csv.write_text("0F0,0B0\n")
    err = fails(capsys, "schedule", "--csv", str(csv), "--pp", "4", "--microbatches", "8")
    assert "key '--pp'" in err and "key '--microbatches'" in err
    err = fails(capsys, *SCHED, "--png", str(tmp_path / "x.foo"))
    assert "key '--png'" in err and "name it x.png (or .svg" in err and files_under(tmp_path) == [csv]


def test_schedule_marks_a_closed_form_that_is_only_a_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """Interleaved 1F1B with p2p above a chunk's forward: the walk is 70 s, the closed form 62.5 s, a lower bound."""
    assert main(["schedule", "--schedule", "interleaved_1f1b", "--pp", "4", "--vpp", "2", "--microbatches", "8",
                 "--p2p-s", "2", "--format", "json"]) == 0
    doc = __import__("json").loads(capsys.readouterr().out)
    assert (doc["step_time_s"], doc["closed_form_step_time_s"], doc["closed_form_exact"]) == (70.0, 62.5, False)
    assert main(["schedule", "--schedule", "interleaved_1f1b", "--pp", "4", "--vpp", "2", "--microbatches", "8",
                 "--format", "json"]) == 0
    doc = __import__("json").loads(capsys.readouterr().out)
    assert doc["closed_form_exact"] is True and doc["closed_form_step_time_s"] == doc["step_time_s"]


@pytest.mark.parametrize(("argv", "needle"), [
    (["plan", "--config", "examples/llama3.1_70B-mi300x.yaml", "--top", "abc"], "argument --top: invalid int value"),
    (["performance", "--config", "examples/llama3.1_70B-mi300x.yaml", "--engine", "foo"],
     "argument --engine: invalid choice: 'foo'"),
    (["memory", "--config", "examples/llama3.1_70B-mi300x.yaml", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_argparse_errors_use_the_projects_format(argv: list[str], needle: str) -> None:
    """A value argparse itself refuses (a type, a choice, an unknown flag) is one error line naming the flag, and a
    fix line, exit 2: not argparse's usage text."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "projection", *argv], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(f"error: <command line>: {needle}") and "usage:" not in res.stderr
    assert "fix: see `projection" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("shape", ["\u00b2x64x64", "\u0663x64x64"])
def test_a_shape_with_a_digit_int_does_not_read_or_not_ascii_is_refused(capsys: pytest.CaptureFixture[str],
                                                                         shape: str) -> None:
    """An audit: `calibrate gemm --shape ²x64x64` ended in a ValueError traceback (str.isdigit accepts '²', int()
    does not), and `٣x64x64` was benchmarked as m = 3. Both are refused at --shape, with the form to write."""
    from projection.cli import main

    assert main(["calibrate", "gemm", "--device", "cpu", "--shape", shape, "--dtype", "fp32"]) == 2
    err = capsys.readouterr().err
    assert "key '--shape': cannot read shape" in err and "Traceback" not in err
