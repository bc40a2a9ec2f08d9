"""Input and output the CLI cannot complete are user errors (exit 2, one message naming the file, the flag and the
fix, no traceback), and a failed write leaves no half-written or destroyed file: standard output that cannot be
written, input nested deeper than a parser can follow, inputs that are not regular files (a device is read until
memory runs out, a named pipe blocks forever), empty paths and empty configs, and writes that fail halfway."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "examples" / "llama3_8b_inline.yaml")
CALIBRATION = str(ROOT / "calibrations" / "a100-80g.json")
SCHEDULE = ["schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--fwd-s", "1", "--bwd-s", "2"]


def limits(file_bytes: int | None = None) -> Callable[[], None]:
    """Limits for the child: 4 GiB of address space (code that reads /dev/zero fails fast instead of filling the
    machine's memory) and, if given, a file-size limit past which a write fails (EFBIG), as on a full disk."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        if file_bytes is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the child
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    return apply


def run(*args: str, cwd: Path | None = None, file_bytes: int | None = None,
        stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    # this checkout's package, whatever projection is installed (the tests run from other working directories)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "projection", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=60, cwd=cwd, preexec_fn=limits(file_bytes), env=env)


def assert_user_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and "Error:" not in res.stderr.replace("error:", ""), res.stderr
    for n in needles:
        assert n in res.stderr, f"{n!r} not in:\n{res.stderr}"
    assert "fix:" in res.stderr or "standard output" in res.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("memory", "--config", CONFIG), tuple(SCHEDULE)], ids=["memory", "schedule"])
def test_stdout_that_cannot_be_written(args: tuple[str, ...]) -> None:
    with open("/dev/full", "w") as full:
        res = run(*args, stdout=full.fileno())
    assert_user_error(res, "error: cannot write the output to standard output: No space left on device")
    assert len(res.stderr.splitlines()) == 1


@pytest.mark.parametrize(("name", "text", "command"), [
    ("deep.yaml", "model: " + "[" * 500 + "]" * 500, ("memory", "--config", "{}")),
    ("deep.json", "[" * 1000 + "]" * 1000, ("memory", "--config", "{}")),
    ("deep.toml", "a = " + "[" * 600 + "]" * 600, ("inspect", "--config", "{}")),
    ("device.yaml", "name: " + "[" * 500 + "]" * 500, ("memory", "--config", CONFIG, "--hardware", "{}")),
    ("cal.json", '{"gemm": ' + "[" * 1000 + "]" * 1000 + "}", ("calibrate", "import", "{}", "--out", "o.json")),
    ("cal.json", '{"gemm": ' + "[" * 1000 + "]" * 1000 + "}", ("calibrate", "fit", "{}")),
], ids=["yaml", "json", "toml", "hardware-yaml", "calibrate-import", "calibrate-fit"])
def test_nesting_too_deep(tmp_path: Path, name: str, text: str, command: tuple[str, ...]) -> None:
    path = tmp_path / name
    path.write_text(text + "\n")
    res = run(*(a.replace("{}", str(path)) for a in command), cwd=tmp_path)
    assert_user_error(res, str(path), "nested too deeply")
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(("special", "command", "needles"), [
    ("/dev/zero", ("memory", "--config", "{}"), ("key '--config'", "a character device")),
    ("link", ("memory", "--config", "{}"), ("a link to /dev/zero, a character device",)),
    ("fifo", ("memory", "--config", "{}"), ("a named pipe",)),
    ("/dev/zero", ("memory", "--config", CONFIG, "--hardware", "{}"), ("key '--hardware'", "a character device")),
    ("/dev/zero", ("calibrate", "import", "{}", "--out", "o.json"), ("a character device",)),
    ("fifo", ("calibrate", "fit", "{}"), ("a named pipe",)),
    ("/dev/zero", (*SCHEDULE[:1], "--csv", "{}", *SCHEDULE[7:]), ("a character device",)),
    ("fifo", ("performance", "--config", CONFIG, "--calibration", "{}"), ("key '--calibration'", "a named pipe")),
], ids=["config-device", "config-link", "config-fifo", "hardware", "calibrate-import", "calibrate-fit", "csv",
        "calibration"])
