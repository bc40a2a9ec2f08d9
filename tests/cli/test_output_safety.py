"""An output file never destroys an input, and never outlives a command that failed: a path given as an output that
is one of the command's inputs (or another output) is refused before anything is written; a command whose report
cannot be printed (/dev/full) or that is interrupted (Ctrl-C: exit 130, one line, no traceback) leaves every file
as it was before it ran. Also the flags that name a schedule twice (--csv with --schedule) or name no path at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_io_errors import CALIBRATION, CONFIG, ROOT, assert_user_error, run

SCHEDULE = ["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4"]
OLD = "the old content\n"


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder`: a file's bytes, a symlink's target, a folder as 'dir'."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        name = p.relative_to(folder).as_posix()
        out[name] = (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes())
    return out


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A folder of inputs: cal.json (a calibration), link.json (a symlink to it), hard.json (a hard link to it),
    job.yaml (a config), s.csv (a schedule), config/config.json (a schedule whose pp_vis folder is ./config)."""
    shutil.copy(CALIBRATION, tmp_path / "cal.json")
    (tmp_path / "link.json").symlink_to("cal.json")
    os.link(tmp_path / "cal.json", tmp_path / "hard.json")
    shutil.copy(CONFIG, tmp_path / "job.yaml")
    (tmp_path / "s.csv").write_text("0F0,1F0,1B0,0B0\n")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.json").write_text("0F0,0B0\n")
    return tmp_path


@pytest.mark.parametrize(("args", "flag", "path"), [
    (("calibrate", "import", "cal.json", "--out", "cal.json"), "--out", "cal.json"),
    (("calibrate", "import", "job.yaml", "cal.json", "--out", "./cal.json"), "--out", "./cal.json"),
    (("calibrate", "fit", "cal.json", "--out", "link.json"), "--out", "link.json"),
    (("calibrate", "fit", "hard.json", "--out", "cal.json"), "--out", "cal.json"),
    (("calibrate", "memory", "--config", "job.yaml", "--device", "cpu", "--out", "job.yaml"), "--out", "job.yaml"),
    (("performance", "--config", "job.yaml", "--trace", "job.yaml"), "--trace", "job.yaml"),
    (("performance", "--config", "job.yaml", "--calibration", "cal.json", "--trace", "link.json"), "--trace",
     "link.json"),
    (("schedule", "--csv", "s.csv", "--trace", "s.csv"), "--trace", "s.csv"),
    (("schedule", "--csv", "config/config.json", "--pp-vis", "."), "--pp-vis", "config/config.json"),
], ids=["import", "import-spelt-otherwise", "fit-symlink", "fit-hard-link", "benchmark-config", "performance-config",
        "performance-calibration", "schedule-csv", "schedule-pp-vis"])
def test_output_that_is_an_input_is_refused(inputs: Path, args: tuple[str, ...], flag: str, path: str) -> None:
    before = snapshot(inputs)
    res = run(*args, cwd=inputs)
    assert_user_error(res, path, f"key '{flag}'", "writing it would replace the input", f"choose another {flag}")
    assert res.stdout == ""
    assert snapshot(inputs) == before


@pytest.mark.parametrize(("args", "needle"), [
    (("performance", "--config", "job.yaml", "--scaling", "1,2", "--png", "p.png", "--trace", "p.png"),
     "p.png: key '--trace': is the file --png writes too"),
    ((*SCHEDULE, "--trace", "v/1f1b/pp_rank_1.json", "--pp-vis", "v"),
     "v/1f1b/pp_rank_1.json: key '--pp-vis': is the file --trace writes too"),
], ids=["performance", "schedule"])
def test_two_outputs_in_one_file_are_refused(inputs: Path, args: tuple[str, ...], needle: str) -> None:
    before = snapshot(inputs)
    assert_user_error(run(*args, cwd=inputs), needle)
    assert snapshot(inputs) == before


