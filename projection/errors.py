"""User-facing errors. Every one names the file, the key and the fix; the CLI turns them into exit code 2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMMAND_LINE = "<command line>"  # the `file` of a Problem about a command-line flag or --set value


def count_of(n: int, noun: str) -> str:
    """'1 node', '4 nodes': a count in a message."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: where (file, key, line), what, and how to fix it."""

    message: str
    key: str | None = None
    file: str | None = None
    line: int | None = None
    fix: str | None = None

    def render(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        head = f"{where}: "
        if self.key:
            head += f"key '{self.key}': "
        text = head + self.message
        if self.fix:
            text += f"\n    fix: {self.fix}"
        return text


class ProjectionError(Exception):
    """Base class of errors caused by the user's input (exit code 2 in the CLI)."""

    def __init__(self, problems: list[Problem] | Problem | str):
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        if len(self.problems) == 1:
            return self.problems[0].render()
        lines = [f"{len(self.problems)} problems:"]
        lines += [f"  {i}. " + p.render().replace("\n", "\n     ") for i, p in enumerate(self.problems, 1)]
        return "\n".join(lines)


class ConfigError(ProjectionError):
    """A config file is missing, unreadable, malformed, or has an unknown/mistyped key."""


class PlanError(ProjectionError):
    """The parallel layout is inconsistent with the model, the batch or the cluster."""


def shown(value: Any) -> str:
    """A value as a message quotes it: whole when short, else its start and its length (a 5000-digit number, a
    layout of a million symbols), so that the message stays a line."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text)} characters)"
