"""Records: the stream message carried as a frame's payload.

Wire layout of format version 1, all integers little-endian (docs/formats.md has the full story)::

    byte  size  field
    0     1     version          u8   1
    1     1     flags            u8   bit 0 key present, bit 1 schema_id present,
                                      bit 2 schema_version present, bits 3-4 the
                                      payload's codec (0 none, 1 zstd, 2 lz4);
                                      other bits 0
    2     8     publish_time_ms  u64  milliseconds since the Unix epoch
    10    4     schema_id        u32  0 when absent (reserved)
    14    4     schema_version   u32  0 when absent (reserved)
    18    2     producer_len     u16  bytes
    20    2     key_len          u16  bytes; 0 when absent (the flag tells absent from empty)
    22    2     attribute_count  u16
    24    4     payload_len      u32  bytes
    28    ...   producer         UTF-8
          ...   key              UTF-8
          ...   attributes       attribute_count x (u16 name_len, name, u16 value_len, value)
          ...   payload          as is, or in the codec's form (danube.frame.compression);
                                 it ends the record, exactly: trailing bytes are corrupt

Format version 2 is a **sequenced** record (an idempotent producer's: docs/client.md,
"Exactly once into the log"): version 1's header with two more fields before the text, which
then starts at byte 40::

    28    4     producer_epoch   u32  the producer's incarnation (a newer one fences older ones)
    32    8     sequence         u64  the record's number in its producer's stream to this
                                      partition: consecutive, from any start

A record without a sequence is written as version 1, one with a sequence as version 2: one
encoding per record. Readers read both.

A compressed payload (flag bits 3-4, either version) is handed out decompressed by every
decoder (``decompress=False`` leaves it as stored, for readers of the other fields), and
``payload_len`` is its stored (compressed) length.

Every length is checked against both its limit and the bytes left before anything is read, so a
garbled record raises :class:`CorruptRecordError` and never reads past its buffer.

Here: the layout, :class:`Record` and :func:`encode_record`, the checks every reader shares
(:func:`read_record_header`, :func:`read_attributes`) and readers of one header field
(:func:`record_publish_time_ms`, :func:`record_sequence`, :func:`sequence_runs`). The
decoders are :mod:`danube.frame.record_decode`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from danube.frame.compression import (
    CODEC_IDS,
    CODEC_NAMES,
    CODEC_NONE,
    Compression,
    compress,
)
from danube.frame.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedRecordVersionError,
)

RECORD_VERSION = 1
"""The format version of a record without a sequence (what every record was before version 2)."""
SEQUENCED_RECORD_VERSION = 2
"""The format version of a sequenced record (producer epoch and sequence in its header)."""
RECORD_VERSIONS = (RECORD_VERSION, SEQUENCED_RECORD_VERSION)

MAX_PRODUCER_NAME_BYTES = 256
MAX_KEY_BYTES = 4096
MAX_ATTRIBUTES = 64
MAX_ATTRIBUTE_NAME_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 4096
# A compressed payload inflates to at most this (what ingest.max_message_bytes allows at
# most): the readers' bound; the produce path holds each message to its topic's own limit.
MAX_DECOMPRESSED_PAYLOAD_BYTES = 64 * 1024 * 1024
# The payload's own bound is the u32 length; the frame limit bounds the whole record anyway.
_MAX_U32 = 2**32 - 1
_MAX_U64 = 2**64 - 1

# version, flags, publish_time_ms, schema_id, schema_version, producer_len, key_len,
# attribute_count, payload_len
# The one statement of the record header (danube.frame exports it); field positions below
# are computed from it, never typed in.
RECORD_HEADER = struct.Struct("<BBQIIHHHI")
_HEADER = RECORD_HEADER
RECORD_HEADER_BYTES = RECORD_HEADER.size
# Version 2 appends producer_epoch and sequence.
_SEQUENCE = struct.Struct("<IQ")  # producer_epoch, sequence: at RECORD_HEADER_BYTES
SEQUENCED_RECORD_HEADER = struct.Struct(RECORD_HEADER.format + _SEQUENCE.format[1:])
_SEQUENCED_HEADER = SEQUENCED_RECORD_HEADER
SEQUENCED_HEADER_BYTES = SEQUENCED_RECORD_HEADER.size


def _at(field_index: int) -> int:
    """The byte position of the record header's field ``field_index`` (0: version)."""
    return struct.calcsize(RECORD_HEADER.format[: 1 + field_index])


