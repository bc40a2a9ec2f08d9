"""Bash words for the Megatron launch-script reader: a lexer (words, operators, newlines with their lines), word
expansion (quote removal, `$NAME`, `${NAME:-default}` and friends, `${ARR[@]}`, `$(( ))` integer arithmetic) and
`test` / `[ ]` evaluation. Nothing is executed: `$(command)` stays unresolved. Semantics follow the bash manual
(sections "Shell Expansions", "Bash Conditional Expressions")."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Var:
    """A shell variable: a string or an array, with the names of unresolved variables it was built from."""

    value: str | tuple[str, ...]
    unresolved: frozenset[str] = frozenset()

    def text(self) -> str:
        return self.value if isinstance(self.value, str) else " ".join(self.value)


@dataclass(frozen=True)
class Tok:
    kind: str  # word | op | nl
    raw: str
    line: int


# ------------------------------------------------------------------------------------------------------------ lexer


def lex(text: str) -> list[Tok]:
    toks: list[Tok] = []
    buf: list[str] = []
    i, n, line, start = 0, len(text), 1, 1

    def flush() -> None:
        if buf:
            toks.append(Tok("word", "".join(buf), start))
            buf.clear()

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":  # line continuation
                i, line = i + 2, line + 1
                continue
            start = line if not buf else start
            buf.append(text[i:i + 2])
            i += 2
        elif c == "\n":
            flush()
            toks.append(Tok("nl", "\n", line))
            i, line = i + 1, line + 1
        elif c in " \t\r":
            flush()
            i += 1
        elif c == "#" and not buf:
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c in "'\"`" or (c == "$" and i + 1 < n and text[i + 1] in "({"):
            j = _match_quote(text, i) if c in "'\"`" else _match_bracket(text, i + 1)
            start = line if not buf else start
            buf.append(text[i:j])
            line += text.count("\n", i, j)
            i = j
        elif c == "(" and not buf and toks and toks[-1].kind == "word" and toks[-1].raw.startswith("--"):
            # `--moe-layer-freq ([0]*3+[1]*58)` unquoted, as a plain flag file (not bash) may write it
            j = _match_bracket(text, i)
            toks.append(Tok("word", text[i:j], line))
            line += text.count("\n", i, j)
            i = j
        elif c in ";&|()<>":
            flush()
            op = text[i:i + 2] if text[i:i + 2] in ("&&", "||", ";;") else c
            toks.append(Tok("op", op, line))
            i += len(op)
        else:
            start = line if not buf else start
            buf.append(c)
            i += 1
    flush()
    return toks


def _match_quote(text: str, i: int) -> int:
    """Index just after the quote closing the one at i (the end of text if unclosed)."""
    q, j, n = text[i], i + 1, len(text)
    while j < n:
        c = text[j]
        if c == "\\" and q != "'":
            j += 2
        elif c == q:
            return j + 1
        elif q == '"' and c == "$" and j + 1 < n and text[j + 1] in "({":
            j = _match_bracket(text, j + 1)
        else:
            j += 1
    return n


def _match_bracket(text: str, i: int) -> int:
    """Index just after the bracket closing the `(` or `{` at i, skipping quoted text."""
    open_c = text[i]
    close_c = ")" if open_c == "(" else "}"
    depth, j, n = 0, i, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c in "'\"`" and j > i:
            j = _match_quote(text, j)
            continue
        if c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n


# ------------------------------------------------------------------------------------------------------ expansion


class Expander:
    """Expands one word: quote removal, parameter expansion, arithmetic; unresolved names are collected."""

    def __init__(self, variables: Mapping[str, Var], keep_unresolved: bool):
        self.vars = variables
        self.keep = keep_unresolved
        self.unresolved: set[str] = set()

    def fields(self, raw: str) -> list[str]:
        """The words bash would produce: unquoted expansion results are split on whitespace."""
        chunks = self._walk(raw, quoted=False)
        out: list[str] = []
        cur: list[str] = []
        have = False
        for text, splittable in chunks:
            if not splittable:
                cur.append(text)
                have = True
                continue
            parts = re.split(r"[ \t\n]+", text)
            for k, part in enumerate(parts):
                if k > 0 and (cur or have):
                    out.append("".join(cur))
                    cur, have = [], False
                if part:
                    cur.append(part)
                    have = True
        if cur or have:
            out.append("".join(cur))
        return out

    def string(self, raw: str) -> str:
        """The word as one string (assignments and tests do not split)."""
        return "".join(text for text, _ in self._walk(raw, quoted=False))

    def string_no_quotes(self, raw: str) -> str:
        """Parameter expansion only, quotes kept as text (YAML values: the YAML parser already removed quoting)."""
        return "".join(text for text, _ in self._walk(raw, quoted=True))

    def _walk(self, raw: str, quoted: bool) -> list[tuple[str, bool]]:
        chunks: list[tuple[str, bool]] = []
        i, n = 0, len(raw)
        lit: list[str] = []

        def emit_lit() -> None:
            if lit:
                chunks.append(("".join(lit), False))
                lit.clear()

        while i < n:
            c = raw[i]
            if c == "\\" and i + 1 < n:
                nxt = raw[i + 1]
                if nxt == "\n":
                    i += 2
                    continue
                lit.append(nxt if (not quoted or nxt in '$`"\\') else raw[i:i + 2])
                i += 2
            elif c == "'" and not quoted:
                j = _match_quote(raw, i)
                lit.append(raw[i + 1:j - 1] if raw[j - 1:j] == "'" and j - 1 > i else raw[i + 1:j])
                i = j
            elif c == '"' and not quoted:
                j = _match_quote(raw, i)
                inner = raw[i + 1:j - 1] if j - 1 > i and raw[j - 1] == '"' else raw[i + 1:j]
                emit_lit()
                inner_chunks = self._walk(inner, quoted=True)
                chunks.extend((t, False) for t, _ in inner_chunks)
                if not inner_chunks:
                    chunks.append(("", False))
                i = j
            elif c == "$" and i + 1 < n:
                emit_lit()
                text, i = self._dollar(raw, i)
                chunks.append((text, not quoted))
            else:
                lit.append(c)
                i += 1
        emit_lit()
        return chunks

    def _dollar(self, raw: str, i: int) -> tuple[str, int]:
        nxt = raw[i + 1]
        if raw.startswith("$((", i):
            j = _match_bracket(raw, i + 1)
            return self._arith(raw[i + 3:j - 2], raw[i:j]), j
        if nxt == "(":
            j = _match_bracket(raw, i + 1)
            return self._miss(raw[i:j], raw[i:j]), j
        if nxt == "{":
            j = _match_bracket(raw, i + 1)
            return self._brace(raw[i + 2:j - 1], raw[i:j]), j
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]", raw[i + 1:])
        if not m:
            return "$", i + 1
        name = m.group(0)
        return self._lookup(name, "${" + name + "}"), i + 1 + len(name)

    def _brace(self, body: str, literal: str) -> str:
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(\[[@*]\])?(?:(:?[-=+?])(.*))?$", body, re.S)
        if not m:
            return self._miss(literal, literal)
        name, _, op, word = m.groups()
        var = self.vars.get(name)
        is_set = var is not None and (not op or not op.startswith(":") or var.text() != "")
        if op in (":-", "-", ":=", "="):
            if is_set:
                return self._lookup(name, literal)
            value = self.string(word or "")
            if op in (":=", "=") and isinstance(self.vars, dict):
                self.vars[name] = Var(value)
            return value
        if op in (":+", "+"):
            return self.string(word or "") if is_set else ""
        return self._lookup(name, literal)

    def _lookup(self, name: str, literal: str) -> str:
        var = self.vars.get(name)
        if var is None:
            return self._miss(name, literal)
        self.unresolved.update(var.unresolved)
        return var.text()

    def _miss(self, name: str, literal: str) -> str:
        self.unresolved.add(name)
        return literal if self.keep else ""

    def _arith(self, expr: str, literal: str) -> str:
        before = len(self.unresolved)
        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|\b([A-Za-z_][A-Za-z0-9_]*)\b",
                      lambda m: self._lookup(m.group(1) or m.group(2), m.group(0)), expr)
        if len(self.unresolved) == before:
            value = _safe_arith(text)
            if value is not None:
                return str(value)
        return self._miss(literal, literal)


def _safe_arith(text: str) -> int | None:
    """Integer arithmetic of a `$(( ))` body: + - * / % and parentheses on integers only (no eval)."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None

    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub | ast.UAdd):
            v = ev(n.operand)
            return -v if isinstance(n.op, ast.USub) else v
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            if isinstance(n.op, ast.Add):
                return a + b
            if isinstance(n.op, ast.Sub):
                return a - b
            if isinstance(n.op, ast.Mult) and abs(a) < 2**31 and abs(b) < 2**31:
                return a * b
            if isinstance(n.op, ast.Div | ast.FloorDiv | ast.Mod) and b:
                q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # bash truncates toward zero
                return q if not isinstance(n.op, ast.Mod) else a - b * q
        raise ValueError("not integer arithmetic")

    try:
        return ev(node)
    except ValueError:
        return None


def eval_test(args: list[str], glob: bool) -> bool | None:
    """`test` semantics for 0-3 arguments; None when the test needs the file system or is not understood."""
    if not args:
        return False
    if args[0] == "!" and len(args) > 1:
        inner = eval_test(args[1:], glob)
        return None if inner is None else not inner
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2:
        op, x = args
        if op == "-z":
            return x == ""
        if op == "-n":
            return x != ""
        return None
    if len(args) == 3:
        a, op, b = args
        if op in ("==", "="):
            return fnmatchcase(a, b) if glob else a == b
        if op == "!=":
            return not (fnmatchcase(a, b) if glob else a == b)
        ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__,
                "-ge": int.__ge__}
        if op in ints:
            try:
                return bool(ints[op](int(a), int(b)))
            except ValueError:
                return None
    return None
