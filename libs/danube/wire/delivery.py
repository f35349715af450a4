"""The delivery batch: many messages of one subscription in one body, each as the frame the
WAL holds (``[u64 offset][u32 len][u32 crc32c][record]``, danube.frame), carried unchanged
from the WAL (or object) read to whoever decodes the record.

It is both the dispatcher's poll reply (partitions named by their topic segment) and the
binary delivery of the HTTP API (``Accept: application/x-danube-frames`` on a long poll, the
``danube.frames.v1`` WebSocket subprotocol; partitions by full name, docs/http-api.md). All
integers little-endian::

    byte  size  field
    0     1     version      u8   1
    1     2     partitions   u16  P, then P x ([u16 size][size bytes: UTF-8 partition name])
    .     4     count        u32  N, then N x ([u16 partition index][u32 redelivery_count])
    .     ...   N frames, in the same order: 16-byte header, then the record

Nothing here checks a CRC: a hop splits frames by their headers (:func:`decode_batch`), and
the decoder of a record checks its frame first (:meth:`DeliveredMessage.record`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from danube.errors import DanubeError
from danube.frame import (
    FRAME_HEADER,
    FRAME_HEADER_BYTES,
    MAX_FRAME_PAYLOAD_BYTES,
    verify_frame,
    walk_frames,
)

MEDIA_TYPE = "application/x-danube-frames"
"""The media type of a delivery batch (HTTP ``Accept`` / ``Content-Type``)."""
SUBPROTOCOL = "danube.frames.v1"
"""The WebSocket subprotocol whose message frames are delivery batches (binary)."""

TTL_ATTRIBUTE = "danube.ttl_ms"
"""The record attribute that gives one message its own time to live, in whole milliseconds
(1 … ``TTL_MS_MAX``) from its publish time; it wins over the topic's ``message_ttl_s``
policy. A dispatcher never delivers the message past it (docs/policies.md, "Message TTL")."""
TTL_MS_MAX = 10 * 365 * 86_400_000  # ten years, as the message_ttl_s policy's bound

VERSION = 1
_HEAD = struct.Struct("<BH")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_ENTRY = struct.Struct("<HI")  # partition index, redelivery count
ENTRY_BYTES = _ENTRY.size
# A frame's length field (danube.frame): after its u64 offset.
_FRAME_LENGTH = struct.Struct("<" + FRAME_HEADER.format[2])
_FRAME_LENGTH_AT = struct.calcsize(FRAME_HEADER.format[:2])
PARTITIONS_MAX = 0xFFFF
NAME_BYTES_MAX = 1024


class BatchFormatError(DanubeError):
    """A delivery batch that does not follow its layout."""

    code = "bad_batch"


@dataclass(frozen=True, slots=True)
class DeliveredMessage:
    """One message of a batch: ``frame`` is the whole frame (header included) as read from
    the WAL or an object, a view of the batch (or reply) it came in."""

    partition: str
    offset: int
    redelivery_count: int
    frame: bytes | memoryview

    @property
    def record(self) -> memoryview:
        """The record bytes, once the frame's CRC checks (CorruptFrameError if not)."""
        return verify_frame(self.frame)

    @property
    def record_bytes(self) -> int:
        """The record's size, without checking it."""
        return len(self.frame) - FRAME_HEADER_BYTES


def encode_batch(messages: Sequence[DeliveredMessage]) -> bytes:
    """One batch of ``messages`` (frames as they are: one copy, into the body)."""
    return encode_columns(
        [m.partition for m in messages],
        [m.redelivery_count for m in messages],
        [m.frame for m in messages],
    )


def encode_columns(
    partitions: Sequence[str],
    redelivery_counts: Sequence[int],
    frames: Sequence[bytes | memoryview],
) -> bytes:
    """One batch whose message ``i`` is ``frames[i]`` (a whole frame, header included) of
    ``partitions[i]``, delivered ``redelivery_counts[i]`` times before: the same body as
    :func:`encode_batch` without an object per message, for the dispatcher's poll reply."""
    if not len(partitions) == len(redelivery_counts) == len(frames):
        raise ValueError("a batch's columns differ in length")
    index: dict[str, int] = {}
    # setdefault's default is read before the insert: a new name gets the next index.
    indexes = [index.setdefault(name, len(index)) for name in partitions]
    if len(index) > PARTITIONS_MAX:
        raise BatchFormatError(f"{len(index)} partitions in one batch")
    parts: list[bytes | memoryview] = [_HEAD.pack(VERSION, len(index))]
    for name in index:
        raw = name.encode()
        parts += (_U16.pack(len(raw)), raw)
    parts.append(_U32.pack(len(indexes)))
    parts.append(b"".join(map(_ENTRY.pack, indexes, redelivery_counts)))
    parts += frames
    return b"".join(parts)