RECORD_FLAGS_AT = _at(1)
RECORD_PUBLISH_TIME_AT = _at(2)
RECORD_SCHEMA_AT = _at(3)  # schema_id, then schema_version
RECORD_PRODUCER_LEN_AT = _at(5)  # then key_len
_PRODUCER_LEN_AT = RECORD_PRODUCER_LEN_AT
_LENGTH = struct.Struct("<H")  # prefix of each attribute name and value

FLAG_KEY = 1
FLAG_SCHEMA_ID = 2
FLAG_SCHEMA_VERSION = 4
FLAG_CODEC_SHIFT = 3
"""The payload's codec id (danube.frame.compression) is ``(flags & FLAG_CODEC) >> 3``."""
FLAG_CODEC = 0b11 << FLAG_CODEC_SHIFT
_FLAG_KEY, _FLAG_SCHEMA_ID, _FLAG_SCHEMA_VERSION = FLAG_KEY, FLAG_SCHEMA_ID, FLAG_SCHEMA_VERSION
_KNOWN_FLAGS = _FLAG_KEY | _FLAG_SCHEMA_ID | _FLAG_SCHEMA_VERSION | FLAG_CODEC


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One stream message. ``key=None`` (no key) differs from ``key=""`` (an empty key)."""

    payload: bytes
    publish_time_ms: int
    producer: str
    key: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    schema_id: int | None = None  # reserved: carried, not interpreted yet
    schema_version: int | None = None  # reserved: carried, not interpreted yet
    # An idempotent producer's record (format version 2): its place in the producer's
    # stream to the partition, and the producer's incarnation. None: not sequenced.
    sequence: int | None = None
    producer_epoch: int = 0
    # How the payload is (to be) stored: the payload here is always the message itself.
    compression: Compression | None = None


def _utf8(field_name: str, value: object, limit_bytes: int) -> bytes:
    if not isinstance(value, str):
        raise InvalidRecordError(field_name, f"expected str, got {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRecordError(field_name, "not encodable as UTF-8") from exc
    if len(raw) > limit_bytes:
        raise InvalidRecordError(
            field_name, f"{len(raw)} UTF-8 bytes exceed the limit {limit_bytes}"
        )
    return raw


def _optional_u32(field_name: str, value: int | None) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or not 0 <= value <= _MAX_U32:
        raise InvalidRecordError(field_name, f"{value!r} is not a u32 or None")
    return value


def encode_record(record: Record) -> bytes:
    """Encode ``record`` in the current format version.

    Raises :class:`InvalidRecordError` naming the field that is over its limit, out of range,
    of a wrong type or not encodable.
    """
    time_ms = record.publish_time_ms
    if not isinstance(time_ms, int) or not 0 <= time_ms <= _MAX_U64:
        raise InvalidRecordError("publish_time_ms", f"{time_ms!r} is not a u64")
    producer = _utf8("producer", record.producer, MAX_PRODUCER_NAME_BYTES)
    key = b"" if record.key is None else _utf8("key", record.key, MAX_KEY_BYTES)
    schema_id = _optional_u32("schema_id", record.schema_id)
    schema_version = _optional_u32("schema_version", record.schema_version)
    sequence, epoch = record.sequence, record.producer_epoch
    if not isinstance(epoch, int) or not 0 <= epoch <= _MAX_U32:
        raise InvalidRecordError("producer_epoch", f"{epoch!r} is not a u32")
    if sequence is None and epoch:
        raise InvalidRecordError("producer_epoch", "an epoch without a sequence")
    if sequence is not None and (not isinstance(sequence, int) or not 0 <= sequence <= _MAX_U64):
        raise InvalidRecordError("sequence", f"{sequence!r} is not a u64 or None")
    if not isinstance(record.payload, bytes | bytearray | memoryview):
        raise InvalidRecordError("payload", f"expected bytes, got {type(record.payload).__name__}")
    codec = CODEC_NONE
    payload: bytes | bytearray | memoryview = record.payload
    if record.compression is not None:
        codec = CODEC_IDS.get(record.compression, CODEC_NONE)
        if codec == CODEC_NONE:
            raise InvalidRecordError("compression", f"{record.compression!r} is not a codec")
        if memoryview(payload).nbytes > MAX_DECOMPRESSED_PAYLOAD_BYTES:
            raise InvalidRecordError("payload", "over what a reader decompresses")
        payload = compress(codec, payload)
    payload_len = memoryview(payload).nbytes
    if payload_len > _MAX_U32:
        raise InvalidRecordError("payload", f"{payload_len} bytes exceed the u32 length")
    if not isinstance(record.attributes, Mapping):
        kind = type(record.attributes).__name__
        raise InvalidRecordError("attributes", f"expected a mapping, got {kind}")
    if len(record.attributes) > MAX_ATTRIBUTES:
        count = len(record.attributes)
        raise InvalidRecordError("attributes", f"{count} exceed the limit {MAX_ATTRIBUTES}")
    flags = (
        (0 if record.key is None else _FLAG_KEY)
        | (0 if record.schema_id is None else _FLAG_SCHEMA_ID)
        | (0 if record.schema_version is None else _FLAG_SCHEMA_VERSION)
        | codec << FLAG_CODEC_SHIFT
    )
    parts = [b"", producer, key]  # the header takes the first slot once the counts are known
    for name, value in record.attributes.items():
        raw_name = _utf8("attributes", name, MAX_ATTRIBUTE_NAME_BYTES)
        raw_value = _utf8(f"attributes[{name!r}]", value, MAX_ATTRIBUTE_VALUE_BYTES)
        parts += (_LENGTH.pack(len(raw_name)), raw_name, _LENGTH.pack(len(raw_value)), raw_value)
    parts.append(bytes(payload))
    head = (
        flags,
        time_ms,
        schema_id,
        schema_version,
        len(producer),
        len(key),
        len(record.attributes),
        payload_len,
    )
    if sequence is None:
        parts[0] = _HEADER.pack(RECORD_VERSION, *head)
    else:
        parts[0] = _SEQUENCED_HEADER.pack(SEQUENCED_RECORD_VERSION, *head, epoch, sequence)
    return b"".join(parts)


def read_text(view: bytes | memoryview, pos: int, size: int, what: str) -> str:
    """The UTF-8 text of ``size`` bytes at ``pos`` (checked: :class:`CorruptRecordError`
    naming ``what`` when it is not UTF-8)."""
    try:
        return str(view[pos : pos + size], "utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"{what} is not valid UTF-8") from exc


def _check(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise CorruptRecordError(f"{what} of {size} exceeds the limit {limit}")


_PUBLISH_TIME = struct.Struct("<Q")
_PUBLISH_TIME_AT = RECORD_PUBLISH_TIME_AT


def record_publish_time_ms(buf: bytes | bytearray | memoryview) -> int:
    """The ``publish_time_ms`` of an encoded record, read from its header alone (for scans
    that look at many records and need nothing else). Raises like
    :func:`~danube.frame.record_decode.decode_record` for a buffer that cannot be a record
    of this version."""
    view = memoryview(buf).cast("B")
    _header_bytes(view, 0, len(view))
    (time_ms,) = _PUBLISH_TIME.unpack_from(view, _PUBLISH_TIME_AT)
    return int(time_ms)


def _header_bytes(view: bytes | memoryview, start: int, end: int) -> int:
    """The header size of the record in ``view[start:end]`` by its version, once it holds
    that header; raises like :func:`~danube.frame.record_decode.decode_record` otherwise."""
    size = end - start
    if size == 0:
        raise CorruptRecordError("empty buffer")
    version = view[start]
    if version == RECORD_VERSION:
        header_bytes = RECORD_HEADER_BYTES
    elif version == SEQUENCED_RECORD_VERSION:
        header_bytes = SEQUENCED_HEADER_BYTES
    else:
        raise UnsupportedRecordVersionError(version)
    if size < header_bytes:
        raise CorruptRecordError(f"{size} bytes, shorter than the {header_bytes}-byte header")
    return header_bytes


class Sequenced(NamedTuple):
    """Who wrote a sequenced record, and its place in that producer's stream."""

    producer: str
    producer_epoch: int
    sequence: int


