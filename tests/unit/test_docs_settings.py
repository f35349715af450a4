"""docs/configuration.md's settings tables against the settings model (danube.config): every
key of every section is in its table, no table names a key the model lacks, and each scalar
default written in a table is the model's."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from danube.config import DanubeSettings

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs/configuration.md"
SERVICES = ("discovery", "ingest", "uploader", "retention", "cloud_reader", "dispatcher")
_NAME = re.compile(r"`([a-z_][a-z0-9_.]*)`")


def model_keys(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Dotted key → default of every leaf setting under ``model`` (the cloud union aside)."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= model_keys(annotation, f"{prefix}{name}.")
        elif _models_of(annotation):
            continue  # wal_cloud.cloud: one model per backend, checked on its own
        else:
            keys[prefix + name] = field.default
    return keys


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    return [
        arg
        for arg in typing.get_args(annotation)
        if isinstance(arg, type) and issubclass(arg, BaseModel)
    ]


def cloud_keys() -> dict[tuple[str, str], Any]:
    """(backend, key) → default of each object-store backend."""
    field = DanubeSettings.model_fields["wal_cloud"].annotation
    assert isinstance(field, type)
    assert issubclass(field, BaseModel)
    keys: dict[tuple[str, str], Any] = {}
    for backend_model in _models_of(field.model_fields["cloud"].annotation):
        (backend,) = typing.get_args(backend_model.model_fields["backend"].annotation)
        for name, value in model_keys(backend_model).items():
            if name != "backend":
                keys[(backend, name)] = value
    return keys


def _sections(text: str) -> Iterator[tuple[str, str]]:
    """(heading, body) of each `###` section of "## Sections"."""
    part = text.split("\n## Sections\n", 1)[1].split("\n## ", 1)[0]
    for chunk in part.split("\n### ")[1:]:
        heading, _, body = chunk.partition("\n")
        yield heading, body


def _tables(body: str) -> Iterator[list[dict[str, str]]]:
    """The rows of each table in ``body``, as {column: cell}."""
    lines = body.splitlines()
    for index, line in enumerate(lines):
        if not line.startswith("|---"):
            continue
        columns = [c.strip() for c in lines[index - 1].strip("|").split("|")]
        rows = []
        for row in lines[index + 1 :]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            rows.append(dict(zip(columns, cells, strict=False)))
        yield rows


def documented(text: str) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """Dotted key → its default cell; and the cloud table's (backend, key) → default cell."""
    keys: dict[str, str] = {}
    cloud: dict[tuple[str, str], str] = {}
    for heading, body in _sections(text):
        names = _NAME.findall(heading)
        if heading.startswith("Services"):
            common, specific = list(_tables(body))
            for row in common:
                for key in _NAME.findall(row["key"]):
                    for service in SERVICES:
                        keys[f"{service}.{key}"] = row["default"]
            for row in specific:
                section = _NAME.findall(row["section"])[0]
                for key in _NAME.findall(row["key"]):
                    keys[f"{section}.{key}"] = row["default"]
        elif names == ["wal_cloud.cloud"]:
            backend = ""
            for row in next(_tables(body)):
                backend = (_NAME.findall(row["backend"]) or [backend])[0]
                cloud[(backend, _NAME.findall(row["key"])[0])] = row["default"]
        elif names == ["security"]:
            # Listed in prose; types and defaults are in security.md's own table.
            prose = body.split("Keys:", 1)[1].split(" — ", 1)[0]
            for key in _NAME.findall(prose):
                keys[f"security.{key}"] = ""
        else:
            prefix = "" if names == ["cluster_name"] else f"{names[0]}."
            for table in _tables(body):
                for row in table:
                    for key in _NAME.findall(row["key"]):
                        keys[prefix + key] = row["default"]
    return keys, cloud


def _default_problem(key: object, cell: str, default: Any) -> str | None:
    """What is wrong with the default written in ``cell`` (None: right, or not a scalar)."""
    written = re.findall(r"`([^`]*)`", cell)
    if default is PydanticUndefined or not written:
        return None  # required, a factory (lists), or said in words ("none", "required")
    if default is None:
        text = "null"
    elif isinstance(default, bool):
        text = str(default).lower()
    elif isinstance(default, int | float | str):
        text = str(default)
    elif isinstance(default, Path):
        return None if Path(written[0]) == default else f"{key}: {written[0]} != {default}"
    else:
        return None
    # `a` / `b` cells hold two keys' defaults: one of them is this one's.
    return None if text in written else f"{key}: the table says {cell}, the model {text}"


def test_every_setting_is_in_its_table_and_no_other_key() -> None:
    keys, _ = documented(DOC.read_text())
    model = model_keys(DanubeSettings)
    missing, stale = sorted(set(model) - set(keys)), sorted(set(keys) - set(model))
    assert not missing, f"settings missing from docs/configuration.md: {missing}"
    assert not stale, f"keys in docs/configuration.md the settings model lacks: {stale}"


def test_every_backend_key_is_in_the_cloud_table_and_no_other() -> None:
    _, cloud = documented(DOC.read_text())
    model = cloud_keys()
    missing, stale = sorted(set(model) - set(cloud)), sorted(set(cloud) - set(model))
    assert not missing, f"(backend, key) missing from the wal_cloud.cloud table: {missing}"
    assert not stale, f"(backend, key) in the wal_cloud.cloud table, not in the model: {stale}"


def test_the_defaults_written_are_the_models() -> None:
    keys, cloud = documented(DOC.read_text())
    model = model_keys(DanubeSettings)
    cloud_model = cloud_keys()
    problems = [
        problem
        for key, cell in keys.items()
        if key in model and (problem := _default_problem(key, cell, model[key])) is not None
    ]
    problems += [
        problem
        for key, cell in cloud.items()
        if key in cloud_model
        and (problem := _default_problem(key, cell, cloud_model[key])) is not None
    ]
    assert not problems, "\n".join(problems)
