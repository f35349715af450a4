"""The compatibility table of danube.schemas: per type and mode, changes that must pass and
changes that must fail, each failure naming its rule (and where)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from danube.schemas import check_compatibility, parse_schema

pytestmark = pytest.mark.unit


def avro_record(*fields: dict[str, Any], name: str = "User") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "acme", "fields": list(fields)})


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> str:
    doc: dict[str, Any] = {"type": "object", "properties": props, **extra}
    if required:
        doc["required"] = required
    return json.dumps(doc)


PROTO_V1 = 'syntax = "proto3";\npackage acme;\nmessage User { int64 id = 1; string name = 2; }\n'


def proto(body: str, syntax: str = "proto3") -> str:
    return f'syntax = "{syntax}";\npackage acme;\n{body}\n'


BASE = avro_record(f("id", "int"), f("name", "string"))
ENUM_V1 = json.dumps({"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]})


@dataclass(frozen=True)
class Case:
    id: str
    schema_type: str
    mode: str
    history: tuple[str, ...]  # oldest first
    new: str
    rule: str | None  # None: compatible; else a rule each failure must include


CASES = [
    # --- avro: backward (new reader, old data) ---
    Case(
        "avro-add-field-with-default",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "int"), f("name", "string"), f("age", "int", default=0)),
        None,
    ),
    Case(
        "avro-add-field-without-default",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "int"), f("name", "string"), f("age", "int")),
        "reader_field_missing_default at $.age",
    ),
    Case("avro-remove-field", "avro", "backward", (BASE,), avro_record(f("id", "int")), None),
    Case(
        "avro-promote-int-long",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "long"), f("name", "string")),
        None,
    ),
    Case(
        "avro-promote-int-double",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "double"), f("name", "string")),
        None,
    ),
    Case(
        "avro-narrow-long-int",
        "avro",
        "backward",
        (avro_record(f("id", "long"), f("name", "string")),),
        BASE,
        "type_mismatch at $.id",
    ),
    Case(
        "avro-string-to-bytes",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "int"), f("name", "bytes")),
        None,
    ),
    Case(
        "avro-string-to-int",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "int"), f("name", "int")),
        "type_mismatch at $.name",
    ),
    Case(
        "avro-widen-to-union",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "int"), f("name", ["null", "string"])),
        None,
    ),
    Case(
        "avro-union-narrowed",
        "avro",
        "backward",
        (avro_record(f("id", "int"), f("name", ["null", "string"])),),
        BASE,
        "type_mismatch at $.name[0]",
    ),
    Case(
        "avro-enum-symbol-added",
        "avro",
        "backward",
        (ENUM_V1,),
        json.dumps({"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}),
        None,
    ),
    Case(
        "avro-enum-symbol-removed",
        "avro",
        "backward",
        (ENUM_V1,),
        json.dumps({"type": "enum", "name": "Color", "symbols": ["RED"]}),
        "enum_symbol_missing",
    ),
    Case(
        "avro-enum-symbol-removed-with-default",
        "avro",
        "backward",
        (ENUM_V1,),
        json.dumps({"type": "enum", "name": "Color", "symbols": ["RED"], "default": "RED"}),
        None,
    ),
    Case(
        "avro-record-renamed",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "int"), f("name", "string"), name="Person"),
        "name_mismatch at $",
    ),
    Case(
        "avro-record-renamed-with-alias",
        "avro",
        "backward",
        (BASE,),
        json.dumps(
            {
                **json.loads(avro_record(f("id", "int"), f("name", "string"), name="Person")),
                "aliases": ["User"],
            }
        ),
        None,
    ),
    Case(
        "avro-field-renamed-with-alias",
        "avro",
        "backward",
        (BASE,),
        avro_record(f("id", "int"), f("full_name", "string", aliases=["name"])),
        None,
    ),
    Case(
        "avro-fixed-size-changed",
        "avro",
        "backward",
        (json.dumps({"type": "fixed", "name": "H", "size": 16}),),
        json.dumps({"type": "fixed", "name": "H", "size": 32}),
        "fixed_size_mismatch",
    ),
    Case(
        "avro-array-items-promoted",
        "avro",
        "backward",
        (json.dumps({"type": "array", "items": "int"}),),
        json.dumps({"type": "array", "items": "long"}),
        None,
    ),
    Case(
        "avro-map-values-narrowed",
        "avro",
        "backward",
        (json.dumps({"type": "map", "values": "double"}),),
        json.dumps({"type": "map", "values": "float"}),
        "type_mismatch at $.values",
    ),
    # --- avro: forward (old reader, new data) ---
    Case(
        "avro-fwd-add-field-without-default",
        "avro",
        "forward",
        (BASE,),
        avro_record(f("id", "int"), f("name", "string"), f("age", "int")),
        None,
    ),
    Case(
        "avro-fwd-remove-field-without-default",
        "avro",
        "forward",
        (BASE,),
        avro_record(f("id", "int")),
        "reader_field_missing_default at $.name",
    ),
    Case(
        "avro-fwd-promote-int-long",
        "avro",
        "forward",
        (BASE,),
        avro_record(f("id", "long"), f("name", "string")),
        "type_mismatch at $.id",
    ),
    # --- avro: full ---
    Case(
        "avro-full-add-field-with-default",
        "avro",
        "full",
        (BASE,),
        avro_record(f("id", "int"), f("name", "string"), f("age", "int", default=0)),
        None,
    ),
    Case(
        "avro-full-add-field-without-default",
        "avro",
        "full",
        (BASE,),
        avro_record(f("id", "int"), f("name", "string"), f("age", "int")),
        "(backward): reader_field_missing_default",
    ),
    # --- avro: transitive vs latest only ---
    Case(
        "avro-backward-checks-latest-only",
        "avro",
        "backward",
        (BASE, avro_record(f("id", "int"), f("name", "string"), f("age", "int", default=0))),
        avro_record(f("id", "int"), f("name", "string"), f("age", "int")),
        None,
    ),
    Case(
        "avro-backward-transitive-checks-all",
        "avro",
        "backward_transitive",
        (BASE, avro_record(f("id", "int"), f("name", "string"), f("age", "int", default=0))),
        avro_record(f("id", "int"), f("name", "string"), f("age", "int")),
        "version 1 (backward): reader_field_missing_default at $.age",
    ),
    Case(
        "avro-none-allows-anything", "avro", "none", (BASE,), avro_record(f("id", "string")), None
    ),
    Case(
        "avro-type-changed", "avro", "backward", (BASE,), '{"type": "string"}', "type_mismatch at $"
    ),
    # --- json schema ---
    Case(
        "json-add-optional-property",
        "json_schema",
        "backward",
        (obj({"id": {"type": "integer"}}, ["id"]),),
        obj({"id": {"type": "integer"}, "note": {"type": "string"}}, ["id"]),
        None,
    ),
    Case(
        "json-add-required-property",
        "json_schema",
        "backward",
        (obj({"id": {"type": "integer"}}, ["id"]),),
        obj({"id": {"type": "integer"}, "note": {"type": "string"}}, ["id", "note"]),
        "required_added at $",
    ),
    Case(
        "json-remove-property-open-model",
        "json_schema",
        "backward",
        (obj({"id": {"type": "integer"}, "note": {"type": "string"}}),),
        obj({"id": {"type": "integer"}}),
        None,
    ),
    Case(
        "json-remove-property-closed-model",
        "json_schema",
        "backward",
        (obj({"id": {"type": "integer"}, "note": {"type": "string"}}, additionalProperties=False),),
        obj({"id": {"type": "integer"}}, additionalProperties=False),
        "property_removed_closed_model at $.properties.note",
    ),
    Case(
        "json-type-narrowed",
        "json_schema",
        "backward",
        (obj({"id": {"type": "number"}}),),
        obj({"id": {"type": "integer"}}),
        "type_narrowed at $.properties.id",
    ),
    Case(
        "json-type-widened",
        "json_schema",
        "backward",
        (obj({"id": {"type": "integer"}}),),
        obj({"id": {"type": "number"}}),
        None,
    ),
    Case(
        "json-type-widened-forward-fails",
        "json_schema",
        "forward",
        (obj({"id": {"type": "integer"}}),),
        obj({"id": {"type": "number"}}),
        "(forward): type_narrowed at $.properties.id",
    ),
    Case(
        "json-enum-narrowed",
        "json_schema",
        "backward",
        (obj({"c": {"enum": ["a", "b"]}}),),
        obj({"c": {"enum": ["a"]}}),
        "enum_narrowed",
    ),
    Case(
        "json-enum-widened",
        "json_schema",
        "backward",
        (obj({"c": {"enum": ["a"]}}),),
        obj({"c": {"enum": ["a", "b"]}}),
        None,
    ),
    Case(
        "json-closed-model",
        "json_schema",
        "backward",
        (obj({"id": {"type": "integer"}}),),
        obj({"id": {"type": "integer"}}, additionalProperties=False),
        "additional_properties_closed",
    ),
    Case(
        "json-max-length-narrowed",
        "json_schema",
        "backward",
        (obj({"s": {"type": "string", "maxLength": 10}}),),
        obj({"s": {"type": "string", "maxLength": 5}}),
        "range_narrowed at $.properties.s",
    ),
    Case(
        "json-pattern-changed-refused",
        "json_schema",
        "backward",
        (obj({"s": {"type": "string"}}),),
        obj({"s": {"type": "string", "pattern": "^a"}}),
        "unsupported_change at $.properties.s.pattern",
    ),
    Case(
        "json-description-only",
        "json_schema",
        "full",
        (obj({"s": {"type": "string"}}),),
        obj({"s": {"type": "string", "description": "x"}}),
        None,
    ),
    Case(
        "json-full-required-added",
        "json_schema",
        "full_transitive",
        (obj({"a": {"type": "string"}}), obj({"a": {"type": "string"}, "b": {"type": "string"}})),
        obj({"a": {"type": "string"}}, ["a"]),
        "version 1 (backward): required_added",
    ),
    # --- protobuf ---
    Case(
        "proto-add-field",
        "protobuf",
        "backward",
        (PROTO_V1,),
        proto("message User { int64 id = 1; string name = 2; bool active = 3; }"),
        None,
    ),
    Case(
        "proto-remove-field",
        "protobuf",
        "full",
        (PROTO_V1,),
        proto("message User { int64 id = 1; reserved 2; }"),
        None,
    ),
    Case(
        "proto-rename-field",
        "protobuf",
        "full",
        (PROTO_V1,),
        proto("message User { int64 user_id = 1; string name = 2; }"),
        None,
    ),
    Case(
        "proto-varint-compatible-types",
        "protobuf",
        "backward",
        (PROTO_V1,),
        proto("message User { uint64 id = 1; bytes name = 2; }"),
        None,
    ),
    Case(
        "proto-wire-type-changed",
        "protobuf",
        "backward",
        (PROTO_V1,),
        proto("message User { double id = 1; string name = 2; }"),
        "field_wire_type_changed at acme.User.id (field 1)",
    ),
    Case(
        "proto-zigzag-changed",
        "protobuf",
        "forward",
        (PROTO_V1,),
        proto("message User { sint64 id = 1; string name = 2; }"),
        "field_wire_type_changed",
    ),
    Case(
        "proto-number-reused-for-other-type",
        "protobuf",
        "backward",
        (PROTO_V1,),
        proto("message User { int64 id = 1; int32 name = 2; }"),
        "field_wire_type_changed at acme.User.name (field 2)",
    ),
    Case(
        "proto-message-removed",
        "protobuf",
        "backward",
        (proto("message User { int64 id = 1; }\nmessage Address { string city = 1; }"),),
        proto("message User { int64 id = 1; }"),
        "message_removed at acme.Address",
    ),
    Case(
        "proto-required-removed",
        "protobuf",
        "backward",
        (proto("message User { required int64 id = 1; optional string n = 2; }", "proto2"),),
        proto("message User { optional string n = 2; }", "proto2"),
        "required_field_changed at acme.User.id (field 1)",
    ),
    Case(
        "proto-reserved-reused",
        "protobuf",
        "backward",
        (proto("message User { int64 id = 1; reserved 5; }"),),
        proto("message User { int64 id = 1; string x = 5; }"),
        "reserved_number_reused",
    ),
    # --- bytes / string / number ---
    Case("string-stays-string", "string", "full", ("",), "", None),
    Case(
        "number-to-string", "string", "backward", ("",), "", "type_changed at $: number -> string"
    ),
]
# The type of the history in two cases differs from the new one's; set them apart here.
HISTORY_TYPES = {"number-to-string": "number"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_compatibility(case: Case) -> None:
    history_type = HISTORY_TYPES.get(case.id, case.schema_type)
    history = [
        (i + 1, parse_schema(history_type, text.encode())) for i, text in enumerate(case.history)
    ]
    new = parse_schema(case.schema_type, case.new.encode())
    ok, errors = check_compatibility(new, history, case.mode)
    if case.rule is None:
        assert (ok, errors) == (True, [])
    else:
        assert not ok
        assert any(case.rule in error for error in errors), errors


def test_table_is_big_enough() -> None:
    passing = [c for c in CASES if c.rule is None]
    failing = [c for c in CASES if c.rule is not None]
    assert len(CASES) >= 30
    assert len(passing) >= 10
    assert len(failing) >= 10
    assert {c.schema_type for c in failing} >= {"avro", "json_schema", "protobuf"}
