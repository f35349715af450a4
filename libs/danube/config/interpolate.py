"""``${VAR}`` references in YAML string values, resolved from the environment.

Grammar (the only thing ever evaluated; no commands, no expressions)::

    ${NAME}             the value of NAME; an error if NAME is unset
    ${NAME:-default}    the value of NAME, or ``default`` if NAME is unset or empty
    $$                  a literal ``$`` (so ``$${NAME}`` stays ``${NAME}``)

NAME is ``[A-Za-z_][A-Za-z0-9_]*``; a default is literal text without ``}``.
Only values are interpolated, never keys, and a substituted value is not
scanned again, so a secret containing ``${`` is taken as is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from danube.config.errors import ConfigProblem, KeyPath, format_key_path

__all__ = ["interpolate_document", "interpolate_value"]

# One token: `$$`, a closed `${...}`, or a `${` that never closes (reported, not kept).
_TOKEN = re.compile(r"\$(?:(?P<escape>\$)|\{(?P<body>[^}]*)\}|(?P<unclosed>\{))")
_BODY = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>.*))?", re.DOTALL)


class _Unresolved(Exception):
    """A reference that cannot be resolved; carries the message for the problem."""


def interpolate_value(text: str, environ: Mapping[str, str]) -> str:
    """Resolve every reference in one string; raise ``ValueError`` naming the first bad one."""
    try:
        return _TOKEN.sub(lambda match: _resolve(match, environ), text)
    except _Unresolved as exc:
        raise ValueError(str(exc)) from None


def _resolve(match: re.Match[str], environ: Mapping[str, str]) -> str:
    if match.group("escape") is not None:
        return "$"
    body = match.group("body")
    if body is None:
        raise _Unresolved("unclosed '${' (write '$${' for a literal)")
    parsed = _BODY.fullmatch(body)
    if parsed is None:
        raise _Unresolved(f"bad reference '${{{body}}}': expected ${{NAME}} or ${{NAME:-default}}")
    name, default = parsed.group("name"), parsed.group("default")
    if default is not None and "${" in default:
        raise _Unresolved(f"nested reference in the default of '${{{name}}}' is not supported")
    value = environ.get(name)
    if default is not None:
        return value if value else default
    if value is None:
        raise _Unresolved(f"environment variable {name} is not set (referenced as '${{{name}}}')")
    return value


def interpolate_document(
    document: Mapping[str, Any],
    environ: Mapping[str, str],
    key_lines: Mapping[KeyPath, int] | None = None,
) -> tuple[dict[str, Any], list[ConfigProblem]]:
    """Return a copy of ``document`` with every string value interpolated.

    Every bad reference is collected as a problem naming its key path (and its
    line, when ``key_lines`` is given) instead of stopping at the first one.
    """
    problems: list[ConfigProblem] = []
    lines = key_lines or {}

    def walk(value: Any, path: KeyPath) -> Any:
        if isinstance(value, str):
            try:
                return interpolate_value(value, environ)
            except ValueError as exc:
                line = lines.get(path)
                origin = f"line {line}" if line is not None else None
                problems.append(ConfigProblem(format_key_path(path), str(exc), origin))
                return value
        if isinstance(value, Mapping):
            return {key: walk(item, (*path, key)) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item, (*path, index)) for index, item in enumerate(value)]
        return value

    result = {key: walk(value, (key,)) for key, value in document.items()}
    return result, problems
