"""JSON Schema: parsing against the metaschema (jsonschema), the fingerprint, and the
compatibility subset this registry checks.

The schema's dialect is its ``$schema`` (Draft 2020-12 when absent); the definition is
checked against that dialect's metaschema and an error names the JSON path of the fault.

:func:`accepts_all` answers whether every document valid under ``writer`` is valid under
``reader`` (the reader's schema is at least as wide), for the subset of keywords below;
each failure names its rule and JSON path:

- ``type_narrowed``: the reader's ``type`` leaves out a type the writer allows (``integer``
  is within ``number``; a writer without ``type`` allows every type).
- ``required_added``: the reader requires a property the writer does not.
- ``property_removed_closed_model``: a writer property the reader does not declare, while
  the reader refuses undeclared properties (``additionalProperties: false``).
- ``additional_properties_closed``: the reader closes the content model
  (``additionalProperties: false``) that the writer left open.
- ``enum_narrowed``: a writer ``enum`` value the reader's ``enum`` lacks (or the reader adds
  an ``enum`` the writer did not have).
- ``range_narrowed``: a bound got tighter: ``minimum``, ``exclusiveMinimum``, ``minLength``,
  ``minItems``, ``minProperties`` rose, or their ``max`` twins fell (or appeared).
- ``properties``, ``items`` (a single schema) and ``additionalProperties`` (a schema) are
  compared recursively by these rules.
- ``unsupported_change``: any other keyword of the reader's whose value differs from the
  writer's (``$ref``, ``oneOf``, ``pattern``, ``const``...). It is not analysed, so it is
  refused rather than guessed (one the writer has and the reader dropped only widens).
  Annotations (``title``, ``description``, ``$comment``, ``examples``, ``default``,
  ``format``, ``$id``, ``$schema``, ``deprecated``, ``readOnly``, ``writeOnly``) are ignored.

Adding an optional property to an open content model is accepted (Confluent refuses it,
since an old document may carry that name with another type; this registry takes that risk
for the common case of adding optional fields).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError

from danube.schemas.errors import InvalidSchemaError

_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "$comment",
        "examples",
        "default",
        "format",
        "$id",
        "$schema",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
_HANDLED = frozenset(
    {"type", "properties", "required", "additionalProperties", "enum", "items"}
    | {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"}
    | {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"}
)
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})


def parse(definition: str) -> tuple[Any, bytes]:
    """The schema (a dict or a boolean) and its canonical form: JSON with sorted keys and no
    whitespace."""
    try:
        schema = orjson.loads(definition)
    except orjson.JSONDecodeError as exc:
        raise InvalidSchemaError(
            schema_type="json_schema",
            location=f"line {exc.lineno} column {exc.colno}",
            reason=exc.msg,
        ) from exc
    if not isinstance(schema, dict | bool):
        raise InvalidSchemaError(
            schema_type="json_schema", location="$", reason="a schema is an object or a boolean"
        )
    cls = validators.validator_for(schema, default=Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise InvalidSchemaError(
            schema_type="json_schema", location=exc.json_path, reason=exc.message
        ) from exc
    return schema, orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)


def fingerprint(canonical: bytes) -> str:
    """sha256 of the canonical form, in hex."""
    return hashlib.sha256(canonical).hexdigest()


def accepts_all(reader: Any, writer: Any) -> list[str]:
    """The failed rules (empty: every document valid under ``writer`` is valid under
    ``reader``, as far as the checked subset tells)."""
    errors: list[str] = []
    _compare(reader, writer, "$", errors)
    return errors


def _as_dict(schema: Any) -> dict[str, Any]:
    if schema is True:
        return {}
    if schema is False:
        return {"not": {}}
    return dict(schema)


def _types(schema: dict[str, Any]) -> frozenset[str]:
    found = schema.get("type")
    if found is None:
        return _ALL_TYPES
    names = frozenset([found] if isinstance(found, str) else found)
    return names | {"integer"} if "number" in names else names


def _compare(reader_in: Any, writer_in: Any, path: str, errors: list[str]) -> None:
    reader, writer = _as_dict(reader_in), _as_dict(writer_in)
    if reader == writer:
        return
    lost = _types(writer) - _types(reader)
    if lost:
        errors.append(f"type_narrowed at {path}: the reader no longer allows {sorted(lost)}")
    _compare_object(reader, writer, path, errors)
    if isinstance(reader.get("items"), dict | bool) or isinstance(writer.get("items"), dict | bool):
        _compare(reader.get("items", True), writer.get("items", True), path + ".items", errors)
    _compare_enum(reader, writer, path, errors)
    _compare_bounds(reader, writer, path, errors)
    # A keyword only the writer has is a constraint dropped: the reader is wider there.
    for key in sorted(reader.keys() - _HANDLED - _ANNOTATIONS):
        if reader[key] != writer.get(key):
            errors.append(
                f"unsupported_change at {path}.{key}: the keyword changed and is not analysed"
            )


def _compare_object(
    reader: dict[str, Any], writer: dict[str, Any], path: str, errors: list[str]
) -> None:
    added = sorted(set(reader.get("required", [])) - set(writer.get("required", [])))
    if added:
        errors.append(f"required_added at {path}: the reader requires {added}")
    reader_props = reader.get("properties", {})
    writer_props = writer.get("properties", {})
    reader_extra = reader.get("additionalProperties", True)
    writer_extra = writer.get("additionalProperties", True)
    for name, prop in sorted(writer_props.items()):
        here = f"{path}.properties.{name}"
        if name in reader_props:
            _compare(reader_props[name], prop, here, errors)
        elif reader_extra is False:
            errors.append(
                f"property_removed_closed_model at {here}: the reader does not declare it "
                "and refuses undeclared properties"
            )
        else:
            _compare(reader_extra, prop, here, errors)
    if reader_extra is False and writer_extra is not False:
        errors.append(
            f"additional_properties_closed at {path}.additionalProperties: the writer allows "
            "undeclared properties, the reader refuses them"
        )
    elif isinstance(reader_extra, dict) and writer_extra is not False:
        _compare(reader_extra, writer_extra, path + ".additionalProperties", errors)


def _compare_enum(
    reader: dict[str, Any], writer: dict[str, Any], path: str, errors: list[str]
) -> None:
    if "enum" not in reader:
        return
    if "enum" not in writer:
        errors.append(f"enum_narrowed at {path}.enum: the reader adds an enum")
        return
    lost = [value for value in writer["enum"] if value not in reader["enum"]]
    if lost:
        errors.append(f"enum_narrowed at {path}.enum: the reader lacks {lost}")


def _compare_bounds(
    reader: dict[str, Any], writer: dict[str, Any], path: str, errors: list[str]
) -> None:
    for key in _LOWER_BOUNDS:
        if key in reader and (key not in writer or reader[key] > writer[key]):
            errors.append(f"range_narrowed at {path}.{key}: {writer.get(key)} -> {reader[key]}")
    for key in _UPPER_BOUNDS:
        if key in reader and (key not in writer or reader[key] < writer[key]):
            errors.append(f"range_narrowed at {path}.{key}: {writer.get(key)} -> {reader[key]}")