def _table(view: memoryview) -> tuple[list[str], int]:
    """The partition names and the position after them."""
    if len(view) < _HEAD.size:
        raise BatchFormatError(f"delivery batch of {len(view)} bytes")
    version, count = _HEAD.unpack_from(view, 0)
    if version != VERSION:
        raise BatchFormatError(f"delivery batch version {version}, expected {VERSION}")
    names: list[str] = []
    pos = _HEAD.size
    for _ in range(count):
        if pos + _U16.size > len(view):
            raise BatchFormatError("delivery batch: partition table runs past the body")
        (size,) = _U16.unpack_from(view, pos)
        pos += _U16.size
        if size > NAME_BYTES_MAX or pos + size > len(view):
            raise BatchFormatError("delivery batch: bad partition name")
        names.append(bytes(view[pos : pos + size]).decode(errors="strict"))
        pos += size
    return names, pos


class BatchHead(NamedTuple):
    """A batch's layout before its frames: the partition names, the message count, where
    the entries start and where the frames start (positions in ``view``)."""

    view: memoryview
    names: list[str]
    message_count: int
    entries_at: int
    frames_at: int


def read_head(body: bytes | memoryview) -> BatchHead:
    """The head of a batch (table, count, entries within the body); BatchFormatError when
    it is off. The frames are not looked at."""
    view = memoryview(body).cast("B")
    try:
        names, pos = _table(view)
    except UnicodeDecodeError as exc:
        raise BatchFormatError(f"delivery batch: {exc}") from exc
    if pos + _U32.size > len(view):
        raise BatchFormatError("delivery batch: no count")
    (count,) = _U32.unpack_from(view, pos)
    pos += _U32.size
    frames_at = pos + count * _ENTRY.size
    if frames_at > len(view):
        raise BatchFormatError(f"delivery batch: {count} entries run past the body")
    return BatchHead(view, names, count, pos, frames_at)


def check_entries(head: BatchHead) -> None:
    """BatchFormatError when an entry names a partition the table does not hold."""
    entries = head.view[head.entries_at : head.frames_at]
    if head.message_count and max(index for index, _ in _ENTRY.iter_unpack(entries)) >= len(
        head.names
    ):
        raise BatchFormatError(f"delivery batch: a partition index past {len(head.names)}")


def batch_size(body: bytes | memoryview) -> int:
    """How many messages a batch holds, its layout checked as :func:`decode_batch` checks it
    (entries, every frame whole, as many frames as entries, nothing after them) without a
    message built per frame: for a hop that passes the batch on as it is."""
    head = read_head(body)
    check_entries(head)
    view, pos, end = head.view, head.frames_at, len(head.view)
    unpack = _FRAME_LENGTH.unpack_from
    for _ in range(head.message_count):
        if end - pos < FRAME_HEADER_BYTES:
            raise BatchFormatError(
                f"delivery batch: {head.message_count} entries, fewer whole frames"
            )
        (length,) = unpack(view, pos + _FRAME_LENGTH_AT)
        if length > MAX_FRAME_PAYLOAD_BYTES:
            raise BatchFormatError(f"delivery batch: a frame of {length} bytes")
        pos += FRAME_HEADER_BYTES + length
    if pos != end:
        raise BatchFormatError(
            f"delivery batch: {head.message_count} entries, not as many whole frames"
        )
    return head.message_count


def decode_batch(body: bytes | memoryview) -> list[DeliveredMessage]:
    """The messages of a batch, frames split by their headers (views of ``body``, not
    checked); BatchFormatError when the layout is off."""
    view, names, count, pos, frames_at = read_head(body)
    try:
        frames, end = walk_frames(view, frames_at)
    except DanubeError as exc:
        raise BatchFormatError(f"delivery batch: {exc}") from exc
    if len(frames) != count or end != len(view):
        raise BatchFormatError(f"delivery batch: {count} entries, {len(frames)} whole frames")
    out: list[DeliveredMessage] = []
    for at, frame in zip(_ENTRY.iter_unpack(view[pos:frames_at]), frames, strict=True):
        index, redelivery_count = at
        if index >= len(names):
            raise BatchFormatError(f"delivery batch: partition index {index} of {len(names)}")
        out.append(DeliveredMessage(names[index], frame.offset, redelivery_count, frame.data))
    return out


def rename_partitions(body: bytes | memoryview, rename: Callable[[str], str]) -> bytes:
    """The batch with every partition name replaced by ``rename(name)``; the entries and the
    frames are carried as they are (one copy, into the new body)."""
    view = memoryview(body).cast("B")
    names, pos = _table(view)
    parts: list[bytes | memoryview] = [_HEAD.pack(VERSION, len(names))]
    for name in names:
        raw = rename(name).encode()
        if len(raw) > NAME_BYTES_MAX:
            raise BatchFormatError(f"partition name of {len(raw)} bytes")
        parts += (_U16.pack(len(raw)), raw)
    parts.append(view[pos:])
    return b"".join(parts)