def old_outputs(folder: Path) -> None:
    """Outputs of an earlier run, which a failed run must leave as they are."""
    for name in ("old.json", "vis/1f1b/config.json", "out/cal.json"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(OLD)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [
    ("performance", "--config", "job.yaml", "--trace", "new.json"),
    ("performance", "--config", "job.yaml", "--trace", "old.json"),
    (*SCHEDULE, "--pp-vis", "vis", "--trace", "old.json"),
    (*SCHEDULE, "--pp-vis", "new/vis", "--trace", "new.json"),
    ("calibrate", "import", "cal.json", "--out", "out/cal.json"),
    ("calibrate", "fit", "cal.json", "--out", "fit.json"),
], ids=["performance-new", "performance-old", "schedule-old", "schedule-new", "import", "fit"])
def test_report_that_cannot_be_printed_leaves_the_files_as_they_were(inputs: Path, args: tuple[str, ...]) -> None:
    old_outputs(inputs)
    before = snapshot(inputs)
    with open("/dev/full", "w") as full:
        res = run(*args, cwd=inputs, stdout=full.fileno())
    assert_user_error(res, "cannot write the output to standard output")
    assert snapshot(inputs) == before  # nothing new, nothing replaced, no hidden copy left behind


# Ctrl-C as it comes: a real SIGINT, sent by the process to itself once the trace is written (the next output and
# the report are still to come), so the test does not depend on timing.
INTERRUPT_AFTER_TRACE = """
import os, signal, sys
import projection.report.trace as trace
write = trace.write_chrome_trace
def write_then_interrupt(*args, **kwargs):
    path = write(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
    return path
trace.write_chrome_trace = write_then_interrupt
from projection.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args", [
    (*SCHEDULE, "--trace", "old.json", "--pp-vis", "vis"),
    ("performance", "--config", "job.yaml", "--trace", "new.json"),
], ids=["schedule", "performance"])
def test_interrupt_is_one_line_and_leaves_the_files_as_they_were(inputs: Path, args: tuple[str, ...]) -> None:
    old_outputs(inputs)
    before = snapshot(inputs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, "-c", INTERRUPT_AFTER_TRACE, *args], capture_output=True, text=True,
                         timeout=120, cwd=inputs, env=env)
    assert res.returncode == 130, res.stderr
    assert res.stderr == "projection: interrupted\n"
    assert snapshot(inputs) == before


def test_csv_and_schedule_together_are_refused(inputs: Path) -> None:
    res = run("schedule", "--csv", "s.csv", "--schedule", "1f1b", "--pp-vis", "vis", cwd=inputs)
    assert_user_error(res, "key '--schedule'", "give one of them", "drop --schedule")
    assert not (inputs / "vis").exists()


def test_empty_csv_is_refused_not_replaced_by_the_built_in_schedule() -> None:
    assert_user_error(run(*SCHEDULE, "--csv", ""), "key '--csv'", "the path is empty")


@pytest.mark.skipif(not os.path.isfile("/proc/version"), reason="needs Linux's /proc/version (a file beside which "
                                                                "nothing can be created)")
def test_an_output_that_cannot_be_set_aside_names_its_option() -> None:
    """An existing output whose old content cannot be kept (a folder no file can be created in) is one problem that
    names the option it came from, not only the path."""
    res = run("performance", "--config", CONFIG, "--trace", "/proc/version")
    assert_user_error(res, "/proc/version: key '--trace': cannot keep a copy of /proc/version",
                      "choose an output path in a folder you can write to")


def test_a_file_where_an_output_needs_a_folder_is_refused_and_kept(tmp_path: Path) -> None:
    """`--pp-vis rep` writes rep/<schedule>/: a file of that name was moved aside, replaced by the folder and dropped,
    exit 0 (fuzz audit). Now the run is refused, naming the file, and the folder is left as it was."""
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "1f1b").write_text(OLD)
    os.chmod(rep / "1f1b", 0o600)
    before = snapshot(tmp_path)
    res = run(*SCHEDULE, "--pp-vis", str(rep))
    assert_user_error(res, f"{rep / '1f1b'}: key '--pp-vis': cannot write output: {rep / '1f1b'} is a file",
                      "move or rename that file")
    assert snapshot(tmp_path) == before
    assert os.stat(rep / "1f1b").st_mode & 0o777 == 0o600
