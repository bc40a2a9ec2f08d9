"""File I/O the CLI shares: writes that replace a file whole or not at all, the journal that undoes a command's
writes when the command fails after them, the checks of input and output paths before anything is written, and
JSON read with each key once per object.

A failed write (a full disk, a file-size limit) must not leave a truncated file, nor destroy the file it was meant
to replace: `atomic_write_bytes` writes a new file beside the target and renames it over the target (POSIX rename is
atomic within a file system), removing the new file when anything fails. A device, a named pipe or a socket given
as an input is refused before it is opened: /dev/zero would be read until memory runs out, and opening a pipe with
no writer blocks forever.

A command's files are written before its report is printed, so a report that cannot be printed (a full disk under
standard output) or an interrupt (Ctrl-C) comes after them: the CLI runs each command under an `OutputJournal`
(`output_journal`), which keeps the old content of every file a command may replace (a hard link beside it, so no
copy is made) and, when the command fails, removes what it created and puts the old files back. (Writers that
truncate in place, such as savefig, get their old file renamed aside by cli_args.write_outputs instead: a hard link
would share the truncated content.) A file that is also an input of the command is refused before anything is
written (`same_file_problems`): the output would replace the input the report was made from.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import yaml

from projection.errors import ConfigError, Problem

# libyaml's parser where PyYAML was built with it (the wheels are): the same safe subset and marks, about ten times
# faster than the pure-Python one, which dominated a CLI run's start (every device YAML is read to resolve aliases)
YAML_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_YAML_DEPTH = 100  # a config is a few levels deep; libyaml parses far deeper than Python's recursion would
MAX_YAML_KEYS = 200_000  # key paths a config may expand to (anchors and aliases); a real one has a few hundred


def flow_depth(text: str) -> int:
    """The deepest nesting of YAML flow collections ([ ] and { }) in the text, brackets inside strings included: an
    upper bound checked before libyaml's composer, which recurses in C and would crash the interpreter on a file of
    thousands of levels (block nesting that deep needs a line of thousands of spaces per level)."""
    if text.count("[") + text.count("{") <= MAX_YAML_DEPTH:  # the usual case: too few brackets to nest that deep
        return 0
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}" and depth:
            depth -= 1
    return deepest


class YamlTooDeep(ValueError):
    """A YAML document nested deeper than MAX_YAML_DEPTH (the caller names the file in its error)."""


def parse_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """Compose a YAML document once, depth-guarded, and construct its data from the same nodes (the nodes carry the
    keys' lines). Raises YamlTooDeep, or yaml.YAMLError for a syntax error."""
    if flow_depth(text) > MAX_YAML_DEPTH:
        raise YamlTooDeep(text[:40])
    loader = YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if yaml_depth(node) > MAX_YAML_DEPTH:
            raise YamlTooDeep(text[:40])
        return node, loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def yaml_depth(node: yaml.Node | None) -> int:
    """How deeply a composed YAML document nests its lists and mappings (iteratively: no recursion limit; a node an
    alias shares is walked once)."""
    deepest, stack, seen = 0, [(node, 1)] if node is not None else [], set()
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_YAML_DEPTH:
            break
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            stack += [(v, depth + 1) for _, v in current.value]
        elif isinstance(current, yaml.SequenceNode):
            stack += [(v, depth + 1) for v in current.value]
    return deepest

_CHUNK = 1 << 20  # bytes per os.write call


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` whole or not at all (see atomic_write_bytes); returns the path."""
    return atomic_write_bytes(path, text.encode(encoding))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` whole or not at all: into a temporary file in the same folder, flushed to disk, then
    renamed over `path`. On any failure (OSError, KeyboardInterrupt ...) the temporary file is removed and `path`
    keeps its old content (or stays absent). A symlink keeps pointing where it did: its target gets the content.
    An existing file keeps its permission bits; a new one gets those `open()` would give. A target that exists but
    is not a regular file (/dev/stdout, a named pipe) cannot be replaced, so it is written in place. Under an
    output journal (output_journal) the old file is kept until the command succeeds. Returns `path`."""
    protect(path)
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


# ---- the output journal: a failed command leaves the files it wrote as they were before it ran

class OutputJournal:
    """What a command may have changed on disk, to be undone if the command fails after writing (its report could
    not be printed, Ctrl-C) or kept when it succeeds. `protect(path)` before a file or a folder is written;
    `commit()` or `rollback()` once, at the end."""

    def __init__(self) -> None:
        self._before: dict[Path, set[Path]] = {}  # protected path -> what existed of it, its folders, its content
        self._kept: list[tuple[Path, Path]] = []  # (old file, the hidden hard link holding its content)

    def protect(self, path: str | Path, key: str | None = None) -> None:
        """Note what exists of `path` (a file, or a folder and everything under it) and keep every regular file
        there under a hidden name beside it. The writers replace a file by renaming a new one over it
        (atomic_write_bytes; cli_args.write_outputs sets the old one aside for the others), so a hard link keeps
        the old content without a copy; where hard links are refused (some file systems) the file is copied."""
        # the path as given and where it leads: a writer creates a dangling symlink's target, not the link
        for out in dict.fromkeys((Path(os.path.abspath(path)), Path(os.path.realpath(path)))):
            if out not in self._before:
                self._before[out] = existing_entries(out)
                self._keep(out, key)

    def _keep(self, out: Path, key: str | None) -> None:
        files = [p for p in out.rglob("*") if p.is_file()] if out.is_dir() else [out] if out.is_file() else []
        for f in files:
            real = Path(os.path.realpath(f))  # a symlink stays as it is: its target is what a writer replaces
            if any(real == old for old, _ in self._kept):
                continue
            kept = real.with_name(f".{real.name}.{secrets.token_hex(4)}.keep")
            self._kept.append((real, kept))  # first, so an interrupt after the link still finds it to undo
            try:
                try:
                    os.link(real, kept)
                except OSError:
                    shutil.copy2(real, kept)
            except BaseException as err:
                self._kept.pop()
                with contextlib.suppress(OSError):
                    kept.unlink()  # a partial copy (a full disk)
                if isinstance(err, OSError):
                    raise ConfigError(Problem(f"cannot keep a copy of {real} before replacing it: "
                                              f"{err.strerror or err}", key=key, file=str(real),
                                              fix="choose an output path in a folder you can write to (and "
                                                  "with free space)")) from None
                raise

    def commit(self) -> None:
        """The command succeeded: drop the kept copies."""
        for _, kept in self._kept:
            with contextlib.suppress(OSError):
                kept.unlink()
        self._before, self._kept = {}, []

    def rollback(self) -> None:
        """The command failed: remove what it created under the protected paths (and the folders it made for
        them), then put every kept file back under its own name."""
        hidden = {os.path.realpath(kept) for _, kept in self._kept}  # kept names are resolved, entries may not be
        for out, old in self._before.items():
            new = [p for p in existing_entries(out) - old if os.path.realpath(p) not in hidden]
            remove_paths(sorted(new, key=lambda p: len(p.parts), reverse=True))
        for original, kept in reversed(self._kept):
            with contextlib.suppress(OSError):  # else the old content stays under the hidden name, not lost
                if original.exists() and os.path.samefile(original, kept):
                    kept.unlink()  # never replaced; rename() between two links of one file does nothing (POSIX)
                else:
                    os.replace(kept, original)
        self._before, self._kept = {}, []


_JOURNAL: ContextVar[OutputJournal | None] = ContextVar("projection_output_journal", default=None)


@contextlib.contextmanager
def output_journal() -> Iterator[OutputJournal]:
    """Make a new journal the one `protect` records into, for the duration of the block; the caller commits or
    rolls it back (the CLI's main: commit when the command succeeded and its report was printed)."""
    journal = OutputJournal()
    token = _JOURNAL.set(journal)
    try:
        yield journal
    finally:
        _JOURNAL.reset(token)


def protect(path: str | Path, key: str | None = None) -> None:
    """Record `path` in the active output journal before it is written (no journal, as when a command's function
    is called from Python: nothing to do); `key` (the option that named it) is named if it cannot be kept."""
    journal = _JOURNAL.get()
    if journal is not None:
        journal.protect(path, key)


Job = tuple[str, str, Callable[[], object]]  # (flag, output path, writer), as cli_args.write_outputs takes them


def protect_jobs(jobs: Sequence[Job]) -> list[Job]:
    """The jobs of cli_args.write_outputs with each path resolved (symlinks, relative parts) and protected in the
    active journal. Resolved, because write_outputs tells its own hidden copies (named from the resolved file) from
    the files a failed writer created by comparing names: under a relative path it would remove the old content
    it set aside instead of putting it back."""
    out = [(flag, os.path.realpath(path), fn) for flag, path, fn in jobs]
    for flag, path, _ in out:
        protect(path, flag)
    return out


def existing_entries(path: Path) -> set[Path]:
    """What exists of `path`, the folders above it and everything under it: where a writer may create things."""
    seen = {path, *path.parents}
    if path.is_dir():
        seen.update(path.rglob("*"))
    return {p for p in seen if p.exists() or p.is_symlink()}


def remove_paths(paths: Sequence[Path]) -> None:
    for p in paths:  # deepest first, so folders are empty when their turn comes
        try:
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()
        except OSError:
            pass


# ---- an output that is also an input

def same_file_problems(inputs: Sequence[tuple[str, str | None]], outputs: Sequence[tuple[str, str | None]]
                       ) -> list[Problem]:
    """A problem for each output (flag, path) that is the same file as an input (flag, path) that exists, or as an
    earlier output: writing it would replace the input the command reads (or the other output). The same file is
    os.path.samefile where the output exists (hard links, symlinks, `./a` and `a`), else the same resolved path.
    None and empty paths are skipped (their own checks report them)."""
    def same(a: str, b: str) -> bool:
        try:
            if os.path.exists(b):
                return os.path.samefile(a, b)
            return os.path.realpath(a) == os.path.realpath(b)
        except (OSError, ValueError):  # ValueError: a NUL byte in a path
            return False

    problems = []
    existing = [(flag, path) for flag, path in inputs if path and os.path.exists(path)]
    seen: list[tuple[str, str]] = []
    for flag, path in outputs:
        if not path:
            continue
        clash = next(((f, p) for f, p in existing if same(p, path)), None)
        if clash is not None:
            problems.append(Problem(f"is the input file given as {clash[0]} ({clash[1]}): writing it would replace "
                                    "the input", key=flag, file=path, fix=f"choose another {flag} path"))
        else:
            other = next(((f, p) for f, p in seen if same(p, path)), None)
            if other is not None:
                problems.append(Problem(f"is the file {other[0]} writes too ({other[1]})", key=flag, file=path,
                                        fix=f"choose another {flag} path"))
        seen.append((flag, path))
    return problems


# ---- JSON with each key once per object

class DuplicateJsonKey(ValueError):
    """A JSON object names a key twice (json.loads keeps the last value, silently); `line`: the second one's."""

    def __init__(self, key: str, line: int | None) -> None:
        super().__init__(f"key {key!r} appears twice in one JSON object")
        self.key, self.line = key, line


def loads_json_unique(text: str) -> Any:
    """json.loads, refusing an object that names a key twice (as the YAML loaders refuse a duplicate key): a config
    edited by hand may hold both an old and a new value, and the reader would take one without a word."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                # the line only where the key is written exactly twice in the text (else which object is unclear)
                hits = [m.start() for m in re.finditer(re.escape(f'"{key}"') + r"\s*:", text)]
                raise DuplicateJsonKey(key, text.count("\n", 0, hits[1]) + 1 if len(hits) == 2 else None)
            seen.add(key)
        return dict(items)

    return json.loads(text, object_pairs_hook=pairs)


def gunzip_bounded(data: bytes) -> bytes:
    """gzip unpacked, every member of it (`gzip -c a >> x.gz` appends one), refusing what unpacks past 100 times its
    size (and 64 MiB): benchmark logs and profiler traces compress 5-30 times, a file that unpacks a thousand times
    larger is not one; and a truncated stream (EOFError, as gzip.decompress raises it), not read in part."""
    limit = max(64 << 20, 100 * len(data))
    parts: list[bytes] = []
    size, rest = 0, data
    while rest:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        part = member.decompress(rest, limit + 1 - size)
        size += len(part)
        if size > limit:
            raise OSError(f"it unpacks to more than {limit:,} bytes ({size // max(len(data), 1)}x its size): not a "
                          "benchmark log or trace")
        if not member.eof:
            raise EOFError("the gzip stream ends before its end marker (a cut file)")
        parts.append(part)
        rest = member.unused_data.lstrip(b"\0")  # gzip's own padding between members is zeros
    return b"".join(parts)
