"""Payload validators: one compiled check per schema version, cached.

``compile_validator(schema_type, definition)`` returns ``check(payload) -> None | str``:
None when the payload is valid, else the first error, saying where:

- ``json_schema``: the payload is JSON (UTF-8) and valid under the schema; the error is
  the JSON path in the payload and the failed keyword's message;
- ``avro``: the payload is one datum in Avro's binary encoding (no container, no header),
  read by fastavro's schemaless reader, which must consume every byte;
- ``protobuf``: the payload parses as the root message (see :mod:`danube.schemas.protobuf`)
  and its proto2 required fields are set;
- ``string``: the payload is UTF-8;
- ``number``: the payload is a decimal number as ASCII text, JSON's number grammar
  (``-12``, ``3.5``, ``6.02e23``; no spaces, no ``+``, no ``NaN``);
- ``bytes``: anything.

Validators are cached by (type, definition), :data:`VALIDATORS_CACHED` of them.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from functools import lru_cache

import orjson
from fastavro import schemaless_reader
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import best_match

from danube.schemas import protobuf
from danube.schemas.types import ParsedSchema, parse_schema

Validator = Callable[[bytes], str | None]
VALIDATORS_CACHED = 256
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def compile_validator(schema_type: str, definition: bytes) -> Validator:
    """The payload check of one schema version (parsed once, then cached); raises
    :class:`~danube.schemas.errors.InvalidSchemaError` if the definition does not parse."""
    return _compiled(schema_type, definition)


@lru_cache(maxsize=VALIDATORS_CACHED)
def _compiled(schema_type: str, definition: bytes) -> Validator:
    return validator_of(parse_schema(schema_type, definition))


def validator_of(parsed: ParsedSchema) -> Validator:
    """The payload check of a parsed schema (uncached)."""
    kind = parsed.schema_type
    if kind == "json_schema":
        return _json_checker(parsed)
    if kind == "avro":
        return _avro_checker(parsed)
    if kind == "protobuf":
        return protobuf.payload_checker(parsed.model)
    if kind == "string":
        return _check_utf8
    if kind == "number":
        return _check_number
    return _accept


def _json_checker(parsed: ParsedSchema) -> Validator:
    cls = validators.validator_for(parsed.model, default=Draft202012Validator)
    validator = cls(parsed.model)

    def check(payload: bytes) -> str | None:
        try:
            document = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            return f"not JSON: {exc}"
        error = best_match(validator.iter_errors(document))
        return None if error is None else f"{error.json_path}: {error.message}"

    return check


def _avro_checker(parsed: ParsedSchema) -> Validator:
    schema = parsed.model

    def check(payload: bytes) -> str | None:
        buffer = io.BytesIO(payload)
        try:
            schemaless_reader(buffer, schema, None)
        except Exception as exc:  # fastavro: EOFError, ValueError, IndexError...
            return f"not a datum of the schema (read {buffer.tell()} bytes): {exc!r}"
        end = buffer.tell()
        if end != len(payload):
            return f"{len(payload) - end} bytes left after the datum, from byte {end}"
        return None

    return check


def _check_utf8(payload: bytes) -> str | None:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 at byte {exc.start}"
    return None


def _check_number(payload: bytes) -> str | None:
    if _NUMBER.fullmatch(payload) is None:
        return f"not a decimal number: {payload[:40]!r}"
    return None


def _accept(payload: bytes) -> str | None:
    return None
