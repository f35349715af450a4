"""Produced frames: records framed as the WAL frames them, with offset 0, as a producer sends
them (HTTP ``application/vnd.danube.records``) and discovery forwards them to ingest.

A produce body is frames laid end to end, nothing before, between or after them::

    frame   [u64 offset = 0][u32 length][u32 crc32c][record: length bytes]

The frame layout is :mod:`danube.frame.codec`'s and the record layout
:mod:`danube.frame.record`'s (docs/formats.md). A producer does not know the offsets; it sends
0 in every frame and the CRC over that header and the record, so a body damaged on its way
is refused (``corrupt_frame``) before anything is stored. The partition's leader gives the
offsets, and frames each record again with its offset and the CRC of that header.

:func:`scan_frames_for_produce` walks such a body once: every frame's CRC, every record's
layout, UTF-8 and limits (as :func:`~danube.frame.decode_record_fields` checks them), without
building the records: it keeps where each record lies, its payload size and its key (what
routing needs). :func:`encode_produce_frame` is the producer's side: one record, framed,
byte for byte what ``encode_frame(0, encode_record(record))`` gives.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from danube.frame.codec import FRAME_COVERED, FRAME_HEADER, FRAME_HEADER_BYTES, BytesLike
from danube.frame.compression import CODEC_NONE, compress_if_smaller, decompress
from danube.frame.errors import (
    CorruptFrameError,
    CorruptRecordError,
    DecompressedTooLargeError,
    TruncatedFramesError,
)
from danube.frame.record import (
    FLAG_CODEC,
    FLAG_CODEC_SHIFT,
    FLAG_KEY,
    FLAG_SCHEMA_ID,
    FLAG_SCHEMA_VERSION,
    MAX_DECOMPRESSED_PAYLOAD_BYTES,
    MAX_PRODUCER_NAME_BYTES,
    RECORD_FLAGS_AT,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    RECORD_PRODUCER_LEN_AT,
    RECORD_SCHEMA_AT,
    RECORD_VERSION,
    SEQUENCED_HEADER_BYTES,
    SEQUENCED_RECORD_HEADER,
    SEQUENCED_RECORD_VERSION,
    SequenceRun,
    read_attributes,
    read_record_header,
)

# The layouts are codec.py's (frame) and record.py's (record); what is read or packed here
# at once is composed from them.
_FRAME = FRAME_HEADER
_FRAME_COVERED = FRAME_COVERED
_LENGTH = struct.Struct("<H")
_FLAG_KEY = FLAG_KEY
_STAMP_FLAGS = FLAG_SCHEMA_ID | FLAG_SCHEMA_VERSION
_STAMP = struct.Struct("<II")  # schema_id, schema_version
_STAMP_AT = RECORD_SCHEMA_AT
_FLAGS_AT = RECORD_FLAGS_AT
# A record's payload_len: the last field of its header (either version's first part).
_PAYLOAD_LEN = struct.Struct("<" + RECORD_HEADER.format[-1])
_PAYLOAD_LEN_AT = RECORD_HEADER_BYTES - _PAYLOAD_LEN.size
# What the producer packs at once: the frame header less its crc (offset, length: what the
# crc covers first), then the record header; the crc goes between them.
_HEADS = struct.Struct(FRAME_COVERED.format + RECORD_HEADER.format[1:])
# The same for a sequenced record (version 2): producer_epoch and sequence end its header.
_SEQUENCED_HEADS = struct.Struct(FRAME_COVERED.format + SEQUENCED_RECORD_HEADER.format[1:])
_COVERED_BYTES = _FRAME_COVERED.size
_CRC = struct.Struct("<I")
# A sequenced record's producer_epoch and sequence, right after version 1's header.
_EPOCH_SEQUENCE = struct.Struct(
    SEQUENCED_RECORD_HEADER.format[0] + SEQUENCED_RECORD_HEADER.format[-2:]
)
_EPOCH_SEQUENCE_AT = RECORD_HEADER_BYTES
# What the scan reads at once: the whole frame header, then the record header (of either
# version: the fields after version 1's header are not needed to check a record).
_SCANNED = struct.Struct(FRAME_HEADER.format + RECORD_HEADER.format[1:])
_SCANNED_BYTES = _SCANNED.size
_HEADER_BYTES_BY_VERSION = {
    RECORD_VERSION: RECORD_HEADER_BYTES,
    SEQUENCED_RECORD_VERSION: SEQUENCED_HEADER_BYTES,
}

PRODUCE_OFFSET = 0
"""The offset every produced frame carries: the leader gives the real ones."""


def encode_produce_frame(
    payload: BytesLike,
    *,
    producer: bytes,
    publish_time_ms: int,
    key: bytes | None = None,
    attributes: Sequence[tuple[bytes, bytes]] = (),
    sequence: int | None = None,
    producer_epoch: int = 0,
    codec: int = CODEC_NONE,
) -> bytes:
    """One record (its text fields already UTF-8 and within their limits: the caller checks
    them) framed with offset 0. ``key=None``: no key; ``b""``: an empty key. ``codec``
    (danube.frame.compression): the payload stored compressed, when that makes it smaller
    (else as is, flag clear).

    The producer's hot path (once per ``send()``): the frame header's covered part and the
    record header in one pack and one CRC call, then the CRC over the text and the payload,
    and one ``join``, so the payload is copied once."""
    flags = 0 if key is None else _FLAG_KEY
    if codec != CODEC_NONE:
        packed = compress_if_smaller(codec, bytes(payload))
        if packed is not None:
            payload, flags = packed, flags | codec << FLAG_CODEC_SHIFT
    payload_len = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
    if key is None and not attributes:
        text: BytesLike = producer
    else:
        fields: list[BytesLike] = [producer]
        if key is not None:
            fields.append(key)
        for name, value in attributes:
            fields += (_LENGTH.pack(len(name)), name, _LENGTH.pack(len(value)), value)
        text = b"".join(fields)
    sequenced = sequence is not None
    header_bytes = SEQUENCED_HEADER_BYTES if sequenced else RECORD_HEADER_BYTES
    head = (
        PRODUCE_OFFSET,
        header_bytes + len(text) + payload_len,
        SEQUENCED_RECORD_VERSION if sequenced else RECORD_VERSION,
        flags,
        publish_time_ms,
        0,
        0,
        len(producer),
        0 if key is None else len(key),
        len(attributes),
        payload_len,
    )
    heads = (
        _SEQUENCED_HEADS.pack(*head, producer_epoch, sequence) if sequenced else _HEADS.pack(*head)
    )
    crc = crc32c(payload, crc32c(text, crc32c(heads)))
    return b"".join((heads[:_COVERED_BYTES], _CRC.pack(crc), heads[_COVERED_BYTES:], text, payload))


def frame_for_produce(record: BytesLike) -> bytes:
    """``record`` (an encoded record) framed with offset 0."""
    length = len(record) if not isinstance(record, memoryview) else record.nbytes
    crc = crc32c(record, crc32c(_FRAME_COVERED.pack(PRODUCE_OFFSET, length)))
    return _FRAME.pack(PRODUCE_OFFSET, length, crc) + bytes(record)


@dataclass(frozen=True, slots=True)
class ProducedFrames:
    """What :func:`scan_frames_for_produce` found: record ``i`` spans
    ``body[starts[i] : ends[i]]`` (its frame begins ``FRAME_HEADER_BYTES`` earlier); the
    sequenced records as runs (:func:`~danube.frame.record.sequence_runs` of the records,
    read on the way)."""

    body: memoryview
    starts: list[int]
    ends: list[int]
    keys: list[str | None]
    payload_sizes: list[int]  # of the messages: a compressed payload's decompressed size
    runs: list[SequenceRun]

    def __len__(self) -> int:
        return len(self.starts)

    def record(self, index: int) -> memoryview:
        """Record ``index`` as a view of the body."""
        return self.body[self.starts[index] : self.ends[index]]

    def payload_start(self, index: int) -> int:
        """Where the stored payload of record ``index`` begins in the body (it runs to the
        record's end): ``ends[index] - payload_sizes[index]`` unless it is stored
        compressed, when the size is the message's and the record's header tells."""
        body, start, end = self.body, self.starts[index], self.ends[index]
        if not body[start + _FLAGS_AT] & FLAG_CODEC:
            return end - self.payload_sizes[index]
        return end - int(_PAYLOAD_LEN.unpack_from(body, start + _PAYLOAD_LEN_AT)[0])

    def payload(self, index: int) -> memoryview:
        """The message of record ``index``: its payload (which ends the record), decompressed
        when it is stored compressed (checked by the scan: it inflates within its bound)."""
        body, end = self.body, self.ends[index]
        stored = body[self.payload_start(index) : end]
        flags = body[self.starts[index] + _FLAGS_AT]
        if not flags & FLAG_CODEC:
            return stored
        codec = (flags & FLAG_CODEC) >> FLAG_CODEC_SHIFT
        size = self.payload_sizes[index]
        return memoryview(decompress(codec, stored, size_bytes_max=size))

    def frames(self, indexes: Sequence[int]) -> list[memoryview]:
        """The frames of records ``indexes``, as views (join them to send)."""
        body, starts, ends = self.body, self.starts, self.ends
        return [body[starts[i] - FRAME_HEADER_BYTES : ends[i]] for i in indexes]


def scan_frames_for_produce(
    body: BytesLike,
    *,
    max_count: int,
    stamped: bool = False,
    payload_bytes_max: int = MAX_DECOMPRESSED_PAYLOAD_BYTES,
) -> ProducedFrames:
    """Check every frame and record of a produce body; where they lie, their keys and sizes.

    Raises :class:`TruncatedFramesError` for a body that ends inside a frame (or is empty),
    :class:`CorruptFrameError` for an offset other than 0 or a CRC that does not match, and
    :class:`CorruptRecordError` for a record :func:`~danube.frame.decode_record_fields` would
    refuse. Past ``max_count`` frames it stops, so ``len(result) == max_count + 1`` tells the
    caller the body holds too many. Payload sizes are left to the caller's limits, except
    that a compressed payload is inflated here to check it, and refused
    (:class:`~danube.frame.errors.DecompressedTooLargeError`, code ``payload_too_large``)
    when it states a size over ``payload_bytes_max``, before anything is inflated: its size
    in the result is the message's. A record
    carrying a schema id or version is refused unless ``stamped`` (discovery stamps them,
    from the topic's binding; a producer names a version, never stamps one). The sequenced
    records (format version 2) are gathered into runs as they are read: what discovery and
    the leader check of an idempotent producer's batch, with no second pass.
    """
    view = memoryview(body)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    if len(view) == 0:
        raise TruncatedFramesError(position=0, reason="an empty body holds no frame")
    return _scan(view, max_count, stamped, payload_bytes_max)


def _scan(
    view: memoryview, max_count: int, stamped: bool, payload_bytes_max: int
) -> ProducedFrames:
    """The walk of :func:`scan_frames_for_produce` over a body of bytes, not empty: the common
    record (no key, attributes or schema) checked in one unpack, without a call per record
    (this runs for every produced message, in discovery and again in ingest); anything else,
    or anything wrong, by the general path (_scan_general), which says what is wrong."""
    end = len(view)
    starts: list[int] = []
    ends: list[int] = []
    keys: list[str | None] = []
    sizes: list[int] = []
    unpack_both = _SCANNED.unpack_from
    runs = _Runs()
    pos = 0
    while pos < end and len(starts) <= max_count:
        name: str | None = None
        if end - pos >= _SCANNED_BYTES:
            (
                offset,
                length,
                crc,
                version,
                flags,
                _,
                sid,
                sver,
                producer_len,
                key_len,
                count,
                size,
            ) = unpack_both(view, pos)
            start = pos + FRAME_HEADER_BYTES
            stop = start + length
            header_bytes = _HEADER_BYTES_BY_VERSION.get(version, 0)
            if (
                offset == PRODUCE_OFFSET
                and stop <= end
                and header_bytes
                and not (flags & ~FLAG_CODEC or sid or sver or key_len or count)
                and producer_len <= MAX_PRODUCER_NAME_BYTES
                and length == header_bytes + producer_len + size
                and crc32c(view[start:stop], crc32c(view[pos : pos + _COVERED_BYTES])) == crc
            ):
                text_at = start + header_bytes
                try:
                    name = str(view[text_at : text_at + producer_len], "utf-8")
                    if flags:  # a compressed payload (the codec bits alone): inflated to check
                        size = len(
                            decompress(
                                flags >> FLAG_CODEC_SHIFT,
                                view[stop - size : stop],
                                size_bytes_max=payload_bytes_max,
                            )
                        )
                    key = None
                except (UnicodeDecodeError, CorruptRecordError):
                    name = None  # the general path refuses it, saying why
        if name is None:
            start, stop, key, size, version, name = _scan_general(
                view, pos, end, stamped, len(starts), payload_bytes_max
            )
        if version == SEQUENCED_RECORD_VERSION:
            runs.add(view, start, len(starts), name)
        starts.append(start)
        ends.append(stop)
        keys.append(key)
        sizes.append(size)
        pos = stop
    return ProducedFrames(view, starts, ends, keys, sizes, runs.done())


class _Runs:
    """The sequenced records of a scan as runs (what :func:`sequence_runs` reads of them):
    the open one's producer, epoch, first sequence, first index and length."""

    __slots__ = ("epoch", "first", "length", "name", "runs", "start")

    def __init__(self) -> None:
        self.runs: list[SequenceRun] = []
        self.name = ""
        self.epoch = self.first = self.start = self.length = 0

    def add(self, view: memoryview, start: int, index: int, name: str) -> None:
        """The sequenced record ``index`` at ``view[start:]``, of producer ``name``."""
        epoch, sequence = _EPOCH_SEQUENCE.unpack_from(view, start + _EPOCH_SEQUENCE_AT)
        length = self.length
        if (
            length
            and sequence == self.first + length
            and index == self.start + length
            and epoch == self.epoch
            and name == self.name
        ):
            self.length = length + 1
            return
        self._close()
        self.name, self.epoch, self.first, self.start, self.length = name, epoch, sequence, index, 1

    def done(self) -> list[SequenceRun]:
        self._close()
        return self.runs

    def _close(self) -> None:
        if self.length:
            self.runs.append(
                SequenceRun(self.name.encode(), self.epoch, self.first, self.start, self.length)
            )
            self.length = 0


def _scan_general(
    view: memoryview, pos: int, end: int, stamped: bool, index: int, payload_bytes_max: int
) -> tuple[int, int, str | None, int, int, str]:
    """The frame at ``pos`` checked in full, saying what is wrong: where its record starts
    and stops, its key, payload size, version and producer."""
    if end - pos < FRAME_HEADER_BYTES:
        raise TruncatedFramesError(position=pos, reason="the body ends inside a frame header")
    offset, length, crc = _FRAME.unpack_from(view, pos)
    start = pos + FRAME_HEADER_BYTES
    stop = start + length
    if stop > end:
        raise TruncatedFramesError(
            position=pos, reason=f"a {length}-byte record runs past the end of the body"
        )
    if offset != PRODUCE_OFFSET:
        raise CorruptFrameError(
            position=pos, offset=offset, reason="a produced frame carries offset 0"
        )
    record = view[start:stop]
    actual = crc32c(record, crc32c(view[pos : pos + _FRAME_COVERED.size]))
    if actual != crc:
        raise CorruptFrameError(
            position=pos,
            offset=offset,
            reason=f"crc mismatch (sent {crc:#010x}, computed {actual:#010x})",
        )
    try:
        key, size = check_record(view, start, stop, payload_bytes_max=payload_bytes_max)
        if not stamped and view[start + _FLAGS_AT] & _STAMP_FLAGS:
            raise CorruptRecordError("a produced record carries no schema id or version")
    except DecompressedTooLargeError:
        raise  # its own kind: a message over a size limit (413), not damaged bytes
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"record {index}: {exc.reason}") from None
    version = view[start]
    (producer_len,) = _LENGTH.unpack_from(view, start + RECORD_PRODUCER_LEN_AT)
    text_at = start + _HEADER_BYTES_BY_VERSION[version]
    name = str(view[text_at : text_at + producer_len], "utf-8")  # checked: valid
    return start, stop, key, size, version, name


def check_record(
    view: memoryview,
    start: int,
    end: int,
    *,
    payload_bytes_max: int = MAX_DECOMPRESSED_PAYLOAD_BYTES,
) -> tuple[str | None, int]:
    """Check the record spanning ``view[start:end]`` as :func:`decode_record_fields` does,
    building nothing but its key; ``(key, message size)``. Raises like it. A compressed
    payload is inflated (then dropped) to check it, once its stated size is found within
    ``payload_bytes_max``: what is stored compressed is known to decompress, so a reader
    never meets a message it cannot decode; its size is the decompressed one."""
    flags, _, _, _, producer_len, key_len, count, payload_len = read_record_header(view, start, end)
    pos = start + _HEADER_BYTES_BY_VERSION[view[start]]
    key_at = pos + producer_len
    text_end = key_at + key_len
    if text_end > end:
        raise CorruptRecordError("truncated in producer or key")
    try:
        if producer_len:
            str(view[pos:key_at], "utf-8")
        key = str(view[key_at:text_end], "utf-8") if flags & _FLAG_KEY else None
    except UnicodeDecodeError as exc:
        raise CorruptRecordError("producer or key is not valid UTF-8") from exc
    pos = read_attributes(view, text_end, end, count, {}) if count else text_end
    if end - pos != payload_len:
        problem = "truncated in payload" if end - pos < payload_len else "trailing bytes"
        raise CorruptRecordError(
            f"{problem}: {end - pos} bytes left for a {payload_len}-byte payload"
        )
    if flags & FLAG_CODEC:
        codec = (flags & FLAG_CODEC) >> FLAG_CODEC_SHIFT
        return key, len(decompress(codec, view[pos:end], size_bytes_max=payload_bytes_max))
    return key, payload_len


def stamp_schema(record: BytesLike, schema_id: int, version: int) -> bytes:
    """``record`` with its schema id and version set (a topic bound to a schema stamps every
    record it stores with what it was checked against): a copy, header patched."""
    raw = bytearray(record)
    raw[_FLAGS_AT] |= _STAMP_FLAGS
    _STAMP.pack_into(raw, _STAMP_AT, schema_id, version)
    return bytes(raw)
