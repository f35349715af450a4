"""danube.schemas parsing and payload validators: a round trip per type (encode a payload
with the type's library, validate it, spoil it, validate again), invalid definitions that
say where they are wrong, and fingerprints that ignore only what does not matter."""

from __future__ import annotations

import io
import json

import fastavro
import orjson
import pytest

from danube.schemas import InvalidSchemaError, compile_validator, parse_schema
from danube.schemas.protobuf import message_class

pytestmark = pytest.mark.unit

AVRO = json.dumps(
    {
        "type": "record",
        "name": "User",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "name", "type": "string"},
            {"name": "email", "type": ["null", "string"], "default": None},
        ],
    }
)
JSON_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["id"],
    }
)
PROTO = """syntax = "proto3";
package acme;
// @danube.message: Order
message User { int64 id = 1; string name = 2; }
message Order { int64 id = 1; User buyer = 2; repeated string items = 3; }
"""


def test_avro_round_trip() -> None:
    parsed = parse_schema("avro", AVRO.encode())
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed.model, {"id": 7, "name": "ann", "email": None})
    check = compile_validator("avro", AVRO.encode())
    assert check(buffer.getvalue()) is None
    read = fastavro.schemaless_reader(io.BytesIO(buffer.getvalue()), parsed.model, None)
    assert read == {"id": 7, "name": "ann", "email": None}
    error = check(buffer.getvalue() + b"\x00")
    assert error is not None
    assert "1 bytes left" in error
    assert check(buffer.getvalue()[:-2]) is not None  # cut short


def test_json_schema_round_trip() -> None:
    check = compile_validator("json_schema", JSON_SCHEMA.encode())
    assert check(orjson.dumps({"id": 1, "tags": ["a"]})) is None
    assert check(b'{"tags": []}') == "$: 'id' is a required property"
    assert check(b'{"id": 1, "tags": ["a", 2]}') == "$.tags[1]: 2 is not of type 'string'"
    error = check(b"{not json")
    assert error is not None
    assert error.startswith("not JSON")


def test_protobuf_round_trip_with_named_root_message() -> None:
    parsed = parse_schema("protobuf", PROTO.encode())
    assert parsed.model.root == "acme.Order"
    cls = message_class(parsed.model)
    payload = cls(id=3, items=["x", "y"]).SerializeToString()
    check = compile_validator("protobuf", PROTO.encode())
    assert check(payload) is None
    assert cls.FromString(payload).items == ["x", "y"]
    error = check(b"\x0a\xff")  # field 1 as length-delimited, then a truncated length
    assert error is not None
    assert error.startswith("acme.Order: not a valid encoding")


def test_protobuf_root_is_the_first_message_by_default() -> None:
    parsed = parse_schema("protobuf", PROTO.replace("// @danube.message: Order\n", "").encode())
    assert parsed.model.root == "acme.User"


def test_protobuf_proto2_required_fields_are_checked() -> None:
    text = 'syntax = "proto2";\nmessage M { required int32 a = 1; optional int32 b = 2; }\n'
    check = compile_validator("protobuf", text.encode())
    assert check(b"\x08\x01") is None
    assert check(b"\x10\x01") == "M: missing required fields: a"


@pytest.mark.parametrize(
    ("schema_type", "good", "bad", "error"),
    [
        ("string", "héllo".encode(), b"\xff\xfe", "not UTF-8 at byte 0"),
        ("number", b"-12.5e3", b"12 ", "not a decimal number: b'12 '"),
        ("number", b"0", b"01", "not a decimal number: b'01'"),
        ("bytes", b"\x00\xff", None, None),
    ],
)
def test_primitive_validators(
    schema_type: str, good: bytes, bad: bytes | None, error: str | None
) -> None:
    check = compile_validator(schema_type, b"")
    assert check(good) is None
    if bad is not None:
        assert check(bad) == error


