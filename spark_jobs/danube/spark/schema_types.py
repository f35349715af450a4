"""Registered schemas → Arrow types: the type of the ``value`` column the source adds with
``decode=schema`` (docs/spark.md has the table). Pure, no I/O.

=========================================== ===============================================
Avro                                        Arrow (Spark)
=========================================== ===============================================
boolean, int, long, float, double           bool, int32, int64, float32, float64
string, enum; ``uuid``                      string
bytes, fixed                                binary
record                                      struct (a field is required unless a null union)
array, map                                  list, map<string, _>
``["null", T]`` / ``[T, "null"]``           T, nullable
``date``                                    date32 (date)
``timestamp-millis``/``-micros``            timestamp us UTC (timestamp)
``local-timestamp-millis``/``-micros``      timestamp us (timestamp_ntz)
``time-millis`` / ``time-micros``           int32 ms / int64 us of the day
``decimal`` (bytes, fixed; precision ≤ 38)  decimal128(p, s)
=========================================== ===============================================

JSON Schema: ``type`` string, integer (int64), number (float64), boolean, array (with one
``items`` schema), object with ``properties`` (a struct: a property is nullable unless it is
``required``) or with only an ``additionalProperties`` schema (a map); ``["T", "null"]`` makes
T nullable. The column's type is the one here with every struct field nullable
(:func:`column_type`); decoding checks what is required. Anything else (other unions,
recursive Avro types, ``$ref``, ``oneOf``, an object with no properties...) is refused
with :class:`UnsupportedSchemaError` naming the path in the schema (``$.address.zip``,
``$.tags[]`` for items, ``$.attrs{}`` for map values).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fastavro
import orjson
import pyarrow as pa

from danube.spark.errors import UnsupportedSchemaError

DECIMAL_PRECISION_MAX = 38  # Spark's DecimalType

_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_AVRO_LOGICAL: dict[tuple[str, str], pa.DataType] = {
    ("date", "int"): pa.date32(),
    ("timestamp-millis", "long"): pa.timestamp("us", tz="UTC"),
    ("timestamp-micros", "long"): pa.timestamp("us", tz="UTC"),
    ("local-timestamp-millis", "long"): pa.timestamp("us"),
    ("local-timestamp-micros", "long"): pa.timestamp("us"),
    ("time-millis", "int"): pa.int32(),
    ("time-micros", "long"): pa.int64(),
    ("uuid", "string"): pa.string(),
}
_JSON_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "integer": pa.int64(),
    "number": pa.float64(),
    "boolean": pa.bool_(),
}


def list_of(item: pa.DataType, nullable: bool) -> pa.DataType:
    """A list type as PySpark builds it for an ArrayType (item field ``element``)."""
    return pa.list_(pa.field("element", item, nullable=nullable))


def map_of(value: pa.DataType, nullable: bool) -> pa.DataType:
    """A map<string, value> as PySpark builds it for a MapType."""
    return pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", value, nullable))


def parse_avro(definition: str) -> Any:
    """The fastavro form of an Avro definition (names fully qualified)."""
    return fastavro.parse_schema(orjson.loads(definition))


def avro_arrow_type(definition: str) -> pa.DataType:
    """The Arrow type of the datum an Avro schema describes (the top level may be any type)."""
    parsed = parse_avro(definition)
    named: dict[str, Any] = (
        dict(parsed.get("__named_schemas", {})) if isinstance(parsed, dict) else {}
    )
    arrow, _ = _avro(parsed, "$", named, ())
    return arrow


def _avro(
    schema: Any, path: str, named: Mapping[str, Any], seen: tuple[str, ...]
) -> tuple[pa.DataType, bool]:
    """(type, nullable) of one Avro schema; ``seen`` holds the records being expanded."""
    if isinstance(schema, list):
        return _avro_union(schema, path, named, seen)
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[schema], False
        if schema == "null":
            raise UnsupportedSchemaError(path, "a null type alone has no column type")
        if schema not in named:
            raise UnsupportedSchemaError(path, f"unknown type {schema!r}")
        return _avro(named[schema], path, named, seen)
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        if precision > DECIMAL_PRECISION_MAX:
            raise UnsupportedSchemaError(path, f"decimal precision {precision} is over 38")
        return pa.decimal128(precision, scale), False
    if isinstance(kind, str) and (logical, kind) in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[(logical, kind)], False
    if kind == "record":
        name = schema["name"]
        if name in seen:
            raise UnsupportedSchemaError(path, f"record {name} contains itself (recursive)")
        fields = []
        for field in schema["fields"]:
            arrow, nullable = _avro(field["type"], f"{path}.{field['name']}", named, (*seen, name))
            fields.append(pa.field(field["name"], arrow, nullable=nullable))
        return pa.struct(fields), False
    if kind == "enum":
        return pa.string(), False
    if kind == "fixed":
        return pa.binary(), False
    if kind == "array":
        item, nullable = _avro(schema["items"], f"{path}[]", named, seen)
        return list_of(item, nullable), False
    if kind == "map":
        value, nullable = _avro(schema["values"], path + "{}", named, seen)
        return map_of(value, nullable), False
    # {"type": "int"} and the like, or a logical type without a mapping (its base type).
    return _avro(kind, path, named, seen)


def _avro_union(
    branches: list[Any], path: str, named: Mapping[str, Any], seen: tuple[str, ...]
) -> tuple[pa.DataType, bool]:
    others = [branch for branch in branches if branch != "null"]
    if len(others) != 1:
        raise UnsupportedSchemaError(
            path,
            "only a union of null and one type has a column type, not "
            + orjson.dumps(branches).decode(),
        )
    arrow, _ = _avro(others[0], path, named, seen)
    return arrow, len(others) < len(branches)


def json_schema_arrow_type(definition: str) -> pa.DataType:
    """The Arrow type of the documents a JSON Schema describes."""
    arrow, _ = _json(orjson.loads(definition), "$")
    return arrow


_JSON_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "format",
        "deprecated",
        "readOnly",
        "writeOnly",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "required",
        "properties",
        "additionalProperties",
        "items",
        "type",
        "const",
    }
)  # keywords that only restrict values within the type; any other is refused


def _json(schema: Any, path: str) -> tuple[pa.DataType, bool]:
    if not isinstance(schema, dict):
        raise UnsupportedSchemaError(path, "a boolean schema has no column type")
    unknown = sorted(set(schema) - _JSON_ANNOTATIONS)
    if unknown:
        raise UnsupportedSchemaError(path, f"{unknown[0]!r} is not supported")
    declared = schema.get("type")
    if declared is None:
        raise UnsupportedSchemaError(path, "no 'type'")
    types = [declared] if isinstance(declared, str) else list(declared)
    others = [kind for kind in types if kind != "null"]
    if len(others) != 1:
        raise UnsupportedSchemaError(path, f"type {declared!r}: only one type (and null) maps")
    nullable = len(others) < len(types)
    kind = others[0]
    if kind in _JSON_TYPES:
        return _JSON_TYPES[kind], nullable
    if kind == "array":
        if not isinstance(schema.get("items"), dict):
            raise UnsupportedSchemaError(path, "an array needs one 'items' schema")
        item, item_nullable = _json(schema["items"], f"{path}[]")
        return list_of(item, item_nullable), nullable
    if kind == "object":
        return _json_object(schema, path), nullable
    raise UnsupportedSchemaError(path, f"type {kind!r} has no column type")


def _json_object(schema: dict[str, Any], path: str) -> pa.DataType:
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if not properties and isinstance(extra, dict):
        value, nullable = _json(extra, path + "{}")
        return map_of(value, nullable)
    if not isinstance(properties, dict) or not properties:
        raise UnsupportedSchemaError(
            path, "an object needs 'properties' (or only an 'additionalProperties' schema)"
        )
    required = set(schema.get("required", ()))
    fields = []
    for name, sub in properties.items():
        arrow, nullable = _json(sub, f"{path}.{name}")
        fields.append(pa.field(name, arrow, nullable=nullable or name not in required))
    return pa.struct(fields)


def column_type(strict: pa.DataType) -> pa.DataType:
    """``strict`` with every struct field nullable: the ``value`` column's type.

    Decoding checks required fields against ``strict`` (a missing one is a decode error),
    but the column cannot say so: a null struct (an optional record, or ``value`` itself
    when a payload does not decode) with not-null fields is refused by Arrow when PySpark
    collects it (``toArrow``, ``toPandas``: "nulls in input cannot be viewed as
    non-nullable"). List items and map values keep their nullability.
    """
    if pa.types.is_struct(strict):
        return pa.struct(
            [
                pa.field(strict.field(i).name, column_type(strict.field(i).type), nullable=True)
                for i in range(strict.num_fields)
            ]
        )
    if pa.types.is_map(strict):
        value = strict.item_field
        return map_of(column_type(value.type), value.nullable)
    if pa.types.is_list(strict):
        item = strict.value_field
        return list_of(column_type(item.type), item.nullable)
    return strict


def arrow_type_of(schema_type: str, definition: str) -> pa.DataType:
    """The ``value`` column's type for a definition of ``schema_type`` (avro, json_schema)."""
    if schema_type == "avro":
        return avro_arrow_type(definition)
    if schema_type == "json_schema":
        return json_schema_arrow_type(definition)
    raise UnsupportedSchemaError("$", f"{schema_type} payloads are not decoded")
