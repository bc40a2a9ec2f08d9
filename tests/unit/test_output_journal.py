"""The CLI's output journal (projection/fileio.py OutputJournal) and its signals, driven in-process: what a killed
or failing command leaves on disk, deterministically (no timing)."""

from __future__ import annotations

import errno
import os
import shutil
import signal
from pathlib import Path

import pytest

from projection import cli
from projection.errors import ConfigError
from projection.fileio import DuplicateJsonKey, OutputJournal, atomic_write_text, loads_json_unique, output_journal

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_rolls_back_like_ctrl_c(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A command terminated (kill, a closed terminal) after writing an output puts back the old content and leaves
    no hidden copy: one line on stderr, exit 128 + 15."""
    out = tmp_path / "o.json"
    out.write_text("old\n")

    def command(argv: object) -> int:
        atomic_write_text(out, "new\n")
        os.kill(os.getpid(), signal.SIGTERM)
        return 0

    class Unhandled(Exception):
        pass

    def unhandled(signum: int, frame: object) -> None:  # what the test sees if main installs no handler of its own
        raise Unhandled

    monkeypatch.setattr(cli, "_main", command)
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        assert cli.main([]) == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is unhandled  # main puts the handler it found back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["o.json"]
    assert capsys.readouterr().err == "projection: terminated (SIGTERM)\n"


def test_a_failed_keep_is_a_user_error_without_a_partial_copy(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Where hard links are refused the old file is copied; a copy that fails (a full disk) leaves no partial
    hidden file and is reported as a problem naming the file, not a traceback."""
    out = tmp_path / "o.json"
    out.write_text("old\n" * 1000)

    def no_link(src: object, dst: object) -> None:
        raise OSError(errno.EPERM, "links refused")

    def half_copy(src: str, dst: str) -> None:
        Path(dst).write_text("ol")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(shutil, "copy2", half_copy)
    with pytest.raises(ConfigError, match="cannot keep a copy of .*No space left"):
        OutputJournal().protect(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.json"]


def test_a_dangling_symlink_output_is_undone_where_it_leads(tmp_path: Path) -> None:
    """`--out link.json` where link.json points at a file not yet there: the writer creates the target, so a rollback
    removes the target (it used to record only the link's own path and leave the new file)."""
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to("sub/new.json")
    with output_journal() as journal:
        atomic_write_text(link, "new\n")
        assert (tmp_path / "sub" / "new.json").read_text() == "new\n"
        journal.rollback()
    assert not (tmp_path / "sub" / "new.json").exists() and link.is_symlink()


@pytest.mark.parametrize(("text", "key", "line"), [('{"b": 1,\n "b": 2}', "b", 2),
                                                   ('{"a": {"x": 1},\n "c": {"x": 1,\n "x": 2}}', "x", None)])
def test_a_duplicate_json_key_is_located_only_when_unambiguous(text: str, key: str, line: int | None) -> None:
    """The second appearance's line where the key is written exactly twice; with more, which object holds the
    duplicate is not known from a text search, so no line is claimed."""
    with pytest.raises(DuplicateJsonKey) as err:
        loads_json_unique(text)
    assert (err.value.key, err.value.line) == (key, line)


def test_an_input_the_config_names_is_not_an_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`cluster.hardware: hw.yaml` in the config and `--trace hw.yaml`: refused (exit 2) before anything is written;
    the device file is untouched."""
    hw = tmp_path / "hw.yaml"
    shutil.copy(REPO / "hardware_specs" / "mi300x.yaml", hw)
    job = tmp_path / "job.yaml"
    job.write_text((REPO / "examples" / "llama3_8b_inline.yaml").read_text().replace("hardware: mi300x",
                                                                                      f"hardware: {hw}"))
    before = hw.read_bytes()
    assert cli.main(["performance", "--config", str(job), "--trace", str(hw)]) == 2
    err = capsys.readouterr().err
    assert "key '--trace'" in err and "a file --config reads" in err and hw.read_bytes() == before
