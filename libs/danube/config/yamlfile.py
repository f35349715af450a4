"""Reading ``danube.yml`` strictly: safe YAML, string keys, no duplicates, bounded size.

PyYAML's ``safe_load`` quietly keeps the last of two equal keys and accepts
``on:``/``yes:`` as boolean keys; both hide typos in a config file, so this
loader refuses them with the line number. It also records the line of every key
so a validation error can point at the line the user must edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

from danube.config.errors import ConfigError, ConfigProblem, KeyPath

__all__ = ["MAX_FILE_BYTES", "MAX_VALUES", "ParsedDocument", "parse_yaml", "read_yaml_file"]

# A config file is a few kilobytes; these limits stop a huge file or an alias
# bomb (`&a [*b, *b, ...]` nested) from eating memory before validation starts.
MAX_FILE_BYTES = 1024 * 1024
MAX_VALUES = 100_000
MAX_DEPTH = 32


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """The top-level mapping of a YAML file and the 1-based line of each key path."""

    data: dict[str, Any]
    key_lines: dict[KeyPath, int]


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate and non-string mapping keys."""


def _construct_strict_mapping(loader: _StrictLoader, node: MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)  # resolve `<<` merge keys first; they may repeat on purpose
    seen: set[str] = set()
    for key_node, _value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"keys must be strings, found {key!r} (quote it)",
                key_node.start_mark,
            )
        if key in seen:
            raise ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_strict_mapping,
)


def _yaml_problem(exc: yaml.YAMLError) -> ConfigProblem:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        parts = [part for part in (exc.problem, exc.context) if part]
        message = "invalid YAML: " + ("; ".join(parts) or "syntax error")
        origin = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else None
        return ConfigProblem(path="", message=message, origin=origin)
    return ConfigProblem(path="", message=f"invalid YAML: {exc}")


def _collect_key_lines(node: Node, source: Path) -> dict[KeyPath, int]:
    lines: dict[KeyPath, int] = {}
    visited = 0
    # Iterative walk with an explicit stack: aliases may share nodes, so the count
    # (not the node identity) is what bounds the work done here and later.
    stack: list[tuple[Node, KeyPath]] = [(node, ())]
    while stack:
        current, path = stack.pop()
        visited += 1
        if visited > MAX_VALUES or len(path) > MAX_DEPTH:
            raise ConfigError.from_problems(
                [
                    ConfigProblem(
                        path="",
                        message=f"document too large (over {MAX_VALUES} values "
                        f"or nested deeper than {MAX_DEPTH})",
                    )
                ],
                source=source,
            )
        if isinstance(current, MappingNode):
            for key_node, value_node in current.value:
                child = (*path, str(key_node.value))
                lines[child] = key_node.start_mark.line + 1
                stack.append((value_node, child))
        elif isinstance(current, SequenceNode):
            for index, item_node in enumerate(current.value):
                child = (*path, index)
                lines[child] = item_node.start_mark.line + 1
                stack.append((item_node, child))
    return lines


def parse_yaml(text: str, *, source: Path) -> ParsedDocument:
    """Parse one YAML document whose top level must be a mapping (empty means ``{}``).

    Raises :class:`ConfigError` with the line number for a syntax error, a
    duplicate or non-string key, or a top level that is not a mapping.
    """
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return ParsedDocument(data={}, key_lines={})
        key_lines = _collect_key_lines(node, source)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError.from_problems([_yaml_problem(exc)], source=source) from exc
    finally:
        loader.dispose()
    if data is None:
        return ParsedDocument(data={}, key_lines={})
    if not isinstance(data, dict):
        problem = ConfigProblem(
            path="",
            message=f"the top level must be a mapping of sections, found {type(data).__name__}",
            origin="line 1",
        )
        raise ConfigError.from_problems([problem], source=source)
    return ParsedDocument(data=data, key_lines=key_lines)


def read_yaml_file(path: Path) -> ParsedDocument:
    """Read and parse ``path`` (UTF-8), turning every failure into :class:`ConfigError`."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}", source=path) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}", source=path) from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_FILE_BYTES} bytes", source=path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 (byte {exc.start}): {exc.reason}", source=path
        ) from exc
    return parse_yaml(text, source=path)
