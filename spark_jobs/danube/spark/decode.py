"""Payloads → the ``value`` column (``decode=schema``), in the executors. Pure, no I/O.

The driver looks the topic's schema up once (:func:`danube.spark.catalog.read_topic_schema`)
and ships it as a :class:`TopicSchema` (every version's definition) inside the plan. Each
payload is decoded to the type of the **latest** version at planning time:

- Avro: read with the version the record was written with (its ``schema_version``) as the
  writer schema and the latest as the reader schema: Avro schema resolution (fastavro), so
  fields added since take their defaults and removed ones are skipped. A payload must be
  consumed to its last byte.
- JSON Schema: ``orjson`` parses it and the document is fitted to the latest version's type
  (JSON carries its field names, so the writer's version is not needed); properties the type
  does not have are dropped.

A payload that does not decode or fit gives a null ``value`` and a ``decode_error``
(``$.age: expected int64, got str``); a record with no schema stamp (written before the
topic was bound) or another schema id decodes as an error too for Avro (no writer schema);
for JSON only another schema id is an error.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fastavro
import orjson
import pyarrow as pa

from danube.spark.schema_types import arrow_type_of, column_type, parse_avro

DECODED_TYPES = ("avro", "json_schema")
_INT_RANGE = {pa.int32(): 2**31, pa.int64(): 2**63}


@dataclass(frozen=True, slots=True)
class TopicSchema:
    """What a read decodes with: the subject a topic is bound to and every version of it
    (deleted ones too: records written with them still name them). Picklable."""

    topic: str
    subject: str
    schema_id: int
    schema_type: str  # "avro" or "json_schema"
    latest: int  # the latest live version: the type of the value column
    definitions: Mapping[int, str]  # version → definition

    def strict_type(self) -> pa.DataType:
        """The latest version's type, with its required fields not null."""
        return arrow_type_of(self.schema_type, self.definitions[self.latest])

    def value_type(self) -> pa.DataType:
        """The Arrow type of the ``value`` column (struct fields nullable)."""
        return column_type(self.strict_type())


class _Mismatch(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}" if path else reason)


class PayloadDecoder:
    """Decodes payloads of one topic to :meth:`TopicSchema.value_type` values."""

    def __init__(self, schema: TopicSchema) -> None:
        if schema.schema_type not in DECODED_TYPES:
            raise ValueError(f"{schema.schema_type} payloads are not decoded")
        self.schema = schema
        self._strict = schema.strict_type()  # what a payload must fit
        self.value_type = column_type(self._strict)
        self._avro: dict[int, Any] = {}  # version → parsed schema, parsed when first needed

    def _parsed(self, version: int) -> Any:
        parsed = self._avro.get(version)
        if parsed is None:
            parsed = self._avro[version] = parse_avro(self.schema.definitions[version])
        return parsed

    def decode(
        self, payload: bytes, schema_id: int | None, schema_version: int | None
    ) -> tuple[Any, str | None]:
        """``(value, None)``, or ``(None, error)`` for a payload that does not decode."""
        if schema_id is not None and schema_id != self.schema.schema_id:
            return None, (
                f"written with schema id {schema_id}, not {self.schema.schema_id} "
                f"(subject {self.schema.subject})"
            )
        try:
            if self.schema.schema_type == "avro":
                datum = self._read_avro(payload, schema_version)
            else:
                try:
                    datum = orjson.loads(payload)
                except orjson.JSONDecodeError as exc:
                    return None, f"not JSON: {exc}"
            return conform(datum, self._strict, "$"), None
        except _Mismatch as exc:
            return None, str(exc)

    def _read_avro(self, payload: bytes, version: int | None) -> Any:
        if version is None:
            raise _Mismatch("", "no schema version on the record (written before binding?)")
        if version not in self.schema.definitions:
            raise _Mismatch("", f"version {version} of {self.schema.subject} is not registered")
        reader = None if version == self.schema.latest else self._parsed(self.schema.latest)
        buffer = io.BytesIO(payload)
        try:
            datum = fastavro.schemaless_reader(buffer, self._parsed(version), reader)
        except Exception as exc:  # fastavro raises EOFError, ValueError, its own errors...
            raise _Mismatch("", f"not Avro of version {version}: {exc!r}") from None
        if buffer.tell() != len(payload):
            left = len(payload) - buffer.tell()
            raise _Mismatch("", f"{left} bytes left over after an Avro datum of version {version}")
        return datum

    def columns(
        self,
        payloads: Sequence[bytes],
        schema_ids: Sequence[int | None],
        schema_versions: Sequence[int | None],
    ) -> tuple[pa.Array, pa.Array]:
        """The ``value`` and ``decode_error`` columns of a batch's rows."""
        values: list[Any] = []
        errors: list[str | None] = []
        for payload, schema_id, version in zip(payloads, schema_ids, schema_versions, strict=True):
            value, error = self.decode(payload, schema_id, version)
            values.append(value)
            errors.append(error)
        return pa.array(values, type=self.value_type), pa.array(errors, type=pa.string())


