"""Decoding records (the layout is :mod:`danube.frame.record`'s, docs/formats.md): a
:class:`~danube.frame.record.Record` of a buffer, its fields as a plain tuple, or the fields
of one record read straight out of a larger body. Every decoder makes the checks of
:func:`~danube.frame.record.read_record_header` and
:func:`~danube.frame.record.read_attributes`, so a garbled record raises
:class:`~danube.frame.errors.CorruptRecordError` and never reads past its buffer; a
compressed payload comes out decompressed unless ``decompress=False``.
"""

from __future__ import annotations

from typing import NamedTuple, TypeVar

from danube.frame.compression import CODEC_NAMES, Compression
from danube.frame.compression import decompress as decompress_payload  # `decompress`: a flag
from danube.frame.errors import CorruptRecordError
from danube.frame.record import (
    FLAG_CODEC,
    FLAG_CODEC_SHIFT,
    FLAG_KEY,
    FLAG_SCHEMA_ID,
    FLAG_SCHEMA_VERSION,
    MAX_DECOMPRESSED_PAYLOAD_BYTES,
    RECORD_FLAGS_AT,
    RECORD_HEADER_BYTES,
    RECORD_VERSION,
    SEQUENCED_HEADER_BYTES,
    Record,
    read_attributes,
    read_record_header,
    read_text,
    record_sequence,
)

_Bytes = TypeVar("_Bytes", bytes, memoryview)  # a buffer and its slices, of one type


class RecordFields(NamedTuple):
    """A decoded record as a plain tuple: what :func:`decode_record_fields` returns, for
    readers that turn many records into columns and need no :class:`Record` objects."""

    publish_time_ms: int
    producer: str
    key: str | None
    attributes: dict[str, str]
    payload: bytes
    schema_id: int | None
    schema_version: int | None
    sequence: int | None = None
    producer_epoch: int = 0
    compression: Compression | None = None  # how the payload was stored


def decode_record(buf: bytes | bytearray | memoryview) -> Record:
    """Decode one record that spans exactly ``buf`` (e.g. a :class:`~danube.frame.Frame` payload).

    The returned payload is a detached ``bytes`` copy. Raises
    :class:`UnsupportedRecordVersionError` for an unknown version and
    :class:`CorruptRecordError` for anything else wrong, naming what.
    """
    fields = decode_record_fields(buf)
    return Record(
        payload=fields.payload,
        publish_time_ms=fields.publish_time_ms,
        producer=fields.producer,
        key=fields.key,
        attributes=fields.attributes,
        schema_id=fields.schema_id,
        schema_version=fields.schema_version,
        sequence=fields.sequence,
        producer_epoch=fields.producer_epoch,
        compression=fields.compression,
    )


def decode_record_fields(
    buf: bytes | bytearray | memoryview, *, decompress: bool = True
) -> RecordFields:
    """:func:`decode_record`, with the same checks, as a tuple (no frozen dataclass to build:
    about twice as fast, which bulk readers such as the Spark source need).
    ``decompress=False``: a compressed payload as stored (for readers of the other fields,
    which need not pay for inflating it)."""
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    time_ms, producer, key, attributes, payload, schema_id, schema_version = decode_record_at(
        view, 0, len(view), decompress=decompress
    )
    sequenced = record_sequence(view)
    compression = CODEC_NAMES.get((view[RECORD_FLAGS_AT] & FLAG_CODEC) >> FLAG_CODEC_SHIFT)
    return RecordFields(
        time_ms,
        producer,
        key,
        attributes,
        bytes(payload),
        schema_id,
        schema_version,
        None if sequenced is None else sequenced.sequence,
        0 if sequenced is None else sequenced.producer_epoch,
        compression,
    )


def decode_record_at(
    data: _Bytes, start: int, end: int, *, decompress: bool = True
) -> tuple[int, str, str | None, dict[str, str], _Bytes, int | None, int | None]:
    """:func:`decode_record_fields` of the record in ``data[start:end]``, with the same
    checks, as a plain tuple in the order of :class:`RecordFields`, with no view or slice of
    ``data`` made first: for a reader of many records in one body (a delivery batch), where
    those cost as much as the decoding. The payload is ``data[pos:end]``: one copy out of
    ``bytes``, a view of a ``memoryview`` (of unsigned bytes). A compressed payload comes
    out decompressed (a new buffer of the same type), unless ``decompress=False``."""
    if not 0 <= start <= end <= len(data):
        raise CorruptRecordError(f"record at {start}..{end} of a {len(data)}-byte buffer")
    flags, time_ms, schema_id, schema_version, producer_len, key_len, count, payload_len = (
        read_record_header(data, start, end)
    )
    pos = start + (RECORD_HEADER_BYTES if data[start] == RECORD_VERSION else SEQUENCED_HEADER_BYTES)
    if end - pos < producer_len + key_len:
        raise CorruptRecordError("truncated in producer or key")
    producer = read_text(data, pos, producer_len, "producer")
    pos += producer_len
    key = read_text(data, pos, key_len, "key") if flags & FLAG_KEY else None
    pos += key_len
    attributes: dict[str, str] = {}
    if count:
        pos = read_attributes(data, pos, end, count, attributes)
    if end - pos != payload_len:
        problem = "truncated in payload" if end - pos < payload_len else "trailing bytes"
        raise CorruptRecordError(
            f"{problem}: {end - pos} bytes left for a {payload_len}-byte payload"
        )
    payload = data[pos:end]
    if decompress and flags & FLAG_CODEC:
        payload = _inflated(payload, flags)
    return (
        time_ms,
        producer,
        key,
        attributes,
        payload,
        schema_id if flags & FLAG_SCHEMA_ID else None,
        schema_version if flags & FLAG_SCHEMA_VERSION else None,
    )


def _inflated(payload: _Bytes, flags: int) -> _Bytes:
    """A stored payload of the codec ``flags`` name, decompressed, in a buffer of its type."""
    out = decompress_payload(
        (flags & FLAG_CODEC) >> FLAG_CODEC_SHIFT,
        payload,
        size_bytes_max=MAX_DECOMPRESSED_PAYLOAD_BYTES,
    )
    if isinstance(payload, memoryview):
        return memoryview(out)
    return out
