"""Where a bash launch script opens a quote it never closes (projection.formats.megatron_files refuses such a
script at that line): a scan that follows bash's quoting rules without running anything."""

from __future__ import annotations

import re

_HEREDOC = re.compile(r"<<(-?)[ \t]*\\?['\"]?([A-Za-z0-9_]+)['\"]?")
_WORD_START = " \t\n;|&()"


class _Unclosed(Exception):
    def __init__(self, pos: int, quote: str) -> None:
        self.pos, self.quote = pos, quote


def unclosed_quote(text: str) -> tuple[int, str] | None:
    """(1-based line, quote character) of the first quote a bash script opens and never closes, or None. Follows
    bash's quoting: backslash escapes outside single quotes; none inside '...' but some inside $'...'; command
    substitutions `$(...)` quote on their own, also inside "..."; `$((...))` arithmetic; here-documents (their
    bodies are not quoted text; `<<<` is a here-string); comments from an unquoted `#` at a word start. An unclosed
    quote swallows the rest of the script, so everything after it would otherwise be reported as something else
    (flags that "use" variables, missing arguments)."""
    try:
        _scan(text, 0, None)
    except _Unclosed as u:
        return text.count("\n", 0, u.pos) + 1, u.quote
    return None


def _scan(text: str, i: int, closer: str | None) -> int:
    """Scan from i to the end (closer None) or past the `)` closing a command substitution; raises _Unclosed."""
    n, depth = len(text), 0
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if closer == ")" and c == ")" and depth == 0:
            return i + 1
        if closer == ")" and c in "()":
            depth += 1 if c == "(" else -1
        if c == "#" and (i == 0 or text[i - 1] in _WORD_START):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        if c == "'":
            # $'...' (not an escaped \$ followed by a quote)
            i = _single(text, i, ansi=i > 0 and text[i - 1] == "$" and not (i > 1 and text[i - 2] == "\\"))
            continue
        if c == '"':
            i = _double(text, i)
            continue
        if c == "`":
            i = _backtick(text, i)
            continue
        if text.startswith("$((", i):
            i = _arithmetic(text, i)
            continue
        if text.startswith("$(", i):
            i = _scan(text, i + 2, ")")
            continue
        if text.startswith("<<<", i):  # a here-string: its word is quoted as any other
            i += 3
            continue
        if text.startswith("<<", i) and (here := _HEREDOC.match(text, i)):
            i = _heredoc_end(text, i, here.group(2))
            continue
        i += 1
    if closer is not None:
        raise _Unclosed(i, "$(")
    return i


def _single(text: str, i: int, ansi: bool) -> int:
    j = i + 1
    while j < len(text) and text[j] != "'":
        j += 2 if ansi and text[j] == "\\" else 1
    if j >= len(text):
        raise _Unclosed(i, "'")
    return j + 1


def _double(text: str, i: int) -> int:
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
        elif c == '"':
            return j + 1
        elif text.startswith("$((", j):
            j = _arithmetic(text, j)
        elif text.startswith("$(", j):
            j = _scan(text, j + 2, ")")
        elif c == "`":
            j = _backtick(text, j)
        else:
            j += 1
    raise _Unclosed(i, '"')


def _backtick(text: str, i: int) -> int:
    j = i + 1
    while j < len(text) and text[j] != "`":
        j += 2 if text[j] == "\\" else 1
    if j >= len(text):
        raise _Unclosed(i, "`")
    return j + 1


def _arithmetic(text: str, i: int) -> int:
    """Past the `))` closing the `$((` at i (nested parentheses counted; no quotes or here-documents inside)."""
    depth, j = 0, i + 3
    while j < len(text):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            if depth == 0:
                return j + 2 if text.startswith("))", j) else j + 1
            depth -= 1
        j += 1
    raise _Unclosed(i, "$((")


def _heredoc_end(text: str, i: int, delimiter: str) -> int:
    """Past the line that ends the here-document opened at i (the end of the text when none does)."""
    nl = text.find("\n", i)
    if nl < 0:
        return len(text)
    end = re.compile(rf"^\t*{re.escape(delimiter)}\r?$", re.M).search(text, nl + 1)
    return len(text) if end is None else end.end()