def conform(value: Any, arrow: pa.DataType, path: str) -> Any:
    """``value`` as Arrow takes it for ``arrow``, or :class:`_Mismatch` naming the path."""
    if pa.types.is_struct(arrow):
        return _struct(value, arrow, path)
    if pa.types.is_map(arrow):
        if not isinstance(value, dict):
            raise _Mismatch(path, f"expected an object, got {_name(value)}")
        item = arrow.item_field
        return [
            (key, _nullable(sub, item.type, item.nullable, f"{path}.{key}"))
            for key, sub in value.items()
        ]
    if pa.types.is_list(arrow):
        if not isinstance(value, list):
            raise _Mismatch(path, f"expected an array, got {_name(value)}")
        item = arrow.value_field
        return [
            _nullable(sub, item.type, item.nullable, f"{path}[{i}]") for i, sub in enumerate(value)
        ]
    return _scalar(value, arrow, path)


def _struct(value: Any, arrow: pa.StructType, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Mismatch(path, f"expected an object, got {_name(value)}")
    out = {}
    for index in range(arrow.num_fields):
        field = arrow.field(index)
        out[field.name] = _nullable(
            value.get(field.name), field.type, field.nullable, f"{path}.{field.name}"
        )
    return out


def _nullable(value: Any, arrow: pa.DataType, nullable: bool, path: str) -> Any:
    if value is None:
        if nullable:
            return None
        raise _Mismatch(path, "missing or null, but required")
    return conform(value, arrow, path)


def _scalar(value: Any, arrow: pa.DataType, path: str) -> Any:
    if pa.types.is_boolean(arrow):
        if isinstance(value, bool):
            return value
    elif pa.types.is_integer(arrow):
        if isinstance(value, dt.time):  # Avro time-millis / time-micros
            micros = (value.hour * 3600 + value.minute * 60 + value.second) * 10**6
            micros += value.microsecond
            return micros // 1000 if arrow == pa.int32() else micros
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            bound = _INT_RANGE[arrow]
            if -bound <= value < bound:
                return value
            raise _Mismatch(path, f"{value} does not fit {arrow}")
    elif pa.types.is_floating(arrow):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif pa.types.is_string(arrow):
        if isinstance(value, str):
            return value
        if isinstance(value, uuid.UUID):
            return str(value)
    elif pa.types.is_binary(arrow):
        if isinstance(value, bytes):
            return value
    elif pa.types.is_timestamp(arrow):
        if isinstance(value, dt.datetime) and (value.tzinfo is None) == (arrow.tz is None):
            return value
    elif pa.types.is_date(arrow):
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return value
    elif pa.types.is_decimal(arrow) and isinstance(value, decimal.Decimal):
        try:
            pa.scalar(value, arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise _Mismatch(path, f"{value} does not fit {arrow}: {exc}") from None
        return value
    raise _Mismatch(path, f"expected {arrow}, got {_name(value)}")


def _name(value: Any) -> str:
    return "null" if value is None else type(value).__name__
