"""Errors raised while loading settings.

::

    DanubeError
    └── ConfigError      code "bad_config", never retriable: every problem found
                         at start, each named by the key path the user wrote

A process that gets a :class:`ConfigError` should print its message and exit;
retrying cannot help until someone edits the file or the environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from danube.errors import DanubeError

__all__ = ["ConfigError", "ConfigProblem", "KeyPath", "format_key_path"]

# A key path as the user wrote it: mapping keys and list indexes, outermost first.
KeyPath = tuple[str | int, ...]


def format_key_path(path: KeyPath) -> str:
    """Render ``("bus", "servers", 0)`` as ``bus.servers[0]``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One bad setting.

    ``path`` is the dotted key path as written in the file (``wal_cloud.cloud.region``,
    list items as ``bus.servers[0]``); it is ``""`` for a problem with the whole
    document. ``origin`` says where the value came from when known: ``"line 12"``
    of the file, or the environment variable that set it.
    """

    path: str
    message: str
    origin: str | None = None

    def __str__(self) -> str:
        where = self.path or "<document>"
        suffix = f" [{self.origin}]" if self.origin else ""
        return f"{where}: {self.message}{suffix}"


class ConfigError(DanubeError):
    """The settings cannot be loaded: a missing or unreadable file, or bad values.

    ``problems`` lists every bad setting found (not just the first); ``source`` is
    the YAML file involved, if any.
    """

    code = "bad_config"
    retriable = False

    def __init__(
        self,
        message: str,
        *,
        problems: Sequence[ConfigProblem] = (),
        source: Path | None = None,
    ) -> None:
        super().__init__(message)
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        self.source = source

    @classmethod
    def from_problems(
        cls, problems: Sequence[ConfigProblem], *, source: Path | None
    ) -> ConfigError:
        """Build the error whose message lists every problem, one per line."""
        where = f" in {source}" if source is not None else ""
        count = len(problems)
        noun = "problem" if count == 1 else "problems"
        lines = [f"invalid configuration{where} ({count} {noun}):"]
        lines.extend(f"  {problem}" for problem in problems)
        return cls("\n".join(lines), problems=problems, source=source)
