"""A reader that closes the pipe before the output is written (`projection ... | head -1`) ends the command quietly:
no traceback on stderr, the shell's SIGPIPE status (141), for every command that prints a report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3.1_70B-mi300x.yaml"


@pytest.mark.parametrize("command", ["inspect", "memory", "performance"])
def test_closed_stdout_is_not_a_traceback(command: str) -> None:
    p = subprocess.Popen([sys.executable, "-m", "projection", command, "--config", str(EXAMPLE)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the report is printed
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
