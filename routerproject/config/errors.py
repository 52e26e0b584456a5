"""A configuration problem, named by its dotted key and file line.

A node that refuses to start must say exactly what to fix: every problem is a ``ConfigError``
that names the dotted key and, where the key is in the file, its line.
"""

from __future__ import annotations

from pathlib import Path


class ConfigError(Exception):
    """An invalid configuration, naming the dotted key and file line where known.

    When several problems were found, this error describes the first one (by file line)
    and ``problems`` holds all of them; ``str()`` prints one per line.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        line: int | None = None,
        path: Path | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.key = key
        self.line = line
        self.path = path
        self.problems: tuple[ConfigError, ...] = (self,)

    def describe(self) -> str:
        """This single problem as ``file:line: key: message``."""
        if self.path is not None:
            location = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        elif self.line:
            location = f"line {self.line}: "
        else:
            location = ""
        key = f"{self.key}: " if self.key else ""
        return f"{location}{key}{self.message}"

    def __str__(self) -> str:
        return "\n".join(problem.describe() for problem in self.problems)


def combine(problems: list[ConfigError]) -> ConfigError:
    # Report in file order so "the first error" is the one a reader meets first.
    ordered = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
    first = ordered[0]
    first.problems = tuple(ordered)
    return first
