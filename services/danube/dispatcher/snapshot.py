"""The delay snapshot: one immutable object holding the delayed messages of one partition of
one subscription read in the offsets ``[from_offset, to_offset)``, grouped by due bucket, so a
dispatcher taking the subscription over loads them a bucket at a time as they fall due
instead of reading the log again (danube.dispatcher.sealed; docs/formats.md, "Delay
snapshots"). Pure: bytes in, bytes out.

Layout, little-endian::

    head   magic "DDLY" | version u16 | reserved u16 | from_offset u64 | to_offset u64
           | due_min_ms i64 | due_max_ms i64 | count u32 | bucket_count u32 | body_bytes u64
           | head_crc u32 (crc32c of the head before it and of the whole table)
    table  bucket_count x (bucket i64 | position u64 | length u32 | count u32 | crc u32)
           in increasing bucket order; position is from the body's start, crc the
           crc32c of the bucket's bytes
    body   each bucket's records, back to back: RECORD (due_ms, slot, offset, length), then
           the message's frame (``length`` bytes) as read from the log; slot is 0 here

A reader reads the head and table with one ranged read (their size is ``head_bytes``), then
one bucket's bytes with another, checking the crc of each: a torn object (short, or written
over) or a flipped bit is :class:`CorruptSnapshotError`, never a wrong message.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from crc32c import crc32c

from danube.errors import DanubeError

# One delayed message, then its frame (``length`` bytes): the delay index's record as well.
#   due_ms i64 | slot u32 (a partition's slot in the index) | offset u64 | length u32
RECORD = struct.Struct("<qIQI")
_HEAD = struct.Struct("<4sHHQQqqIIQ")  # up to head_crc, which follows as its own u32
_CRC = struct.Struct("<I")
_ENTRY = struct.Struct("<qQIII")
MAGIC = b"DDLY"
VERSION = 1
HEAD_BYTES = _HEAD.size + _CRC.size
BUCKETS_MAX = 100_000  # a snapshot spans at most the delay range (days) in 1 s buckets
SNAPSHOT_BYTES_MAX = 1 << 30  # a reader refuses a head claiming more


class CorruptSnapshotError(DanubeError):
    """A snapshot object is not what its reference says (torn, truncated, bits flipped, an
    unknown version): its range is read from the log instead."""

    code = "snapshot_corrupt"
    retriable = False


@dataclass(frozen=True, slots=True)
class BucketEntry:
    """Where one due bucket's records lie in a snapshot (``position`` from the object's start)."""

    bucket: int
    position: int
    length: int
    count: int
    crc: int


@dataclass(frozen=True, slots=True)
class SnapshotHead:
    """A snapshot's head and table, checked."""

    from_offset: int
    to_offset: int
    due_min_ms: int
    due_max_ms: int
    count: int
    buckets: tuple[BucketEntry, ...]
    head_bytes: int  # head and table: where the body starts
    size_bytes: int  # the whole object


def encode_snapshot(
    from_offset: int,
    to_offset: int,
    buckets: Mapping[int, bytes | bytearray],
    counts: Mapping[int, int],
    due_range_ms: tuple[int, int],
) -> bytes:
    """The snapshot of ``buckets`` (bucket -> its records, as :data:`RECORD` + frame) read in
    ``[from_offset, to_offset)``; ``counts`` are the records per bucket."""
    if not 0 <= from_offset < to_offset:
        raise ValueError(f"bad range [{from_offset}, {to_offset})")
    if len(buckets) > BUCKETS_MAX:
        raise ValueError(f"{len(buckets)} buckets (at most {BUCKETS_MAX})")
    table = bytearray()
    position = 0
    keys = sorted(buckets)
    for key in keys:
        data = buckets[key]
        table += _ENTRY.pack(key, position, len(data), counts[key], crc32c(data))
        position += len(data)
    head = _HEAD.pack(
        MAGIC,
        VERSION,
        0,
        from_offset,
        to_offset,
        *due_range_ms,
        sum(counts[key] for key in keys),
        len(keys),
        position,
    )
    checked = head + bytes(table)
    return b"".join([head, _CRC.pack(crc32c(checked)), table, *(buckets[key] for key in keys)])


def head_size(data: bytes) -> int:
    """How many bytes the head and table take, from the fixed head alone (``HEAD_BYTES``)."""
    fields = _unpack_head(data)
    return HEAD_BYTES + fields[8] * _ENTRY.size


def read_head(data: bytes) -> SnapshotHead:
    """The head and table at the start of ``data`` (at least :func:`head_size` bytes),
    checked; CorruptSnapshotError otherwise."""
    fields = _unpack_head(data)
    _, _, _, from_offset, to_offset, due_min, due_max, count, bucket_count, body = fields
    end = HEAD_BYTES + bucket_count * _ENTRY.size
    if len(data) < end:
        raise CorruptSnapshotError(f"head of {len(data)} bytes, its table ends at {end}")
    (crc,) = _CRC.unpack_from(data, _HEAD.size)
    if crc32c(data[: _HEAD.size] + data[HEAD_BYTES:end]) != crc:
        raise CorruptSnapshotError("head crc mismatch")
    entries = []
    expected = end
    for at in range(HEAD_BYTES, end, _ENTRY.size):
        bucket, position, length, records, bucket_crc = _ENTRY.unpack_from(data, at)
        if end + position != expected:
            raise CorruptSnapshotError(f"bucket {bucket} at {position}: not contiguous")
        entries.append(BucketEntry(bucket, end + position, length, records, bucket_crc))
        expected += length
    if expected != end + body or not from_offset < to_offset or due_min > due_max:
        raise CorruptSnapshotError("head fields disagree")
    return SnapshotHead(
        from_offset, to_offset, due_min, due_max, count, tuple(entries), end, end + body
    )


def check_bucket(entry: BucketEntry, data: bytes) -> bytes:
    """``data`` (read at ``entry``) if whole and intact; CorruptSnapshotError otherwise."""
    if len(data) != entry.length or crc32c(data) != entry.crc:
        raise CorruptSnapshotError(f"bucket {entry.bucket}: {len(data)} bytes, crc mismatch")
    return data


def records(data: bytes | bytearray) -> Iterator[tuple[int, int, int, bytes]]:
    """``(due_ms, slot, offset, frame)`` of each record in a bucket's bytes."""
    view, at, end, size = memoryview(data), 0, len(data), RECORD.size
    unpack = RECORD.unpack_from
    while at < end:
        due, slot, offset, length = unpack(view, at)
        at += size
        yield due, slot, offset, bytes(view[at : at + length])
        at += length


def _unpack_head(data: bytes) -> tuple[bytes, int, int, int, int, int, int, int, int, int]:
    if len(data) < HEAD_BYTES:
        raise CorruptSnapshotError(f"{len(data)} bytes: shorter than a head")
    fields: tuple[bytes, int, int, int, int, int, int, int, int, int] = _HEAD.unpack_from(data, 0)
    if fields[0] != MAGIC or fields[1] != VERSION:
        raise CorruptSnapshotError(f"not a version {VERSION} delay snapshot")
    if fields[8] > BUCKETS_MAX or fields[9] > SNAPSHOT_BYTES_MAX:
        raise CorruptSnapshotError("head claims too much")
    return fields