def record_sequence(buf: bytes | memoryview, start: int = 0) -> Sequenced | None:
    """The producer, epoch and sequence of the record at ``buf[start:]`` (its header and
    producer name alone are read), or None for a record without a sequence (version 1).
    For a record already checked (stored, or scanned on its way in): it raises
    :class:`CorruptRecordError` only for a header too short or an unknown version."""
    version = buf[start]
    if version == RECORD_VERSION:
        return None
    header_bytes = _header_bytes(buf, start, len(buf))
    (producer_len,) = _LENGTH.unpack_from(buf, start + _PRODUCER_LEN_AT)
    epoch, sequence = _SEQUENCE.unpack_from(buf, start + RECORD_HEADER_BYTES)
    text_at = start + header_bytes
    producer = read_text(buf, text_at, producer_len, "producer")
    return Sequenced(producer, epoch, sequence)


# Of a sequenced record's header, what deduplication reads: version, producer_len,
# producer_epoch, sequence (the bytes between skipped).
_SEQUENCE_HEAD = struct.Struct(
    f"<B{_PRODUCER_LEN_AT - 1}xH{RECORD_HEADER_BYTES - _PRODUCER_LEN_AT - _LENGTH.size}xIQ"
)
assert _SEQUENCE_HEAD.size == SEQUENCED_HEADER_BYTES


