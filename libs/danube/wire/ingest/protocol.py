"""Binary bodies of the ingest bus API (docs/bus.md lists the subjects).

All integers little-endian. Payload bytes travel as they are: no base64, no JSON around
them. Fetch replies carry danube.frame frames exactly as the WAL holds them (checked once
where they were read; the hops after carry them unchanged, and whoever decodes a record
checks its frame), so the uploader can write them to objects as is::

    produce request   [u32 0xFFFFFFFF][u32 count] then count frames of offset 0
                      (danube.frame.produce: CRC-checked; the leader writes each frame's
                      offset and CRC where it lies: danube.frame.batch). The mark is what
                      told this layout from a size-prefixed one ([u32 count] then count x
                      ([u32 size][record])), no longer taken
    produce reply     [u64 first_offset][u32 count]     offsets first..first+count-1
                      [u8 flags] (may be absent: 0): bit 0 duplicate, the records were an
                      idempotent producer's resend, stored before at these offsets
                      (nothing was appended); bit 1 listed, then count x [u64 offset],
                      one per record, bit 63 set when that record's message id was
                      stored before (a topic's message id window: the offsets need not
                      be consecutive, and only the new records were appended)
    fetch request     [u64 from_offset][u32 max_bytes][u32 max_count]
    fetch reply       [u8 status][u64 wal_start][u64 next_offset] then frames
                      status 0: frames from from_offset on (maybe none yet)
                      status 1: from_offset is below wal_start: read the cloud tier
                      status 3 (damaged): no intact frame of this copy from from_offset
                      until next_offset (exclusive); instead of frames, the UTF-8 name of
                      the damaged file (WAL segment or object key): read the other tier
    live message      non-reliable topic: frames of one durable batch (or a slice of it),
                      in offset order
                      reliable topic: a durable_next wake-up, [u64 next_offset][u32 count]
                      [u64 payload_bytes]: offsets below next_offset are committed, the last
                      batch held count messages of payload_bytes (readers fetch them)
    drop request      [u64 below_offset]
    drop reply        [u32 segments_removed][u64 wal_start]
    time request      [u64 timestamp_ms]
    time reply        [u64 offset]     the first offset published at or after timestamp_ms

Replication between the replicas of a partition has a contract of its own
(:mod:`danube.wire.ingest.replication`).

Control bodies (stats, the leader probe) are :mod:`danube.wire.ingest.control`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from danube.errors import ErrorKind
from danube.frame import FrameError
from danube.frame.batch import FrameBatch
from danube.frame.codec import BytesLike
from danube.frame.produce import frame_for_produce, scan_frames_for_produce
from danube.frame.record import SequenceRun
from danube.wire import codes

# The one error of every contract, re-exported: callers raise ``protocol.BadRequestError``.
from danube.wire.errors import BadRequestError as BadRequestError

_U64 = struct.Struct("<Q")
_PRODUCE_REPLY = struct.Struct("<QI")
_PRODUCE_DUPLICATE = struct.Struct("<QIB")
_DUPLICATE = 0x01  # produce reply flags: a resend, nothing appended
_LISTED = 0x02  # produce reply flags: each record's offset follows
_DUPLICATE_BIT = 1 << 63  # a listed offset's mark: that record was stored before
_FETCH_REQUEST = struct.Struct("<QII")  # from_offset, max_bytes, max_count: not a frame header
_FETCH_REPLY_HEAD = struct.Struct("<BQQ")
_DROP_REPLY = struct.Struct("<IQ")

PRODUCE_COUNT_MAX = 100_000

# The produce errors of an idempotent producer's records (docs/client.md, "Exactly once into
# the log"): a sequence that is not the next one (a gap, or a resend overlapping what was
# stored in another cut), and an epoch older than one the partition has seen.
OUT_OF_ORDER_SEQUENCE = codes.OUT_OF_ORDER_SEQUENCE
PRODUCER_FENCED = codes.PRODUCER_FENCED

MESSAGE_ID_ATTRIBUTE = "danube.message_id"
"""The record attribute a client that keeps no sequence names a message by: on a topic with
a ``message_id_window_s`` policy a repeat within the window is not stored again."""
FRAMED_MARK = 0xFFFF_FFFF  # never a count (1..PRODUCE_COUNT_MAX): a framed produce request
_FRAMED_HEAD = struct.Struct("<II")
FRAMED_HEAD_BYTES = _FRAMED_HEAD.size


class FetchStatus(IntEnum):
    """The status of a fetch reply; cloud_reader answers in the same format."""

    OK = 0
    BELOW_WAL_START = 1  # ingest: the second field is where the WAL starts
    NOT_IN_CLOUD = 2  # cloud_reader: no object holds the offset or any later one
    DAMAGED = 3  # either: bad bytes from from_offset until next_offset; the body names the file


FILE_NAME_BYTES_MAX = 1024


def encode_produce_request(records: Sequence[BytesLike]) -> bytes:
    """Frame encoded records (danube.frame.encode_record output) into one request body."""
    return encode_framed_produce_request(len(records), [frame_for_produce(r) for r in records])


def encode_framed_produce_request(count: int, frames: Sequence[BytesLike]) -> bytes:
    """Pack ``count`` frames of offset 0 (danube.frame.produce), given as one or more runs of
    whole frames, into one request body."""
    return b"".join((_FRAMED_HEAD.pack(FRAMED_MARK, count), *frames))


def framed_request_bytes(frame_bytes: int) -> int:
    """The size of a request carrying ``frame_bytes`` of frames."""
    return FRAMED_HEAD_BYTES + frame_bytes


class ProduceRecords(NamedTuple):
    """A decoded produce request: its frames (the records, as a sequence), and their
    sequenced ones as runs."""

    records: FrameBatch
    runs: list[SequenceRun]


def decode_produce_request(
    body: bytes, *, max_record_bytes: int, max_count: int = PRODUCE_COUNT_MAX
) -> ProduceRecords:
    """The frames of a produce request, each checked as a frame and a record (nothing built
    but the writable buffer the WAL gives them their offsets in); BadRequestError if the
    layout, a size or a record is off."""
    view = memoryview(body)
    if len(view) < FRAMED_HEAD_BYTES:
        raise BadRequestError("produce request shorter than its head")
    mark, count = _FRAMED_HEAD.unpack_from(view, 0)
    if mark != FRAMED_MARK:
        raise BadRequestError(
            "not a framed produce request (the size-prefixed layout is no longer taken)"
        )
    if not 1 <= count <= max_count:
        raise BadRequestError(f"produce request count {count} outside 1..{max_count}")
    try:
        frames = scan_frames_for_produce(view[FRAMED_HEAD_BYTES:], max_count=count, stamped=True)
    except FrameError as exc:
        raise BadRequestError(f"framed produce request: {exc}") from exc
    if len(frames) != count:
        raise BadRequestError(f"framed produce request of {len(frames)} frames, not {count}")
    starts, ends = frames.starts, frames.ends
    for index in range(count):
        if ends[index] - starts[index] > max_record_bytes:
            raise BadRequestError(
                f"record {index}: {ends[index] - starts[index]} bytes is over the "
                f"{max_record_bytes}-byte limit",
                code=codes.PAYLOAD_TOO_LARGE,
                kind=ErrorKind.TOO_LARGE,
            )
    return ProduceRecords(FrameBatch.of_frames(frames.body, starts, ends), frames.runs)


class ProduceReply(NamedTuple):
    """A produce answer: the records hold offsets ``first_offset .. first_offset+messages-1``;
    ``duplicate``: they were stored before (an idempotent producer's resend). ``listed``
    (a message id window found some records stored before): each record's own offset, with
    :data:`DUPLICATE_MARK` set on those."""

    first_offset: int
    messages: int
    duplicate: bool = False
    listed: tuple[int, ...] = ()

    def offset(self, index: int) -> int:
        """Record ``index``'s offset."""
        if self.listed:
            return self.listed[index] & ~_DUPLICATE_BIT
        return self.first_offset + index

    def duplicate_at(self, index: int) -> bool:
        """Whether record ``index`` was stored before this request."""
        if self.listed:
            return bool(self.listed[index] & _DUPLICATE_BIT)
        return self.duplicate


DUPLICATE_MARK = _DUPLICATE_BIT


def encode_produce_reply(
    first_offset: int, count: int, *, duplicate: bool = False, listed: Sequence[int] = ()
) -> bytes:
    if listed:
        flags = _LISTED | (_DUPLICATE if duplicate else 0)
        head = _PRODUCE_DUPLICATE.pack(first_offset, count, flags)
        return head + struct.pack(f"<{len(listed)}Q", *listed)
    if duplicate:
        return _PRODUCE_DUPLICATE.pack(first_offset, count, _DUPLICATE)
    return _PRODUCE_REPLY.pack(first_offset, count)


def decode_produce_reply(body: bytes) -> ProduceReply:
    if len(body) == _PRODUCE_REPLY.size:
        first, count = _PRODUCE_REPLY.unpack(body)
        return ProduceReply(int(first), int(count))
    if len(body) < _PRODUCE_DUPLICATE.size:
        raise BadRequestError(f"produce reply of {len(body)} bytes")
    first, count, flags = _PRODUCE_DUPLICATE.unpack_from(body)
    listed: tuple[int, ...] = ()
    if flags & _LISTED:
        if len(body) != _PRODUCE_DUPLICATE.size + 8 * count:
            raise BadRequestError(f"produce reply of {len(body)} bytes listing {count} offsets")
        listed = struct.unpack_from(f"<{count}Q", body, _PRODUCE_DUPLICATE.size)
    elif len(body) != _PRODUCE_DUPLICATE.size:
        raise BadRequestError(f"produce reply of {len(body)} bytes")
    return ProduceReply(int(first), int(count), bool(flags & _DUPLICATE), listed)


@dataclass(frozen=True, slots=True)
class FetchRequest:
    from_offset: int
    max_bytes: int
    max_count: int

    def encode(self) -> bytes:
        return _FETCH_REQUEST.pack(self.from_offset, self.max_bytes, self.max_count)

    @classmethod
    def decode(cls, body: bytes) -> FetchRequest:
        if len(body) != _FETCH_REQUEST.size:
            raise BadRequestError(f"fetch request of {len(body)} bytes")
        from_offset, max_bytes, max_count = _FETCH_REQUEST.unpack(body)
        if max_count < 1 or max_bytes < 1:
            raise BadRequestError("fetch max_bytes and max_count must be at least 1")
        return cls(int(from_offset), int(max_bytes), int(max_count))


def encode_fetch_reply(
    status: FetchStatus,
    wal_start: int,
    next_offset: int,
    frames: Sequence[tuple[int, bytes | memoryview]],
) -> bytes:
    """The reply head followed by the ``(offset, whole frame)`` frames as they are: one copy,
    into the reply, and no CRC computed."""
    return b"".join(
        [_FETCH_REPLY_HEAD.pack(status, wal_start, next_offset)] + [f for _, f in frames]
    )


WAKEUP = struct.Struct("<QIQ")


@dataclass(frozen=True, slots=True)
class Wakeup:
    """A reliable partition's live message: offsets below ``next_offset`` are committed; the
    batch that moved it held ``count`` messages and ``payload_bytes`` bytes of records."""

    next_offset: int
    count: int
    payload_bytes: int

    def encode(self) -> bytes:
        return WAKEUP.pack(self.next_offset, self.count, self.payload_bytes)

    @classmethod
    def decode(cls, body: bytes) -> Wakeup | None:
        """The wake-up ``body`` is or holds (:class:`Carried`), or None when it is neither
        (a frames body)."""
        if len(body) != WAKEUP.size:
            carried = Carried.decode(body)
            return None if carried is None else carried.wakeup
        next_offset, count, size = WAKEUP.unpack(body)
        return cls(int(next_offset), int(count), int(size))


# A reliable partition's live message that carries the frames it announces: the mark, the
# first offset, then the wake-up's fields, then a fetch reply body for the frames.
CARRIED_MARK = b"DLWC"
_CARRIED_HEAD = struct.Struct("<4sQQIQ")
LIVE_CARRY_BYTES_MAX = 64 * 1024
"""A commit (or the run of commits published at once) of at most this many payload bytes
travels with its frames on the live subject: a reader at its first offset needs no fetch.
Larger ones (the batched rate) stay a plain wake-up: the frames would cross the bus twice."""


@dataclass(frozen=True, slots=True)
class Carried:
    """A wake-up with its frames: offsets ``[first_offset, wakeup.next_offset)`` are
    committed, and ``reply`` is what a WAL fetch from ``first_offset`` answers for them (a
    fetch reply body), so a reader whose read position is ``first_offset`` takes them from
    here. Ingest builds it from the records it just committed (docs/bus.md, live)."""

    first_offset: int
    wakeup: Wakeup
    reply: memoryview

    @staticmethod
    def encode(first_offset: int, wal_start: int, wakeup: Wakeup, frames: bytes) -> bytes:
        head = _CARRIED_HEAD.pack(
            CARRIED_MARK, first_offset, wakeup.next_offset, wakeup.count, wakeup.payload_bytes
        )
        reply = _FETCH_REPLY_HEAD.pack(FetchStatus.OK, wal_start, wakeup.next_offset)
        return b"".join((head, reply, frames))

    @classmethod
    def decode(cls, body: bytes) -> Carried | None:
        """The carried wake-up ``body`` is, or None (a plain wake-up, a frames body)."""
        if len(body) < _CARRIED_HEAD.size + _FETCH_REPLY_HEAD.size:
            return None
        mark, first, next_offset, count, size = _CARRIED_HEAD.unpack_from(body, 0)
        if mark != CARRIED_MARK or not first < next_offset:
            return None
        wakeup = Wakeup(int(next_offset), int(count), int(size))
        return cls(int(first), wakeup, memoryview(body)[_CARRIED_HEAD.size :])


@dataclass(frozen=True, slots=True)
class Damaged:
    """What a ``DAMAGED`` fetch reply says: this copy has no intact frame from
    ``from_offset`` until ``to_offset`` (exclusive); ``file`` is the damaged file."""

    from_offset: int
    to_offset: int
    file: str

    def __str__(self) -> str:
        return f"offsets {self.from_offset}..{self.to_offset - 1} in {self.file}"


def encode_damaged_reply(wal_start: int, resume_offset: int, file: str) -> bytes:
    """A ``DAMAGED`` fetch reply: nothing intact until ``resume_offset``; ``file`` is the
    damaged WAL segment or object key."""
    name = file.encode()[:FILE_NAME_BYTES_MAX]
    return _FETCH_REPLY_HEAD.pack(FetchStatus.DAMAGED, wal_start, resume_offset) + name


def decode_damaged_file(body: memoryview) -> str:
    """The file a ``DAMAGED`` reply names (its body after the head)."""
    if len(body) > FILE_NAME_BYTES_MAX:
        raise BadRequestError(f"damaged reply naming a file of {len(body)} bytes")
    return bytes(body).decode(errors="replace")


def decode_fetch_reply_head(body: bytes | memoryview) -> tuple[FetchStatus, int, int, memoryview]:
    """``(status, wal_start, next_offset, frames)``; decode the frames with danube.frame."""
    if len(body) < _FETCH_REPLY_HEAD.size:
        raise BadRequestError(f"fetch reply of {len(body)} bytes")
    status, wal_start, next_offset = _FETCH_REPLY_HEAD.unpack_from(body, 0)
    return (
        FetchStatus(status),
        int(wal_start),
        int(next_offset),
        memoryview(body)[_FETCH_REPLY_HEAD.size :],
    )


def encode_offset(offset: int) -> bytes:
    return _U64.pack(offset)


def decode_offset(body: bytes) -> int:
    if len(body) != _U64.size:
        raise BadRequestError(f"expected an 8-byte offset, got {len(body)} bytes")
    return int(_U64.unpack(body)[0])


NODE_ID_BYTES_MAX = 128


def encode_node(node_id: str) -> bytes:
    """A node id (``repl.leave``), UTF-8."""
    return node_id.encode()


def decode_node(body: bytes) -> str:
    if not 0 < len(body) <= NODE_ID_BYTES_MAX:
        raise BadRequestError(f"a node id of {len(body)} bytes")
    try:
        return bytes(body).decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise BadRequestError("a node id that is not UTF-8") from exc


def encode_timestamp(timestamp_ms: int) -> bytes:
    return _U64.pack(timestamp_ms)


def decode_timestamp(body: bytes) -> int:
    if len(body) != _U64.size:
        raise BadRequestError(f"expected an 8-byte timestamp, got {len(body)} bytes")
    return int(_U64.unpack(body)[0])


def encode_drop_reply(segments_removed: int, wal_start: int) -> bytes:
    return _DROP_REPLY.pack(segments_removed, wal_start)


def decode_drop_reply(body: bytes) -> tuple[int, int]:
    if len(body) != _DROP_REPLY.size:
        raise BadRequestError(f"drop reply of {len(body)} bytes")
    removed, start = _DROP_REPLY.unpack(body)
    return int(removed), int(start)
