"""Read Megatron-LM flags out of a bash launch script (or a plain file of flags) without running it.

What is understood (config-formats.md §1.1 "bash scripts building arrays such as MODEL_ARGS=( --num-layers 32 ... ),
often with $VAR-style values set earlier in the script"):
* the flags a command passes, in its order (argparse: the last wins): its words, with `"${ARR[@]}"` / `$ARGS` of a
  variable holding flags (bash arrays `X=( --a 1 --b )` and `X+=(...)`, strings `X="--a 1 --b"`, also inside array
  elements: `"--fp8-format hybrid"`) expanded to the words the variable holds where the command runs, each with the
  line it was written on; an array or string the command does not use passes nothing. Where several commands pass
  flags and one runs a training script (`pretrain_gpt.py`, `train*.py`), that one's; a file without a command (a
  flag list, or assignments alone) is read as written;
* `source FILE` / `. FILE`: the file's lines run there, FILE relative to the script's folder (one that cannot be
  read is named where a value it might have set is missing);
* variables: `NAME=value` (also after export/local/declare/readonly) in script order, starting from the `env` mapping
  as bash starts from its environment, and `unset NAME` (a name unset is empty again, and not the job's; not
  followed: that a later assignment is no longer exported, and functions, whose bodies run as if called); `$NAME`,
  `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:=default}`, `${NAME:+alt}`, `${ARR[@]}` and
  `$(( integer arithmetic ))`. Positional parameters (`$1`) are unset; command substitution `$(...)` is never run,
  so it stays unresolved;
* `if / elif / else / fi` with `[ ]` / `[[ ]]` tests (-z, -n, ==, =, !=, -eq ...), joined by && and ||, so only the
  branch bash would take contributes flags, and `TEST && CMD` / `TEST || CMD` run CMD as a decided TEST says. A test
  the parser cannot decide (-f file, a command) counts as true. `case` patterns are not evaluated: what a case block
  may assign is unresolved after it (a flag using it is refused, naming the block).
An unresolved variable is kept as the literal `${NAME}` in the value and reported with it, so the caller can refuse
it only where the value is used.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from projection.formats.megatron_args import flag_to_dest, is_bool_dest, takes_one_value
from projection.formats.megatron_shell_lex import Expander, Tok, Var, eval_test, lex


@dataclass(frozen=True)
class FlagHit:
    """One `--flag [value...]` occurrence: the flag as written, its dest, whether the dest is the negation
    (store_false), the value (True for a bare flag, a string, or a list for several words), and its 1-based line."""

    flag: str
    dest: str
    inverted: bool
    value: object
    line: int | None
    unresolved: frozenset[str] = frozenset()


MAX_VALUE_CHARS = 1_000_000  # a launch script's variable holds flags and paths: far less
MAX_SOURCE_DEPTH = 8  # sourced files sourcing others (a loop of them stops here)


class ShellValueTooLong(ValueError):
    """A variable whose value grows past MAX_VALUE_CHARS (a script doubling it in a loop)."""

    def __init__(self, name: str, line: int):
        super().__init__(f"${name} grows past {MAX_VALUE_CHARS:,} characters")
        self.name, self.line = name, line


@dataclass
class ShellResult:
    flags: list[FlagHit] = field(default_factory=list)
    variables: dict[str, Var] = field(default_factory=dict)
    assigned_at: dict[str, int] = field(default_factory=dict)  # variable -> line of its last (taken) assignment
    # a switch (store_true / store_false) followed by a true/false word: argparse takes no value there and stops at
    # the word ("unrecognized arguments"), so the job would not start; (flag, word, line)
    switch_values: list[tuple[str, str, int | None]] = field(default_factory=list)
    unread_sources: list[tuple[str, int]] = field(default_factory=list)  # (file as written, line) of `source` not read
    case_set: dict[str, int] = field(default_factory=dict)  # variable -> line of the `case` block that may set it


@dataclass(frozen=True)
class _Field:
    text: str
    line: int
    unresolved: frozenset[str]


_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=(.*)$", re.S)
_ARG_LIST_REF = re.compile(r'^"?\$\{?([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?\}?"?$')
_FLAGGY = re.compile(r"(^|\s)--[A-Za-z]")
_QUIET_COMMANDS = frozenset({"echo", "printf"})
_PREFIXES = frozenset({"export", "local", "declare", "readonly", "typeset"})
_BOOL_WORDS = frozenset({"true", "false", "1", "0", "yes", "no", "on", "off"})
_TRAINING = re.compile(r"(pretrain\w*|train\w*)\.py$|pretrain_", re.I)  # a training entry point among a command's words


def parse_shell(text: str, env: Mapping[str, str] | None = None, base_dir: Path | None = None) -> ShellResult:
    """Collect the Megatron flags a bash script or flag file passes, in order (a later flag overrides). `base_dir`:
    where a relative `source FILE` / `. FILE` is looked up (the script's folder; None: sourced files are not read)."""
    return _Interpreter(env or {}, base_dir).run(lex(text))


def is_flag(text: str) -> bool:
    return len(text) > 2 and text.startswith("--") and text[2].isalpha()


# -------------------------------------------------------------------------------------------------- interpreter


class _Interpreter:
    def __init__(self, env: Mapping[str, str], base_dir: Path | None = None):
        self.result = ShellResult(variables={k: Var(str(v)) for k, v in env.items()})
        self.base_dir, self.sourcing = base_dir, 0
        self.vars = self.result.variables
        self.frames: list[list[bool]] = []  # per open `if`: [parent_active, branch_taken, active]
        # the flag words each variable holds, with the lines they were written on (expanded where a command uses the
        # variable: what argparse sees is the command's words, in its order, not every array the script defines)
        self.var_fields: dict[str, list[_Field]] = {}
        self.assigned: list[FlagHit] = []  # flags as assigned: used only where no command passes any
        self.commands: list[tuple[list[FlagHit], bool]] = []  # per command with flags: (its flags, a training run?)

    @property
    def active(self) -> bool:
        return not self.frames or self.frames[-1][2]

    def run(self, toks: list[Tok]) -> ShellResult:
        self._run(toks)
        self.result.flags = self._chosen()
        return self.result

    def _run(self, toks: list[Tok]) -> None:
        words: list[Tok] = []
        skip = False  # the command after `false-test &&` or `true-test ||`: bash does not run it
        i, n = 0, len(toks)
        while i < n:
            t = toks[i]
            if t.kind == "word" and not words and t.raw in ("if", "elif", "else", "fi", "then", "do", "done", "{",
                                                              "}", "case"):
                i = self._keyword(toks, i)
                continue
            if t.kind == "word":
                words.append(t)
                i += 1
                continue
            if t.raw == "(" and words and _ASSIGN.match(words[-1].raw) and words[-1].raw.endswith("="):
                i = self._array(toks, i + 1, words[-1])
                words = []
                continue
            if t.raw in ("&&", "||"):  # a list: the next command runs as the decided test before it says
                status = None if skip else self._test(words)
                if not skip:
                    self._command(words)
                skip = status is not None and status == (t.raw == "||")
            else:
                if not skip:
                    self._command(words)
                skip = False
            words = []
            i += 1
        if not skip:
            self._command(words)

    def _chosen(self) -> list[FlagHit]:
        """The flags argparse gets: the commands' in their order (the one training run's where several commands pass
        flags and one runs a training script), else, for a file of assignments alone, the flags as assigned."""
        if not self.commands:
            return self.assigned
        training = [hits for hits, train in self.commands if train]
        runs = training if len(training) == 1 else [hits for hits, _ in self.commands]
        return [h for hits in runs for h in hits]

    def _keyword(self, toks: list[Tok], i: int) -> int:
        kw = toks[i].raw
        if kw == "case":  # patterns are not modelled: skip the block, its assignments' values unknown after it
            line = toks[i].line
            while i < len(toks) and not (toks[i].kind == "word" and toks[i].raw == "esac"):
                m = _ASSIGN.match(toks[i].raw) if toks[i].kind == "word" else None
                if m and self.active:
                    name = m.group(1)
                    self.vars[name] = Var(f"${{{name}}}", frozenset({name}))
                    self.var_fields.pop(name, None)
                    self.result.case_set[name] = line
                i += 1
            return i + 1
        if kw in ("if", "elif"):
            j, cond = i + 1, []
            while j < len(toks) and not (toks[j].kind == "word" and toks[j].raw == "then"
                                         and toks[j - 1].kind != "word"):
                cond.append(toks[j])
                j += 1
            value = self._condition(cond) if self._parent_active(kw) else False
            if kw == "if":
                active = self.active and value
                self.frames.append([self.active, active, active])
            elif self.frames:
                frame = self.frames[-1]
                frame[2] = frame[0] and not frame[1] and value
                frame[1] = frame[1] or frame[2]
            return j + 1
        if kw == "else" and self.frames:
            frame = self.frames[-1]
            frame[2] = frame[0] and not frame[1]
            frame[1] = True
        elif kw == "fi" and self.frames:
            self.frames.pop()
        return i + 1

    def _parent_active(self, kw: str) -> bool:
        if kw == "if":
            return self.active
        return bool(self.frames) and self.frames[-1][0] and not self.frames[-1][1]

    def _condition(self, toks: list[Tok]) -> bool:
        """Evaluate `[ ... ] && [[ ... ]] || ...` left to right; an undecidable test counts as true."""
        result: bool | None = None
        pending = "&&"
        operand: list[Tok] = []
        for t in [*toks, Tok("op", ";", 0)]:
            if t.kind == "word":
                operand.append(t)
                continue
            if t.raw not in ("&&", "||", ";", "\n"):
                continue
            if operand:
                value = self._test(operand)
                value = True if value is None else value
                result = value if result is None else (result and value if pending == "&&" else result or value)
                operand = []
            if t.raw in ("&&", "||"):
                pending = t.raw
        return True if result is None else result

    def _test(self, words: list[Tok]) -> bool | None:
        negate = False
        while words and words[0].raw == "!":
            negate, words = not negate, words[1:]
        if not words:
            return None
        head, tail = words[0].raw, words[-1].raw
        if (head, tail) in (("[", "]"), ("[[", "]]")):
            body = words[1:-1]
        elif head == "test":
            body = words[1:]
        else:
            return None
        args: list[str] = []
        for w in body:
            ex = Expander(self.vars, keep_unresolved=False)
            if head == "[":
                args.extend(ex.fields(w.raw))  # unquoted empty expansions vanish inside [ ]
            else:
                args.append(ex.string(w.raw))
        value = eval_test(args, glob=head == "[[")
        return None if value is None else value != negate

    def _array(self, toks: list[Tok], i: int, head: Tok) -> int:
        elements: list[Tok] = []
        while i < len(toks) and not (toks[i].kind == "op" and toks[i].raw == ")"):
            if toks[i].kind == "word":
                elements.append(toks[i])
            i += 1
        if not self.active:
            return i + 1
        m = _ASSIGN.match(head.raw)
        assert m is not None
        name, append = m.group(1), m.group(2) == "+"
        fields: list[_Field] = []
        emitted: list[_Field] = []
        for w in elements:
            new = self._fields(w)
            fields += new
            if not self._is_arg_list_ref(w.raw):
                emitted += new
        old = self.vars.get(name)
        values = (tuple(old.value) if append and old and not isinstance(old.value, str) else ()) + tuple(
            f.text for f in fields)
        if sum(len(v) for v in values) > MAX_VALUE_CHARS:
            raise ShellValueTooLong(name, head.line)
        self.vars[name] = Var(values, frozenset().union(*(f.unresolved for f in fields)))
        self.result.assigned_at[name] = head.line
        self.var_fields[name] = (self.var_fields.get(name, []) if append else []) + self._use_fields(elements)
        self.assigned += self._flags(emitted)
        return i + 1

    def _command(self, words: list[Tok]) -> None:
        if not words or not self.active:
            return
        if words[0].raw == "unset":  # `unset [-v] NAME...` removes variables; `unset -f` names functions
            if not any(w.raw.startswith("-") and "f" in w.raw for w in words[1:]):
                for w in words[1:]:
                    name = w.raw.strip("'\"")  # `unset "X"` as `unset X`
                    if not w.raw.startswith("-"):
                        self.vars.pop(name, None)
                        self.result.assigned_at.pop(name, None)
            return
        if words[0].raw in ("source", ".") and len(words) > 1:  # runs the file's lines here, as bash does
            self._source(words[1])
            return
        while words and words[0].raw in _PREFIXES:
            words = [w for w in words[1:] if not w.raw.startswith("-")] if words[0].raw == "declare" else words[1:]
        while words and _ASSIGN.match(words[0].raw):
            self._assign(words[0])
            words = words[1:]
        if not words or words[0].raw in _QUIET_COMMANDS:
            return
        fields = self._use_fields(words)
        hits = self._flags(fields)
        if hits:
            self.commands.append((hits, any(_TRAINING.search(f.text) for f in fields if not is_flag(f.text))))

    def _source(self, word: Tok) -> None:
        """Read `source FILE` where FILE (relative to the script's folder) can be read; else say at which line a
        sourced file went unread (ShellResult.unread_sources), for the problems of what it may have set."""
        ex = Expander(self.vars, keep_unresolved=True)
        name = ex.string(word.raw)
        path = Path(name) if Path(name).is_absolute() or self.base_dir is None else self.base_dir / name
        text = None
        if not ex.unresolved and self.sourcing < MAX_SOURCE_DEPTH and path.is_file():
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = path.read_text() if path.stat().st_size <= MAX_VALUE_CHARS else None
        if text is None:
            self.result.unread_sources.append((name, word.line))
            return
        self.sourcing += 1
        try:
            self._run(lex(text))
        finally:
            self.sourcing -= 1

    def _use_fields(self, words: list[Tok]) -> list[_Field]:
        """The words as a command (or an array element list) receives them: a reference to a variable holding flags
        as the words it holds, with the lines they were written on."""
        fields: list[_Field] = []
        for w in words:
            m = _ARG_LIST_REF.match(w.raw)
            if m and self._is_arg_list_ref(w.raw) and m.group(1) in self.var_fields:
                fields += self.var_fields[m.group(1)]
            else:
                fields += self._fields(w)
        return fields

    def _assign(self, word: Tok) -> None:
        m = _ASSIGN.match(word.raw)
        assert m is not None
        name, append, raw_value = m.group(1), m.group(2) == "+", m.group(3)
        ex = Expander(self.vars, keep_unresolved=True)
        value = ex.string(raw_value)
        old = self.vars.get(name)
        if append and old is not None:
            value = old.text() + value
        if len(value) > MAX_VALUE_CHARS:
            raise ShellValueTooLong(name, word.line)
        unresolved = frozenset(ex.unresolved) | (old.unresolved if append and old else frozenset())
        self.vars[name] = Var(value, unresolved)
        self.result.assigned_at[name] = word.line
        fields = _split_flag_string(value, raw_value, word.line, unresolved) if _FLAGGY.search(value) else []
        # `X="$X --more"`: the words X held keep their own lines
        kept = self.var_fields.get(name, []) if append or re.search(rf"\$\{{?{name}\b", raw_value) else []
        self.var_fields[name] = kept + [f for f in fields if f.text not in {k.text for k in kept}] if kept else fields
        if fields:
            self.assigned += self._flags(fields)

    def _fields(self, word: Tok) -> list[_Field]:
        ex = Expander(self.vars, keep_unresolved=True)
        out: list[_Field] = []
        for text in ex.fields(word.raw):
            if _FLAGGY.search(text) and re.search(r"\s", text.strip()):  # "--fp8-format hybrid" as one element
                out += _split_flag_string(text, word.raw, word.line, frozenset(ex.unresolved))
            else:
                out.append(_Field(text, word.line, frozenset(ex.unresolved)))
        return out

    def _is_arg_list_ref(self, raw: str) -> bool:
        """`${ARR[@]}` or `$ARGS` of a variable holding flags: its flags were collected where it was assigned."""
        m = _ARG_LIST_REF.match(raw)
        if not m:
            return False
        var = self.vars.get(m.group(1))
        return var is not None and (not isinstance(var.value, str) or bool(_FLAGGY.search(var.value)))

    def _flags(self, fields: list[_Field]) -> list[FlagHit]:
        hits: list[FlagHit] = []
        i = 0
        while i < len(fields):
            f = fields[i]
            if not is_flag(f.text):
                i += 1
                continue
            name, eq, inline = f.text.partition("=")
            dest, inverted = flag_to_dest(name)
            values = [_Field(inline, f.line, f.unresolved)] if eq else []
            j = i + 1
            if not eq and is_bool_dest(dest) and j < len(fields) and fields[j].text.lower() in _BOOL_WORDS:
                self.result.switch_values.append((name, fields[j].text, f.line))
            if not eq and not is_bool_dest(dest):
                while j < len(fields) and not is_flag(fields[j].text):
                    values.append(fields[j])
                    j += 1
                if takes_one_value(dest):
                    values, j = values[:1], i + 1 + len(values[:1])
            value: object = True if not values else values[0].text if len(values) == 1 else [v.text for v in values]
            unresolved = frozenset().union(*(v.unresolved for v in values)) if values else frozenset()
            hits.append(FlagHit(name, dest, inverted, value, f.line, unresolved))
            i = j
        return hits


def _split_flag_string(value: str, raw: str, line: int, unresolved: frozenset[str]) -> list[_Field]:
    """Split a string of flags into words; each word's line is found by locating it in the raw text."""
    try:
        parts = shlex.split(value, comments=True)
    except ValueError:
        parts = value.split()
    out, pos = [], 0
    for part in parts:
        k = raw.find(part, pos)
        if k >= 0:
            pos = k + len(part)
        out.append(_Field(part, line + raw.count("\n", 0, k if k >= 0 else pos), unresolved))
    return out


