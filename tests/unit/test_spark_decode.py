"""decode=schema without Spark: Avro and JSON Schema → Arrow types (and the Spark types
PySpark converts them to and back, unchanged), unsupported schemas named by path, payload
decoding with Avro writer/reader resolution, JSON fitted to the latest type, and bad
payloads giving a null value and a decode_error; the option and the batch columns."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import re
import uuid
from typing import Any

import fastavro
import orjson
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from danube.frame import Record, decode_frames, encode_frame, encode_record
from danube.spark import InvalidOptionError, parse_options
from danube.spark.arrow import BatchBuilder, arrow_schema
from danube.spark.decode import PayloadDecoder, TopicSchema
from danube.spark.errors import UnsupportedSchemaError
from danube.spark.schema_types import (
    avro_arrow_type,
    column_type,
    json_schema_arrow_type,
    list_of,
    map_of,
)
from danube.spark.source import spark_schema

pytestmark = pytest.mark.unit

USER_V1 = {
    "type": "record",
    "name": "User",
    "namespace": "acme",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "email", "type": ["null", "string"], "default": None},
    ],
}
USER_V2 = {  # v1 + a field with a default, and int → long promotion elsewhere
    **USER_V1,
    "fields": [*USER_V1["fields"], {"name": "age", "type": "int", "default": -1}],
}
EVERYTHING = {
    "type": "record",
    "name": "E",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "color", "type": {"type": "enum", "name": "C", "symbols": ["RED", "BLUE"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": ["null", "long"]}},
        {
            "name": "inner",
            "type": {"type": "record", "name": "In", "fields": [{"name": "x", "type": "int"}]},
        },
        {"name": "again", "type": ["null", "In"]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "tod", "type": {"type": "int", "logicalType": "time-millis"}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
    ],
}
UTC_US = pa.timestamp("us", tz="UTC")
IN = pa.struct([pa.field("x", pa.int32(), nullable=False)])
EVERYTHING_ARROW = pa.struct(
    [
        pa.field(name, arrow, nullable=nullable)
        for name, arrow, nullable in [
            ("b", pa.bool_(), False),
            ("i", pa.int32(), False),
            ("l", pa.int64(), False),
            ("f", pa.float32(), False),
            ("d", pa.float64(), False),
            ("s", pa.string(), False),
            ("raw", pa.binary(), False),
            ("fx", pa.binary(), False),
            ("color", pa.string(), False),
            ("tags", list_of(pa.string(), False), False),
            ("counts", map_of(pa.int64(), True), False),
            ("inner", IN, False),
            ("again", IN, True),
            ("day", pa.date32(), False),
            ("at_ms", UTC_US, False),
            ("at_us", UTC_US, False),
            ("local", pa.timestamp("us"), False),
            ("tod", pa.int32(), False),
            ("price", pa.decimal128(10, 2), False),
            ("uid", pa.string(), False),
        ]
    ]
)
ORDER_JSON = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "note": {"type": ["string", "null"]},
        "total": {"type": "number", "minimum": 0},
        "paid": {"type": "boolean"},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku"],
            },
        },
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["id", "total"],
}
LINE = pa.struct(
    [pa.field("sku", pa.string(), nullable=False), pa.field("qty", pa.int64(), nullable=True)]
)
ORDER_ARROW = pa.struct(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("note", pa.string(), nullable=True),
        pa.field("total", pa.float64(), nullable=False),
        pa.field("paid", pa.bool_(), nullable=True),
        pa.field("lines", list_of(LINE, False), nullable=True),
        pa.field("labels", map_of(pa.string(), False), nullable=True),
    ]
)


def _text(schema: Any) -> str:
    return orjson.dumps(schema).decode()


def _avro(schema: Any, datum: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    return out.getvalue()


def _topic(schema_type: str, *definitions: Any, latest: int | None = None) -> TopicSchema:
    versions = {i + 1: _text(d) for i, d in enumerate(definitions)}
    return TopicSchema("/ns/t", "subj", 7, schema_type, latest or len(versions), versions)


def test_avro_types_map_to_arrow_and_spark_and_back() -> None:
    assert avro_arrow_type(_text(EVERYTHING)) == EVERYTHING_ARROW
    assert avro_arrow_type('"string"') == pa.string()
    column = column_type(EVERYTHING_ARROW)
    assert all(column.field(i).nullable for i in range(column.num_fields))
    assert column.field("inner").type == pa.struct([pa.field("x", pa.int32(), nullable=True)])
    assert column.field("tags").type == EVERYTHING_ARROW.field("tags").type  # items keep theirs
    for value_type in (column, column_type(ORDER_ARROW), pa.string()):
        # What PySpark expects of a batch for the Spark schema is the schema the batch has.
        assert to_arrow_schema(spark_schema(value_type), timezone="UTC").equals(
            arrow_schema(value_type)
        )
    assert (
        spark_schema(column)
        .simpleString()
        .endswith(
            "counts:map<string,bigint>,inner:struct<x:int>,again:struct<x:int>,day:date,"
            "at_ms:timestamp,at_us:timestamp,local:timestamp_ntz,tod:int,price:decimal(10,2),"
            "uid:string>,decode_error:string>"
        )
    )


def test_json_schema_types_map_to_arrow() -> None:
    assert json_schema_arrow_type(_text(ORDER_JSON)) == ORDER_ARROW


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({**USER_V1, "fields": [{"name": "v", "type": ["int", "string"]}]}, "$.v: only a union"),
        (
            {
                "type": "record",
                "name": "Node",
                "fields": [{"name": "next", "type": ["null", "Node"]}],
            },
            "$.next: record Node contains itself",
        ),
        ({"type": "array", "items": "null"}, "$[]: a null type alone"),
        (
            {"type": "map", "values": {"type": "bytes", "logicalType": "decimal", "precision": 40}},
            "${}: decimal precision 40",
        ),
    ],
)
def test_avro_schemas_with_no_spark_type_name_the_path(schema: Any, where: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="^" + re.escape(where)):
        avro_arrow_type(_text(schema))


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}}, "$.a: 'oneOf'"),
        ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "$.a: type"),
        ({"type": "object", "properties": {"a": {"type": "array"}}}, "$.a: an array needs"),
        ({"type": "object", "properties": {"a": {"type": "object"}}}, "$.a: an object needs"),
        ({"type": "object", "properties": {"a": {"description": "?"}}}, "$.a: no 'type'"),
        (
            {"type": "array", "items": {"type": "object", "properties": {"b": {"$ref": "#"}}}},
            "$[].b: '$ref'",
        ),
    ],
)
def test_json_schemas_with_no_spark_type_name_the_path(schema: Any, where: str) -> None:
    with pytest.raises(UnsupportedSchemaError, match="^" + re.escape(where)):
        json_schema_arrow_type(_text(schema))


def test_avro_payloads_decode_every_type() -> None:
    datum = {
        "b": True, "i": -5, "l": 2**40, "f": 1.5, "d": 2.25, "s": "é", "raw": b"\x00",
        "fx": b"abcd", "color": "BLUE", "tags": ["x", "y"], "counts": {"a": 1, "b": None},
        "inner": {"x": 3}, "again": None, "day": dt.date(2024, 5, 1),
        "at_ms": dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.UTC),
        "at_us": dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=dt.UTC),
        "local": dt.datetime(2024, 5, 1, 12, 0, 0, 5000),
        "tod": dt.time(1, 2, 3, 4000), "price": decimal.Decimal("12.34"),
        "uid": uuid.UUID(int=1),
    }  # fmt: skip
    decoder = PayloadDecoder(_topic("avro", EVERYTHING))
    value, error = decoder.decode(_avro(EVERYTHING, datum), 7, 1)
    assert error is None
    assert value["tod"] == 3_723_004
    column, errors = decoder.columns([_avro(EVERYTHING, datum)], [7], [1])
    row = column.to_pylist()[0]
    assert row == {
        **datum,
        "counts": [("a", 1), ("b", None)],
        "tod": 3_723_004,
        "uid": "00000000-0000-0000-0000-000000000001",
    }
    assert errors.to_pylist() == [None]


def test_avro_reads_every_writer_version_with_the_latest_as_reader() -> None:
    decoder = PayloadDecoder(_topic("avro", USER_V1, USER_V2))
    old = _avro(USER_V1, {"id": 1, "name": "a", "email": None})
    new = _avro(USER_V2, {"id": 2, "name": "b", "email": "b@x", "age": 30})
    values, errors = decoder.columns([old, new], [7, 7], [1, 2])
    assert values.to_pylist() == [
        {"id": 1, "name": "a", "email": None, "age": -1},  # the reader's default
        {"id": 2, "name": "b", "email": "b@x", "age": 30},
    ]
    assert errors.to_pylist() == [None, None]
    # Read as version 2, a version-1 payload ends early: the stamp is what makes it right.
    value, error = decoder.decode(old, 7, 2)
    assert value is None
    assert error is not None
    assert error.startswith("not Avro of version 2")


def test_bad_avro_payloads_give_a_decode_error_and_a_null_value() -> None:
    decoder = PayloadDecoder(_topic("avro", USER_V1, USER_V2))
    good = _avro(USER_V2, {"id": 2, "name": "b", "email": None, "age": 1})
    payloads = [good + b"\x00", good[:3], good, good, good]
    values, errors = decoder.columns(payloads, [7, 7, None, 8, 7], [2, 2, None, 2, 9])
    assert values.to_pylist() == [None] * 5
    assert errors.to_pylist() == [
        "1 bytes left over after an Avro datum of version 2",
        errors[1].as_py(),
        "no schema version on the record (written before binding?)",
        "written with schema id 8, not 7 (subject subj)",
        "version 9 of subj is not registered",
    ]
    assert errors[1].as_py().startswith("not Avro of version 2:")


def test_json_payloads_fit_the_latest_type_or_say_where_they_do_not() -> None:
    decoder = PayloadDecoder(_topic("json_schema", {"type": "object"}, ORDER_JSON))
    good = {
        "id": 1, "total": 9, "note": None, "lines": [{"sku": "a", "qty": 2.0}, {"sku": "b"}],
        "labels": {"k": "v"}, "extra": "dropped",
    }  # fmt: skip
    payloads = [
        orjson.dumps(good),
        orjson.dumps({"id": "1", "total": 1}),
        orjson.dumps({"total": 1}),
        orjson.dumps({"id": 1, "total": 1, "lines": [{"qty": 1}]}),
        orjson.dumps({"id": 2**63, "total": 1}),
        orjson.dumps({"id": 1, "total": True}),
        b"{not json",
        orjson.dumps([1]),
    ]
    values, errors = decoder.columns(payloads, [7] * 8, [1] * 8)  # versions do not matter
    assert values.to_pylist()[0] == {
        "id": 1,
        "note": None,
        "total": 9.0,
        "paid": None,
        "lines": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": None}],
        "labels": [("k", "v")],
    }
    assert values.to_pylist()[1:] == [None] * 7
    assert errors.to_pylist()[:6] == [
        None,
        "$.id: expected int64, got str",
        "$.id: missing or null, but required",
        "$.lines[0].sku: missing or null, but required",
        f"$.id: {2**63} does not fit int64",
        "$.total: expected double, got bool",
    ]
    assert errors[6].as_py().startswith("not JSON: ")
    assert errors[7].as_py() == "$: expected an object, got list"


def test_batches_carry_value_and_decode_error_columns() -> None:
    topic = _topic("avro", USER_V1)
    payload = _avro(USER_V1, {"id": 5, "name": "n", "email": "e"})
    records = [
        Record(payload=payload, publish_time_ms=1, producer="p", schema_id=7, schema_version=1),
        Record(payload=b"\xff", publish_time_ms=2, producer="p", schema_id=7, schema_version=1),
    ]
    frames, _ = decode_frames(
        b"".join(encode_frame(i, encode_record(r)) for i, r in enumerate(records))
    )
    builder = BatchBuilder("/ns/t", 0, "obj", decoder=PayloadDecoder(topic))
    for frame in frames:
        builder.add(frame)
    batch = builder.take()
    assert batch.schema.equals(arrow_schema(topic.value_type()))
    rows = batch.select(["schema_id", "schema_version", "value"]).to_pylist()
    assert rows == [
        {"schema_id": 7, "schema_version": 1, "value": {"id": 5, "name": "n", "email": "e"}},
        {"schema_id": 7, "schema_version": 1, "value": None},
    ]
    assert batch.column("decode_error")[0].as_py() is None
    assert batch.column("decode_error")[1].as_py().startswith("not Avro of version 1")


def test_the_decode_option() -> None:
    assert parse_options({"topic": "/a/b"}).decode == "none"
    assert parse_options({"topic": "/a/b", "decode": "Schema"}).decode == "schema"
    with pytest.raises(InvalidOptionError, match="'none' or 'schema', not 'avro'"):
        parse_options({"topic": "/a/b", "decode": "avro"})
