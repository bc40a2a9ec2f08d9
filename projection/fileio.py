"""File I/O the CLI shares: writes that replace a file whole or not at all, and the check that an input file is a
regular file before it is read.

A failed write (a full disk, a file-size limit) must not leave a truncated file, nor destroy the file it was meant
to replace: `atomic_write_bytes` writes a new file beside the target and renames it over the target (POSIX rename is
atomic within a file system), removing the new file when anything fails. A device, a named pipe or a socket given
as an input is refused before it is opened: /dev/zero would be read until memory runs out, and opening a pipe with
no writer blocks forever.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from projection.errors import ConfigError, Problem

_CHUNK = 1 << 20  # bytes per os.write call


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` whole or not at all (see atomic_write_bytes); returns the path."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` whole or not at all: into a temporary file in the same folder, flushed to disk, then
    renamed over `path`. On any failure (OSError, KeyboardInterrupt ...) the temporary file is removed and `path`
    keeps its old content (or stays absent). A symlink keeps pointing where it did: its target gets the content.
    An existing file keeps its permission bits; a new one gets those `open()` would give. A target that exists but
    is not a regular file (/dev/stdout, a named pipe) cannot be replaced, so it is written in place. Returns `path`."""
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        with open(path, "wb") as f:
            f.write(data)
        return Path(path)
    target = Path(os.path.realpath(path))
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")  # hidden, and unique among writers
    fd = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as with open()
        _write_all(fd, data)
        if old is not None:
            os.fchmod(fd, stat.S_IMODE(old.st_mode))
        os.fsync(fd)  # the data is on disk before the name points at it (a crash leaves old or new, never empty)
        os.close(fd)
        fd = None
        os.replace(tmp, target)
    except BaseException as err:
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):  # name the file asked for, not the temporary one
            raise OSError(err.errno, err.strerror, os.fspath(path)) from err
        raise
    return Path(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # os.write may write less than asked
        view = view[os.write(fd, view[:_CHUNK]):]


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(path: str | Path) -> str | None:
    """What `path` is when it exists (symlinks followed) but is not a regular file: 'a directory', 'a named pipe
    (FIFO)', 'a character device', ...; None for a regular file, and for a path that cannot be examined (missing,
    no permission: the reader reports that in its own words)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def not_regular_problem(path: str | Path, key: str | None = None) -> Problem | None:
    """The problem of an input `path` that exists but is not a regular file (see not_regular), else None."""
    kind = not_regular(path)
    if kind is None:
        return None
    link = f"a link to {os.path.realpath(path)}, " if os.path.islink(path) else ""
    if kind == "a directory":
        return Problem(f"is {link}a directory, not a file", key=key, file=str(path), fix="give the file itself")
    return Problem(f"is {link}{kind}, not a regular file", key=key, file=str(path),
                   fix="give a regular file: a device, a named pipe or a socket is not read (save its content to a "
                       "file first)")


def require_regular(path: str | Path, error: Callable[[Problem], Exception] | None = None) -> None:
    """Raise `error(problem)` (a ConfigError by default) when `path` exists but is not a regular file: a device would
    be read until memory runs out, a named pipe blocks until something writes to it."""
    problem = not_regular_problem(path)
    if problem is not None:
        raise (error or ConfigError)(problem)