def test_input_that_is_not_a_regular_file(tmp_path: Path, special: str, command: tuple[str, ...],
                                          needles: tuple[str, ...]) -> None:
    path = special
    if special == "link":
        path = str(tmp_path / "zero.yaml")
        os.symlink("/dev/zero", path)
    elif special == "fifo":
        path = str(tmp_path / "fifo.yaml")
        os.mkfifo(path)  # nothing writes to it: opening it would block
    res = run(*(a.replace("{}", path) for a in command), cwd=tmp_path)
    assert_user_error(res, path, "not a regular file", *needles)
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(("args", "flag"), [
    ((*SCHEDULE, "--trace", ""), "--trace"),
    ((*SCHEDULE, "--pp-vis", ""), "--pp-vis"),
    (("performance", "--config", CONFIG, "--calibration", ""), "--calibration"),
    (("memory", "--config", ""), "--config"),
    (("calibrate", "fit", CALIBRATION, "--out", ""), "--out"),
    (("schedule", "--csv", "", "--fwd-s", "1"), "--csv"),  # ran a built-in schedule, or asked for --schedule
    (("memory", "--config", CONFIG, "--primus-root", ""), "--primus-root"),  # was the current directory
    (("performance", "--config", CONFIG, "--primus-root", ""), "--primus-root"),
    (("calibrate", "memory", "--config", "", "--device", "cpu", "--sizes", "4096", "--out", "o.json"), "--config"),
], ids=["trace", "pp-vis", "calibration", "config", "calibrate-out", "csv", "primus-root", "performance-primus-root",
        "calibrate-config"])
def test_empty_path(tmp_path: Path, args: tuple[str, ...], flag: str) -> None:
    assert_user_error(run(*args, cwd=tmp_path), f"key '{flag}'", "the path is empty")
    assert list(tmp_path.iterdir()) == []


def test_calibration_that_is_a_directory(tmp_path: Path) -> None:
    res = run("performance", "--config", CONFIG, "--calibration", str(tmp_path))
    assert_user_error(res, str(tmp_path), "key '--calibration'", "is a directory")


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("empty.toml", "", "is empty"), ("empty.yaml", "", "is empty"), ("spaces.json", " \n", "is empty"),
    ("comments.toml", "# nothing yet\n", "holds no settings"), ("null.yaml", "# nothing yet\n~\n", "holds no settings"),
])
def test_empty_config(tmp_path: Path, name: str, text: str, needle: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    res = run("memory", "--config", str(path))
    assert_user_error(res, str(path), needle)
    assert res.stdout == ""


def test_calibrate_import_of_broken_json_says_where(tmp_path: Path) -> None:
    path = tmp_path / "cal.json"
    path.write_text('{"schema_version": 1,\n "gemm": [}\n')
    res = run("calibrate", "import", str(path), "--out", str(tmp_path / "o.json"))
    assert_user_error(res, f"{path}:2: invalid JSON", "column 11")
    assert "no benchmark table" not in res.stderr


OLD = "the old content\n"


@pytest.mark.parametrize(("command", "out"), [
    (("calibrate", "import", CALIBRATION, "--out", "{}"), "cal.json"),
    (("calibrate", "fit", CALIBRATION, "--out", "{}"), "fit.json"),
    ((*SCHEDULE, "--trace", "{}"), "trace.json"),
    # config.json (49 bytes) is written, pp_rank_0.json (489) fails: the run puts the old config.json back
    ((*SCHEDULE, "--pp-vis", "{}"), "vis/1f1b/config.json"),
    # the same with the folder given relative to the working directory (it removed the old config.json)
    ((*SCHEDULE, "--pp-vis", "{relative}"), "vis/1f1b/config.json"),
], ids=["calibrate-import", "calibrate-fit", "trace", "pp-vis", "pp-vis-relative"])
def test_failed_write_keeps_the_old_file(tmp_path: Path, command: tuple[str, ...], out: str) -> None:
    """Writes fail past 300 bytes, as on a full disk: the file it was to replace keeps its content, no temporary
    file is left, and the error names the file."""
    path = tmp_path / out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OLD)
    flag_value = str(tmp_path / out.split("/")[0])
    args = (a.replace("{relative}", out.split("/")[0]).replace("{}", flag_value) for a in command)
    res = run(*args, cwd=tmp_path, file_bytes=300)
    assert_user_error(res, "File too large", out.split("/")[0] if "{relative}" in command else str(tmp_path))
    assert path.read_text() == OLD
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize(("name", "text", "needle"), [
    # libyaml's composer recurses in C: a flow nesting of 100,000 levels is refused before it (it crashed the
    # interpreter), as are 101 levels; aliases repeated into each other stop at a key count, in under a second
    ("flow.yaml", "model: " + "[" * 100_000 + "]" * 100_000, "more than 100 levels"),
    ("map.yaml", "model: " + "{a: " * 101 + "1" + "}" * 101, "more than 100 levels"),
    ("laughs.yaml", "a: &a {x: 1, y: 1, z: 1, w: 1}\n" + "".join(
        f"{c}: &{c} {{p: *{p}, q: *{p}, r: *{p}, s: *{p}, t: *{p}, u: *{p}}}\n"
        for p, c in zip("abcdefghij", "bcdefghijk", strict=True)), "expands to more than 200,000 keys"),
], ids=["flow-100000", "map-101", "billion-laughs"])
def test_yaml_that_would_crash_or_hang_libyaml(tmp_path: Path, name: str, text: str, needle: str) -> None:
    path = tmp_path / name
    path.write_text(text + "\n")
    res = run("inspect", "--config", str(path), cwd=tmp_path)
    assert_user_error(res, str(path), needle)
