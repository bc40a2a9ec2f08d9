"""Writes that replace a file whole or not at all (projection/fileio.py) and the all-or-nothing output files of the
CLI (cli_args.write_outputs): a write that fails halfway (a full disk) leaves the old file as it was and no temporary
file behind."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from projection.calibrate.calibration import Calibration
from projection.calibrate.errors import CalibrationError
from projection.cli_args import write_outputs
from projection.errors import ConfigError
from projection.fileio import atomic_write_bytes, atomic_write_text, not_regular, not_regular_problem
from projection.schedule.csv import dump_csv, load_csv
from projection.schedule.registry import build_schedule

OLD = "the old content\n"
BIG = "x" * (3 << 20)  # several os.write calls


@contextmanager
def disk_full_after(monkeypatch: pytest.MonkeyPatch, n_bytes: int) -> Iterator[None]:
    """os.write writes `n_bytes` in all, then fails as a full disk does."""
    real = os.write
    left = [n_bytes]

    def write(fd: int, data: bytes | memoryview) -> int:
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data[:left[0]]))
        left[0] -= n
        return n

    with monkeypatch.context() as m:
        m.setattr(os, "write", write)
        yield


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "trace.json"
    out.write_text(OLD)
    with disk_full_after(monkeypatch, 1 << 20), pytest.raises(OSError) as err:
        atomic_write_text(out, BIG)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(out)  # the file asked for, not the temp
    assert out.read_text() == OLD
    assert names(tmp_path) == ["trace.json"]  # no temporary file left


def test_failed_write_of_a_new_file_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with disk_full_after(monkeypatch, 10), pytest.raises(OSError):
        atomic_write_bytes(tmp_path / "new.bin", b"0123456789abcdef")
    assert names(tmp_path) == []


def test_write_replaces_keeps_the_mode_and_follows_symlinks(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    out.write_text(OLD)
    out.chmod(0o640)
    assert atomic_write_text(out, "new\n") == out
    assert out.read_text() == "new\n" and stat.S_IMODE(out.stat().st_mode) == 0o640
    link = tmp_path / "link.json"
    link.symlink_to(out)
    atomic_write_text(link, "through the link\n")
    assert link.is_symlink() and out.read_text() == "through the link\n"
    fresh = tmp_path / "fresh.json"
    atomic_write_text(fresh, "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # as open() would create it
    assert names(tmp_path) == ["cal.json", "fresh.json", "link.json"]


def test_calibration_save_and_csv_dump_keep_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "cal.json"
    out.write_text(OLD)
    with disk_full_after(monkeypatch, 5), pytest.raises(CalibrationError, match="cannot write the calibration"):
        Calibration().save(out)
    csv = tmp_path / "s.csv"
    csv.write_text(OLD)
    with disk_full_after(monkeypatch, 5), pytest.raises(OSError):
        dump_csv(build_schedule("1f1b", 2, 4), csv)
    assert out.read_text() == OLD and csv.read_text() == OLD and names(tmp_path) == ["cal.json", "s.csv"]


def in_place(path: Path, text: str, fail: bool) -> Callable[[], Path]:
    """A writer that truncates the file and writes into it (as matplotlib's savefig does), failing halfway."""
    def write() -> Path:
        with open(path, "w") as f:
            f.write(text[: len(text) // 2])
            f.flush()
            if fail:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            f.write(text[len(text) // 2:])
        return path
    return write


def files_in(folder: Path, *names: str) -> Callable[[], Path]:
    """A writer of a folder of files (as write_pp_vis is)."""
    def write() -> Path:
        for name in names:
            atomic_write_text(folder / name, "new")
        return folder
    return write


def test_write_outputs_puts_back_what_the_failed_run_overwrote(tmp_path: Path) -> None:
    trace, png, folder = tmp_path / "trace.json", tmp_path / "t.png", tmp_path / "vis" / "1f1b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(OLD)
    for p in (trace, png):
        p.write_text(OLD)
    jobs = [("--trace", str(trace), lambda: atomic_write_text(trace, "new trace")),
            ("--pp-vis", str(folder), files_in(folder, "config.json", "pp_rank_0.json")),
            ("--png", str(png), in_place(png, "new picture", fail=True))]
    with pytest.raises(ConfigError, match="cannot write output") as err:
        write_outputs(jobs)
    assert "--png" in str(err.value)
    assert trace.read_text() == OLD and png.read_text() == OLD and (folder / "config.json").read_text() == OLD
    assert names(tmp_path) == ["t.png", "trace.json", "vis"] and names(folder) == ["config.json"]


def test_write_outputs_success_leaves_no_hidden_files(tmp_path: Path) -> None:
    folder = tmp_path / "1f1b"
    folder.mkdir()
    (folder / "pp_rank_7.json").write_text(OLD)  # from a larger run: no writer replaces it, so it stays
    png = tmp_path / "t.png"
    png.write_text(OLD)
    written = write_outputs([("--pp-vis", str(folder), files_in(folder, "config.json")),
                             ("--png", str(png), in_place(png, "new picture", fail=False))])
    assert written == [str(folder), str(png)] and png.read_text() == "new picture"
    assert names(folder) == ["config.json", "pp_rank_7.json"] and (folder / "pp_rank_7.json").read_text() == OLD
    assert names(tmp_path) == ["1f1b", "t.png"]


def test_not_regular_names_what_the_path_is(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/null")
    (tmp_path / "ok.yaml").write_text("a: 1\n")
    assert not_regular(fifo) == "a named pipe (FIFO)" and not_regular(tmp_path) == "a directory"
    assert not_regular(link) == "a character device"
    assert not_regular(tmp_path / "ok.yaml") is None and not_regular(tmp_path / "missing") is None
    problem = not_regular_problem(link, key="--config")
    assert problem is not None and "a link to /dev/null, a character device" in problem.render()
    with pytest.raises(ConfigError, match="a character device"):
        load_csv(link)  # refused before it is read (a link to /dev/zero would be read until memory runs out)


def test_write_outputs_keeps_the_permission_bits_of_a_file_it_replaces(tmp_path: Path) -> None:
    """The old file waits aside while the writer runs, so the new one is made fresh: it must still get the old
    file's mode (a 0600 trace stayed 0600 with a plain open(); it became 0644)."""
    out = tmp_path / "trace.json"
    out.write_text("old")
    out.chmod(0o600)
    write_outputs([("--trace", str(out), lambda: (out.write_text("new"), out)[1])])
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