class SequenceRun(NamedTuple):
    """Consecutive records of one producer and epoch with consecutive sequences."""

    producer: bytes  # the name's UTF-8 bytes
    producer_epoch: int
    first_sequence: int
    first_index: int  # of the first record in the list it came from
    length: int  # records


def sequence_runs(records: Sequence[bytes | memoryview]) -> list[SequenceRun]:
    """The sequenced records of ``records`` (checked records: stored, or scanned on their way
    in) as runs: each run the longest stretch of consecutive records of one producer and
    epoch whose sequences follow one another. Unsequenced records are skipped (they end a
    run). What a replica runs over every batch it stores, so the common case, one producer's
    batch, costs one unpack and one name comparison per record."""
    runs: list[SequenceRun] = []
    unpack = _SEQUENCE_HEAD.unpack_from
    text_at = SEQUENCED_HEADER_BYTES
    name = b""
    epoch = first = start = -1
    count = 0
    previous = -2  # the index of the last sequenced record
    for index, buf in enumerate(records):
        if buf[0] != SEQUENCED_RECORD_VERSION:
            continue
        _, producer_len, record_epoch, sequence = unpack(buf, 0)
        end = text_at + producer_len
        if (
            index == previous + 1
            and sequence == first + count
            and record_epoch == epoch
            and buf[text_at:end] == name
        ):
            count += 1
        else:
            if count:
                runs.append(SequenceRun(name, epoch, first, start, count))
            name = bytes(buf[text_at:end])  # once a run: its records compare views with it
            epoch, first, start, count = record_epoch, sequence, index, 1
        previous = index
    if count:
        runs.append(SequenceRun(name, epoch, first, start, count))
    return runs