@pytest.mark.parametrize(
    ("schema_type", "definition", "location", "reason"),
    [
        (
            "avro",
            '{"type": "record", "name": "U", "fields": [{"name": "a", "type": "int"}, '
            '{"name": "b", "type": "strng"}]}',
            "$.fields[1].type",
            "unknown type 'strng'",
        ),
        (
            "avro",
            '{"type": "record", "name": "U", "fields": [{"name": "a", "type": "int", '
            '"default": "x"}]}',
            "$.fields[0]",
            "Default value <x> must match schema type: int",
        ),
        (
            "avro",
            '{"type": "record", "name": "U", "fields": [{"name": "in", "type": {"type": '
            '"record", "name": "V", "fields": [{"name": "q"}]}}]}',
            "$.fields[0].type.fields[0]",
            "missing 'type'",
        ),
        ("avro", '{"type": "record", "name": "U"', "line 1 column 31", "unexpected end"),
        (
            "json_schema",
            '{"type": "object", "properties": {"age": {"type": "integr"}}}',
            "$.properties.age.type",
            "'integr' is not valid",
        ),
        ("json_schema", '{"minimum": "3"}', "$.minimum", "'3' is not of type 'number'"),
        ("json_schema", "[1, 2]", "$", "a schema is an object or a boolean"),
        (
            "protobuf",
            'syntax = "proto3";\nmessage A {\n  int32 id = 1\n}\n',
            "schema.proto:4:1",
            'Expected ";"',
        ),
        (
            "protobuf",
            'syntax = "proto3";\nmessage A { Unknown x = 1; }\n',
            "schema.proto:2:13",
            '"Unknown" is not defined',
        ),
        ("protobuf", 'syntax = "proto3";\n', "schema.proto", "the file defines no message"),
        ("avro", "\xff", "byte 0", "not UTF-8"),
    ],
)
def test_invalid_definitions_say_where(
    schema_type: str, definition: str, location: str, reason: str
) -> None:
    raw = b"\xff" if definition == "\xff" else definition.encode()
    with pytest.raises(InvalidSchemaError) as caught:
        parse_schema(schema_type, raw)
    assert caught.value.code == "invalid_schema"
    assert caught.value.location == location
    assert reason in caught.value.reason


def test_unknown_type_and_size_limit() -> None:
    with pytest.raises(InvalidSchemaError, match="not one of"):
        parse_schema("xml", b"")
    with pytest.raises(InvalidSchemaError, match="over the 262144 byte limit"):
        parse_schema("string", b" " * (256 * 1024 + 1))


def test_fingerprints() -> None:
    spaced = parse_schema("json_schema", b'{ "type" : "string",  "maxLength": 3 }')
    sorted_ = parse_schema("json_schema", b'{"maxLength":3,"type":"string"}')
    assert spaced.fingerprint == sorted_.fingerprint
    assert len(spaced.fingerprint) == 64
    # Avro: "int" and {"type": "int"} are one schema; a changed default is another one.
    a = parse_schema("avro", b'{"type":"record","name":"R","fields":[{"name":"x","type":"int"}]}')
    b = parse_schema(
        "avro", b'{"name":"R","type":"record","fields":[{"type":{"type":"int"},"name":"x"}]}'
    )
    c = parse_schema(
        "avro",
        b'{"type":"record","name":"R","fields":[{"name":"x","type":"int","default":1}]}',
    )
    assert a.fingerprint == b.fingerprint != c.fingerprint
    # protobuf: comments and spacing do not count; the root message does.
    p1 = parse_schema("protobuf", PROTO.encode())
    p2 = parse_schema(
        "protobuf", PROTO.replace("message User", "// a comment\nmessage  User").encode()
    )
    p3 = parse_schema("protobuf", PROTO.replace("// @danube.message: Order\n", "").encode())
    assert p1.fingerprint == p2.fingerprint != p3.fingerprint
    assert parse_schema("string", b"").fingerprint != parse_schema("bytes", b"").fingerprint
