"""A reader that closes the pipe before the output is written (`projection ... | head -1`) ends the command quietly:
no traceback on stderr, the shell's SIGPIPE status (141), for every command that prints a report. The files the
command wrote stay: they are whole, and the reader chose to see less of the report (a full disk under standard
output, a failure, removes them: test_output_safety.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama3.1_70B-mi300x.yaml"
# this checkout's package, whatever projection is installed
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def closed_stdout(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    """Run `projection args` with its standard output closed before it prints: (exit code, stderr)."""
    p = subprocess.Popen([sys.executable, "-m", "projection", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=cwd, env=ENV)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the report is printed
    err = p.stderr.read().decode()
    return p.wait(timeout=120), err


@pytest.mark.parametrize("command", ["inspect", "memory", "performance"])
def test_closed_stdout_is_not_a_traceback(command: str) -> None:
    rc, err = closed_stdout(command, "--config", str(EXAMPLE))
    assert rc == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_closed_stdout_keeps_the_files_written(tmp_path: Path) -> None:
    rc, err = closed_stdout("schedule", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--trace", "t.json",
                            "--pp-vis", "vis", cwd=tmp_path)
    assert rc == 141 and err == ""
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sorted(p.name for p in (tmp_path / "vis" / "1f1b").iterdir()) == ["config.json", "pp_rank_0.json",
                                                                             "pp_rank_1.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "vis"]  # no hidden copy left
