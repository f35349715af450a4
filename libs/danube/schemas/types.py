"""The schema types and parsing: each definition is parsed by its type's library, checked,
and given a canonical form and a fingerprint (sha256 of the canonical form, hex):

========== ============================================= =================================
type       definition                                    canonical form
========== ============================================= =================================
bytes      anything (usually empty): no structure        ``bytes\\n`` + the text, stripped
string     anything (usually empty): payloads are UTF-8  ``string\\n`` + the text, stripped
number     anything (usually empty): payloads are        ``number\\n`` + the text, stripped
           decimal numbers as text
json_schema a JSON Schema (its ``$schema`` dialect,       JSON, sorted keys, no whitespace
           2020-12 when absent)
avro       an Avro schema (JSON)                         parsing canonical form + defaults
                                                         and aliases
protobuf   one ``.proto`` file                           root message name + the
                                                         FileDescriptorSet bytes
========== ============================================= =================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, get_args

from danube.schemas import avro, json_schema, protobuf
from danube.schemas.errors import InvalidSchemaError

SchemaType = Literal["bytes", "string", "number", "json_schema", "avro", "protobuf"]
SCHEMA_TYPES: tuple[SchemaType, ...] = get_args(SchemaType)
# A definition's size limit: etcd keeps every version, and each one is parsed at
# registration and again for each validator built from it.
DEFINITION_BYTES_MAX = 256 * 1024


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    """A definition that parsed: ``model`` is the type's own form of it (the fastavro
    schema, the JSON Schema document, a :class:`~danube.schemas.protobuf.Compiled`; None
    for bytes, string and number)."""

    schema_type: SchemaType
    definition: bytes
    canonical: bytes
    fingerprint: str
    model: Any


def schema_type_of(value: str) -> SchemaType:
    """``value`` as a :data:`SchemaType`; :class:`InvalidSchemaError` if it is none."""
    for known in SCHEMA_TYPES:
        if value == known:
            return known
    raise InvalidSchemaError(
        schema_type=value, location="schema_type", reason=f"not one of {list(SCHEMA_TYPES)}"
    )


def parse_schema(schema_type: str, definition: bytes) -> ParsedSchema:
    """Parse and check ``definition``; :class:`InvalidSchemaError` pointing into it when it
    is not a valid schema of ``schema_type``. Compiling a ``.proto`` runs protoc in a child
    process (tens of milliseconds): call it off the event loop."""
    kind = schema_type_of(schema_type)
    if len(definition) > DEFINITION_BYTES_MAX:
        raise InvalidSchemaError(
            schema_type=kind,
            location="$",
            reason=f"{len(definition)} bytes, over the {DEFINITION_BYTES_MAX} byte limit",
        )
    try:
        text = definition.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSchemaError(
            schema_type=kind, location=f"byte {exc.start}", reason="not UTF-8"
        ) from exc
    model: Any = None
    if kind == "avro":
        model, canonical = avro.parse(text)
    elif kind == "json_schema":
        model, canonical = json_schema.parse(text)
    elif kind == "protobuf":
        model = protobuf.compile_proto(text)
        canonical = protobuf.canonical(model)
    else:
        canonical = f"{kind}\n{text.strip()}".encode()
    return ParsedSchema(kind, definition, canonical, hashlib.sha256(canonical).hexdigest(), model)