def is_record_of(buf: bytes | memoryview, producer: bytes, epoch: int, sequence: int) -> bool:
    """Whether the checked record ``buf`` is ``producer``'s (its name's UTF-8 bytes) record
    ``sequence`` of ``epoch``: one unpack and one comparison, nothing decoded."""
    if len(buf) < SEQUENCED_HEADER_BYTES or buf[0] != SEQUENCED_RECORD_VERSION:
        return False
    _, producer_len, record_epoch, record_sequence = _SEQUENCE_HEAD.unpack_from(buf, 0)
    end = SEQUENCED_HEADER_BYTES + producer_len
    return (
        record_sequence == sequence
        and record_epoch == epoch
        and buf[SEQUENCED_HEADER_BYTES:end] == producer
    )


def read_record_header(
    view: bytes | memoryview, start: int, end: int
) -> tuple[int, int, int, int, int, int, int, int]:
    """The header of the record in ``view[start:end]`` once it holds together — version,
    size, flags that agree with their fields, limits: the checks every reader of a record
    shares (:func:`~danube.frame.record_decode.decode_record_fields`, and
    ``danube.frame.produce.check_record``, which builds nothing). ``(flags, time_ms,
    schema_id, schema_version, producer_len, key_len, attribute count, payload_len)``, a
    plain tuple (this runs once per record); the text starts after the header of the
    record's version (``view[start]``: 1 or 2)."""
    _header_bytes(view, start, end)
    (_, flags, time_ms, schema_id, schema_version, producer_len, key_len, count, payload_len) = (
        _HEADER.unpack_from(view, start)
    )
    if flags & ~_KNOWN_FLAGS:
        raise CorruptRecordError(f"unknown flags {flags:#04x}")
    if flags & FLAG_CODEC and (flags & FLAG_CODEC) >> FLAG_CODEC_SHIFT not in CODEC_NAMES:
        raise CorruptRecordError(f"unknown compression codec in flags {flags:#04x}")
    # An absent field must be all zero, so that one record has exactly one encoding.
    if key_len and not flags & _FLAG_KEY:
        raise CorruptRecordError(f"key length is {key_len} but flagged absent")
    if schema_id and not flags & _FLAG_SCHEMA_ID:
        raise CorruptRecordError(f"schema_id is {schema_id} but flagged absent")
    if schema_version and not flags & _FLAG_SCHEMA_VERSION:
        raise CorruptRecordError(f"schema_version is {schema_version} but flagged absent")
    if producer_len > MAX_PRODUCER_NAME_BYTES or key_len > MAX_KEY_BYTES or count > MAX_ATTRIBUTES:
        _check(producer_len, MAX_PRODUCER_NAME_BYTES, "producer length")
        _check(key_len, MAX_KEY_BYTES, "key length")
        _check(count, MAX_ATTRIBUTES, "attribute count")
    return flags, time_ms, schema_id, schema_version, producer_len, key_len, count, payload_len


def read_attributes(
    view: bytes | memoryview, pos: int, end: int, count: int, attributes: dict[str, str]
) -> int:
    """Decode ``count`` attributes from ``pos`` (before ``end``) into ``attributes``; the
    position after them."""
    for index in range(count):
        name, pos = _attribute_text(view, pos, end, MAX_ATTRIBUTE_NAME_BYTES, index, "name")
        value, pos = _attribute_text(view, pos, end, MAX_ATTRIBUTE_VALUE_BYTES, index, "value")
        if name in attributes:
            raise CorruptRecordError(f"duplicate attribute name {name!r}")
        attributes[name] = value
    return pos


def _attribute_text(
    view: bytes | memoryview, pos: int, end: int, limit: int, index: int, part: str
) -> tuple[str, int]:
    """An attribute's name or value at ``pos`` and the position after it (every message's
    attributes come this way: what the error names is written only for an error)."""
    if end - pos < _LENGTH.size:
        raise CorruptRecordError(f"truncated in attribute {index} {part} length")
    (size,) = _LENGTH.unpack_from(view, pos)
    if size > limit:
        _check(size, limit, f"attribute {index} {part} length")
    pos += _LENGTH.size
    if end - pos < size:
        raise CorruptRecordError(f"truncated in attribute {index} {part}")
    try:
        return str(view[pos : pos + size], "utf-8"), pos + size
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"attribute {index} {part} is not valid UTF-8") from exc
