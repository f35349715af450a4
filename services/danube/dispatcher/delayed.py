"""Delayed messages of one subscription (shared and key-shared): held out of the delivery
machine until due, in a compact index whose memory is bounded, and recoverable from the
log after a restart. Pure: time is passed in, and the only I/O is the injected
:class:`Spill` (a file per bucket in the runtime; a dict in tests).

**The index.** Each message is one packed record (``_RECORD``: due time, partition slot,
offset, frame length) followed by its frame as read, appended to the byte buffer of its
*bucket* (``due_ms // BUCKET_MS``). No Python object per message: per bucket a bytearray
and four integers. When the buffers pass ``memory_bytes_max`` the farthest buckets are
appended to the spill and dropped from memory (the nearest two never are: they are about
to be read). A bucket falling due is read whole (its buffer and what was spilled of it),
sorted by due time, and becomes the *near* list, the only per-message objects held; due
messages are taken from its head.

**Why the frame is kept** rather than only ``(due, offset)``: messages falling due in one
second are spread over the whole log (random delays), so reading them again would be one
fetch per message. A local copy turns that into one sequential read per bucket.

**Recovery.** The spill is a node-local cache; the log is the truth. A delayed message is
acknowledged in its partition's cursor when it is read (so it never holds the cursor's
contiguous point back, and out-of-order acks never pile up behind it), and the cursor's
stored state carries, per partition, where to read again to find the delayed messages not
acked yet (``delay_from``: a lower bound of their offsets, to the block of
``OFFSET_BLOCK`` offsets) and a lower bound of their due times (``delay_due_ms``). A
dispatcher resuming the subscription reads ``[delay_from, next_offset)`` once more and
files every delayed message due at or after ``delay_due_ms`` again (:meth:`rescan`).
Messages acked meanwhile with a due time at or after that bound come again (at-least-once):
those acked while an earlier-due one was still unacked, which with prompt acks is the last
ack round trip's worth.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from danube.dispatcher.spill import FileSpill, MemorySpill, Spill
from danube.frame import (
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
    SEQUENCED_HEADER_BYTES,
    SEQUENCED_RECORD_VERSION,
    RawFrame,
)
from danube.frame.errors import FrameError
from danube.frame.record import read_attributes
from danube.wire.delay import deliver_at_ms

__all__ = ["DelayedMessages", "Due", "FileSpill", "MemorySpill", "Spill", "due_of"]

# One delayed message in a bucket, then its frame (``length`` bytes):
#   due_ms i64 | slot u32 (the partition, see DelayedMessages.slot) | offset u64 | length u32
_RECORD = struct.Struct("<qIQI")
BUCKET_MS = 1000
# The stored lower bound of the offsets still delayed is rounded down to this many offsets:
# one counter per block of the log, not per message.
OFFSET_BLOCK = 4096
MEMORY_BYTES_MAX = 8 << 20  # per subscription, buffers not yet spilled
_SPILL_KEEP_NEAR = 2  # buckets from the earliest one never spilled (read next)
# A spilled bucket is read ahead (off the event loop) this long before it falls due.
PREFETCH_MS = 2000
_NAME_PART = b"danube.deliver_"


def due_of(payload: object) -> int | None:
    """When the record in ``payload`` (a frame as read) is due, Unix ms; None when it is
    not delayed. The usual record (no such attribute) costs the header alone (~1 µs)."""
    record = payload.record if isinstance(payload, RawFrame) else payload
    if not isinstance(record, bytes | bytearray | memoryview):
        return None
    view = memoryview(record)
    try:
        version, _, time_ms, _, _, producer_len, key_len, count, payload_len = (
            RECORD_HEADER.unpack_from(view, 0)
        )
        if not count:
            return None
        start = (
            SEQUENCED_HEADER_BYTES if version == SEQUENCED_RECORD_VERSION else RECORD_HEADER_BYTES
        )
        at = start + producer_len + key_len
        if _NAME_PART not in bytes(view[at : len(view) - payload_len]):
            return None
        attributes: dict[str, str] = {}
        read_attributes(view, at, len(view), count, attributes)
    except (FrameError, ValueError, IndexError, struct.error):
        return None
    return deliver_at_ms(attributes, int(time_ms))


@dataclass(slots=True)
class _Bucket:
    buffer: bytearray
    count: int = 0
    spilled: bool = False


@dataclass(frozen=True, slots=True)
class Due:
    """A delayed message that fell due: where it is, and its frame as read."""

    due_ms: int
    partition: str
    offset: int
    frame: RawFrame


@dataclass(slots=True)
class _Rescan:
    position: int  # the next offset to read again
    end: int  # the stored cursor's next_offset: read from there on as usual
    due_min_ms: int  # files again only what is due at or after this


class DelayedMessages:
    """The delayed messages of one subscription, from read to ack (module docstring)."""

    def __init__(
        self, spill: Spill | None = None, *, memory_bytes_max: int = MEMORY_BYTES_MAX
    ) -> None:
        self.spill: Spill = spill or MemorySpill()
        self.memory_bytes_max = memory_bytes_max
        self._buckets: dict[int, _Bucket] = {}
        self._bucket_keys: list[int] = []  # a heap of the keys in _buckets
        self._near: list[tuple[int, int, int, bytes]] = []  # a heap: due, slot, offset, frame
        self._memory_bytes = 0
        # Spill once memory passes this: the bound, or more while the nearest buckets alone
        # hold over half of it (they are never spilled), so each spill moves a good share
        # of the bound rather than one message at a time.
        self._spill_at = memory_bytes_max
        # Partition slots: a seek gives its partition a new slot, so what was filed under
        # the old one is dropped as it falls due (no search through the buckets).
        self._names: list[str | None] = []
        self._slot_of: dict[str, int] = {}
        # Per partition: delayed messages not acked (filed, or out for delivery) per block
        # of OFFSET_BLOCK offsets, for delay_from.
        self._blocks: dict[str, dict[int, int]] = {}
        # Out for delivery (handed to the machine), not acked: their due times, and a heap
        # of (due, partition, offset) with stale items left behind (lazy deletion).
        self._out: dict[tuple[str, int], int] = {}
        self._out_heap: list[tuple[int, str, int]] = []
        self._rescans: dict[str, _Rescan] = {}
        self._restored_due_ms: int | None = None  # the stored bound until rescans end
        self.filed = 0  # held in the index (not yet due), over every partition
        self.spilled_bytes = 0  # written to the spill since start

    # --- reading ---------------------------------------------------------------------------

    def slot(self, partition: str) -> int:
        """The slot ``partition``'s messages are filed under."""
        slot = self._slot_of.get(partition)
        if slot is None:
            slot = self._slot_of[partition] = len(self._names)
            self._names.append(partition)
        return slot

    def file(self, partition: str, offset: int, due_ms: int, frame: RawFrame) -> None:
        """Hold the message at ``partition@offset`` until ``due_ms``."""
        data = frame.data
        record = _RECORD.pack(due_ms, self.slot(partition), offset, len(data))
        key = due_ms // BUCKET_MS
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(bytearray())
            heapq.heappush(self._bucket_keys, key)
        bucket.buffer += record
        bucket.buffer += data
        bucket.count += 1
        self.filed += 1
        self._memory_bytes += len(record) + len(data)
        blocks = self._blocks.setdefault(partition, {})
        block = offset // OFFSET_BLOCK
        blocks[block] = blocks.get(block, 0) + 1
        if self._memory_bytes > self._spill_at:
            self._spill_farthest()

    def rescanning(self, partition: str) -> int | None:
        """Where ``partition`` is read again from (None: not being read again)."""
        rescan = self._rescans.get(partition)
        return None if rescan is None else rescan.position

    def rescan(self, partition: str, messages: list[tuple[int, object]], next_offset: int) -> int:
        """A read of ``partition`` again (from :meth:`rescanning`): file its delayed messages
        below the rescan's end and due at or after the stored bound. Returns the offset
        the rescan stopped at (the messages from there on are a usual read)."""
        rescan = self._rescans[partition]
        end = rescan.end
        for offset, payload in messages:
            if offset >= end:
                break
            if offset < rescan.position:
                continue
            due = due_of(payload)
            if due is not None and due >= rescan.due_min_ms and isinstance(payload, RawFrame):
                self.file(partition, offset, due, RawFrame(offset, memoryview(bytes(payload.data))))
        rescan.position = max(rescan.position, min(next_offset, end))
        if rescan.position >= end:
            del self._rescans[partition]
            if not self._rescans:
                self._restored_due_ms = None
        return rescan.position

    def resume(self, partition: str, delay_from: int | None, due_ms: int | None, end: int) -> None:
        """``partition`` was stored with delayed messages from ``delay_from`` (due at or after
        ``due_ms``) below ``end`` (its next offset): read them again before reading on."""
        if delay_from is None or delay_from >= end:
            return
        bound = 0 if due_ms is None else due_ms
        self._rescans[partition] = _Rescan(delay_from, end, bound)
        restored = self._restored_due_ms
        self._restored_due_ms = bound if restored is None else min(restored, bound)

    # --- falling due -----------------------------------------------------------------------

    def next_due_ms(self) -> int | None:
        """The earliest due time held (to the bucket for what is not near yet)."""
        near = self._near[0][0] if self._near else None
        keys = self._bucket_keys
        while keys and keys[0] not in self._buckets:
            heapq.heappop(keys)
        far = keys[0] * BUCKET_MS if keys else None
        if near is None or far is None:
            return near if far is None else far
        return min(near, far)

    def take_due(self, now_ms: int, count_max: int) -> list[Due]:
        """Up to ``count_max`` messages due at ``now_ms``, earliest first: out for delivery
        (:meth:`done` when acked, dead-lettered or expired)."""
        self._load_due(now_ms)
        near, names = self._near, self._names
        found: list[Due] = []
        while near and near[0][0] <= now_ms and len(found) < count_max:
            due, slot, offset, frame = heapq.heappop(near)
            self.filed -= 1
            name = names[slot]
            if name is None:
                continue  # filed before a seek of its partition
            self._out[(name, offset)] = due
            heapq.heappush(self._out_heap, (due, name, offset))
            found.append(Due(due, name, offset, RawFrame(offset, memoryview(frame))))
        return found

    def _load_due(self, now_ms: int) -> None:
        keys, buckets = self._bucket_keys, self._buckets
        # The three nearest buckets lie among a heap's first seven items: those spilled and
        # due soon are read ahead, so taking them later waits for nothing.
        for key in sorted(keys[:7])[:3]:
            bucket = buckets.get(key)
            if bucket is not None and bucket.spilled and key * BUCKET_MS <= now_ms + PREFETCH_MS:
                self.spill.prefetch(key)
        while keys and keys[0] * BUCKET_MS <= now_ms:
            key = heapq.heappop(keys)
            bucket = buckets.pop(key, None)
            if bucket is None:
                continue
            data = self.spill.take(key) if bucket.spilled else b""
            self._memory_bytes -= len(bucket.buffer)
            self._spill_at = max(
                self.memory_bytes_max,
                min(self._spill_at, self._memory_bytes + self.memory_bytes_max // 2),
            )
            for item in _records(data):
                heapq.heappush(self._near, item)
            for item in _records(bytes(bucket.buffer)):
                heapq.heappush(self._near, item)

    def _spill_farthest(self) -> None:
        """Move the farthest buckets' buffers to the spill until half the budget is used
        (or only the nearest are left in memory)."""
        keys = sorted(self._buckets)
        keep = set(keys[:_SPILL_KEEP_NEAR])
        half = self.memory_bytes_max // 2
        self._spill_at = self._memory_bytes + half  # if the nearest alone stay over half
        for key in reversed(keys):
            if self._memory_bytes <= half:
                break
            bucket = self._buckets[key]
            if key in keep or not bucket.buffer:
                continue
            self.spill.append(key, bytes(bucket.buffer))
            self.spilled_bytes += len(bucket.buffer)
            self._memory_bytes -= len(bucket.buffer)
            bucket.buffer = bytearray()
            bucket.spilled = True
        self._spill_at = max(self.memory_bytes_max, min(self._spill_at, self._memory_bytes + half))

    # --- acks ------------------------------------------------------------------------------

    def done(self, partition: str, offset: int) -> None:
        """The message out for delivery at ``partition@offset`` is acked (or dead-lettered,
        expired): no restart delivers it again."""
        if self._out.pop((partition, offset), None) is None:
            return
        if len(self._out_heap) > 2 * len(self._out) + 1024:
            # Mostly stale items (one message out for long keeps those behind it): rebuilt,
            # so the heap stays within twice what is out.
            self._out_heap = [(due, name, at) for (name, at), due in self._out.items()]
            heapq.heapify(self._out_heap)
        blocks = self._blocks.get(partition)
        if blocks is None:
            return
        block = offset // OFFSET_BLOCK
        left = blocks.get(block, 0) - 1
        if left > 0:
            blocks[block] = left
        else:
            blocks.pop(block, None)

    def drop_partition(self, partition: str) -> None:
        """A seek of ``partition``: forget its delayed messages (a new slot from now on)."""
        slot = self._slot_of.pop(partition, None)
        if slot is not None:
            self._names[slot] = None
        self._blocks.pop(partition, None)
        self._rescans.pop(partition, None)
        for ref in [ref for ref in self._out if ref[0] == partition]:
            del self._out[ref]

    def clear(self) -> None:
        """Forget everything, the spill included (the subscription stops here)."""
        self.spill.clear()
        self._buckets.clear()
        self._near.clear()

    # --- what is stored --------------------------------------------------------------------

    def delay_from(self, partition: str, read_position: int) -> int | None:
        """A lower bound of the offsets of ``partition``'s delayed messages not acked
        (None: none below ``read_position``)."""
        rescan = self._rescans.get(partition)
        blocks = self._blocks.get(partition)
        found = min(blocks) * OFFSET_BLOCK if blocks else None
        if rescan is not None:
            found = rescan.position if found is None else min(found, rescan.position)
        if found is None or found >= read_position:
            return None
        return found

    def due_floor_ms(self) -> int | None:
        """A lower bound of the due times of the delayed messages not acked (None: none)."""
        out = self._out_heap
        while out and self._out.get((out[0][1], out[0][2])) != out[0][0]:
            heapq.heappop(out)
        candidates = [m for m in (self.next_due_ms(), self._restored_due_ms) if m is not None]
        if out:
            candidates.append(out[0][0])
        return min(candidates) if candidates else None

    @property
    def held(self) -> int:
        """Delayed messages not acked: filed, and out for delivery."""
        return self.filed + len(self._out)

    @property
    def memory_bytes(self) -> int:
        """Bytes of buffers held in memory (the near list not counted: one bucket)."""
        return self._memory_bytes


def _records(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    view, at, end, size = memoryview(data), 0, len(data), _RECORD.size
    unpack = _RECORD.unpack_from
    while at < end:
        due, slot, offset, length = unpack(view, at)
        at += size
        yield due, slot, offset, bytes(view[at : at + length])
        at += length
