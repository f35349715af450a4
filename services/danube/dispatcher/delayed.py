"""Delayed messages of one subscription (shared and key-shared): held out of the delivery
machine until due, in a compact index whose memory is bounded, and recoverable from the
log after a restart. Pure: time is passed in, and the only I/O is the injected
:class:`Spill` (a file per bucket in the runtime; a dict in tests).

**The index.** Each message is one packed record (``_RECORD``: due time, partition slot,
offset, frame length) followed by its frame as read, appended to the byte buffer of its
*bucket* (``due_ms // BUCKET_MS``). No Python object per message: per bucket a bytearray
and four integers. When the buffers pass ``memory_bytes_max`` the farthest buckets are
appended to the spill and dropped from memory (the nearest two never are: they are about
to be read). The next bucket is read (its buffer and what was spilled of it) into the
*near* heap, ordered by due time, a slice at a time from ``LOAD_AHEAD_MS`` before it falls
due (whatever is left of it at once when it does): the near heap holds the only per-message
objects, and due messages are taken from its head.

**Why the frame is kept** rather than only ``(due, offset)``: messages falling due in one
second are spread over the whole log (random delays), so reading them again would be one
fetch per message. A local copy turns that into one sequential read per bucket.

**Recovery.** The spill is a node-local cache; the log is the truth. A delayed message is
acknowledged in its partition's cursor when it is read (so it never holds the cursor's
contiguous point back, and out-of-order acks never pile up behind it), and the cursor's
stored state carries, per partition, where to find again the delayed messages not acked yet
(``delay_from``: a lower bound of their offsets, to the block of ``OFFSET_BLOCK`` offsets)
and a lower bound of their due times (``delay_due_ms``). A dispatcher resuming the
subscription files every delayed message of ``[delay_from, end)`` due at or after
``delay_due_ms`` again (``end``: past the cursor's highest out-of-order ack, where a delayed
message read above the contiguous point lies; else ``next_offset``): those the sealed
snapshots stored with the cursor hold are loaded bucket by bucket as they fall due
(danube.dispatcher.sealed, loads.py), the rest is read from the log again (rescans.py).
Messages acked meanwhile with a due time at or after that bound come again (at-least-once):
those acked while an earlier-due one was still unacked, which with prompt acks is the last
ack round trip's worth.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from danube.dispatcher.loads import SnapshotLoads
from danube.dispatcher.rescans import Rescan, Rescans
from danube.dispatcher.sealed import Chains, Part, ResumePlan, Sealed
from danube.dispatcher.snapshot import RECORD, SnapshotHead, records
from danube.dispatcher.spill import FileSpill, MemorySpill, Spill
from danube.frame import RawFrame
from danube.meta.records import DelaySnapshotRef

__all__ = ["DelayedMessages", "Due", "FileSpill", "MemorySpill", "Spill"]

# One delayed message in a bucket is a RECORD (danube.dispatcher.snapshot: due, the
# partition's slot (DelayedMessages.slot), offset, length), then its frame.
BUCKET_MS = 1000
# The stored lower bound of the offsets still delayed is rounded down to this many offsets:
# one counter per block of the log, not per message.
OFFSET_BLOCK = 4096
MEMORY_BYTES_MAX = 8 << 20  # per subscription, buffers not yet spilled
_SPILL_KEEP_NEAR = 2  # buckets from the earliest one never spilled (read next)
# A spilled bucket is read ahead (off the event loop) this long before it falls due.
PREFETCH_MS = 2000
# The next bucket is moved into the near list this long before it falls due, at most
# LOAD_SLICE records per step: a second's worth of messages (8 000 at 1 000 000 over two
# minutes) was moved in one step when due, holding the loop ~7-28 ms while its first
# messages were due.
LOAD_AHEAD_MS = 250
LOAD_SLICE = 512
_OFFSET_ANY = 2**64  # above every offset: delay_from's bound when none is wanted


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
        # The bucket being moved into _near ahead of its time (LOAD_AHEAD_MS): its key and
        # the records not moved yet.
        self._ahead_key: int | None = None
        self._ahead: Iterator[tuple[int, int, int, bytes]] = iter(())
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
        self._rescans = Rescans(BUCKET_MS)  # ranges read from the log again (rescans.py)
        # Snapshots (danube.dispatcher.sealed): sealing is on once the runtime has somewhere
        # to write them (sealing); per partition the buffer of the next seal and the chain
        # of those written; the parts of snapshots to load after a resume (loads.py).
        self.sealing = False
        self._chains = Chains()
        self._loads = SnapshotLoads()
        self.filed = 0  # held in the index (not yet due), over every partition
        self.spilled_bytes = 0  # written to the spill since start
        self.loaded_records = 0  # delayed messages taken from snapshots since start

    # --- reading ---------------------------------------------------------------------------

    def slot(self, partition: str) -> int:
        """The slot ``partition``'s messages are filed under."""
        slot = self._slot_of.get(partition)
        if slot is None:
            slot = self._slot_of[partition] = len(self._names)
            self._names.append(partition)
        return slot

    def file(
        self, partition: str, offset: int, due_ms: int, frame: RawFrame, *, sealed: bool = True
    ) -> None:
        """Hold the message at ``partition@offset`` until ``due_ms``; ``sealed``: it was read
        by the usual reader, in offset order (it goes into the next snapshot as well)."""
        data = frame.data
        record = RECORD.pack(due_ms, self.slot(partition), offset, len(data))
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
        if sealed and self.sealing:
            self._chains.add(partition, key, due_ms, offset, data)
        if self._memory_bytes > self._spill_at:
            self._spill_farthest()

    def rescanning(self, partition: str) -> int | None:
        """Where ``partition`` is read again from (None: not being read again)."""
        return self._rescans.position(partition)

    def rescan(self, partition: str, messages: list[tuple[int, object]], next_offset: int) -> int:
        """A read of ``partition`` again (from :meth:`rescanning`): file its delayed messages
        in the range read again and due at or after its bound. Returns where the next read
        again starts (or the offset the last range stopped at)."""
        found, position = self._rescans.read(partition, messages, next_offset)
        for offset, due, frame in found:
            self.file(partition, offset, due, frame, sealed=False)
        return position

    def resume_from(
        self,
        partition: str,
        plan: ResumePlan,
        heads: Mapping[str, SnapshotHead],
        due_ms: int | None,
    ) -> None:
        """``partition`` resumes by ``plan`` (danube.dispatcher.sealed.plan_resume): its
        snapshots whose head was read whole (``heads``, by key) are loaded as they fall
        due, the rest of its range is read from the log again."""
        bound = 0 if due_ms is None else due_ms
        self._chains.dropped.extend(plan.garbage)
        ranges = list(plan.reread)
        for ref in plan.load:
            head = heads.get(ref.key)
            if head is None or head.size_bytes != ref.size_bytes:
                ranges.append((ref.from_offset, ref.to_offset))  # missing or torn: the log
                self._chains.dropped.append(ref)
            else:
                self._add_snapshot(partition, ref, head, bound)
        self._rescans.add(partition, [Rescan(start, end, bound) for start, end in ranges])

    # --- snapshots -------------------------------------------------------------------------

    def start_sealing(self, partition: str, from_offset: int) -> None:
        """Seal what the usual reader files in ``partition`` from ``from_offset`` on."""
        if self.sealing:
            self._chains.start(partition, from_offset)

    def seal(self, partition: str, to_offset: int) -> Sealed | None:
        """The next snapshot of ``partition``, up to ``to_offset`` (its read position: every
        delayed message below it is filed); None when there is nothing to write."""
        slot = self._slot_of.get(partition)
        return None if slot is None else self._chains.seal(partition, to_offset, slot)

    def sealed(self, sealed: Sealed, ref: DelaySnapshotRef) -> bool:
        """``sealed`` is written whole as ``ref``: stored from now on with its partition's
        cursor. False (the caller deletes it) when the chain is full or the partition was
        sought meanwhile (what it holds was read before the seek)."""
        if self._slot_of.get(sealed.partition) != sealed.slot:
            return False
        return self._chains.written(sealed.partition, ref)

    def chain(self, partition: str) -> tuple[DelaySnapshotRef, ...]:
        """The snapshots holding ``partition``'s delayed messages, in offset order."""
        return self._chains.chain(partition)

    def collect_garbage(self) -> list[DelaySnapshotRef]:
        """The snapshots that hold nothing delayed any more, out of their chains now (and
        those dropped since the last call): their objects are to be deleted."""
        return self._chains.collect(lambda p: self.delay_from(p, _OFFSET_ANY), self.due_floor_ms())

    def _add_snapshot(
        self, partition: str, ref: DelaySnapshotRef, head: SnapshotHead, bound: int
    ) -> None:
        for key, count in self._loads.add(
            partition, self.slot(partition), ref, head, bound
        ).items():
            if key not in self._buckets:
                self._buckets[key] = _Bucket(bytearray())
                heapq.heappush(self._bucket_keys, key)
            self.filed += count  # to the records kept, once merged
        self._chains.keep(partition, ref)

    def wanted(self, now_ms: int) -> list[Part]:
        """The snapshot parts to load now: those of buckets due by ``now_ms`` plus
        PREFETCH_MS, earliest first, each asked for once."""
        return self._loads.wanted(now_ms + PREFETCH_MS)

    def loaded(self, part: Part, data: bytes) -> None:
        """``part``'s bytes, read and checked: its bucket is taken once all its parts are."""
        self._loads.loaded(part, data)

    def failed(self, part: Part) -> None:
        """``part`` could not be read whole: its snapshot's parts not merged yet are
        dropped, and read from the log again instead (only their buckets)."""
        dropped = self._loads.failed(part)
        if dropped is None:
            return
        self.filed -= dropped.count
        if self._names[part.slot] is None:
            return  # its partition was sought meanwhile
        name = dropped.partition
        self._chains.remove(name, part.key)
        self._rescans.add(
            name,
            [Rescan(dropped.from_offset, dropped.to_offset, dropped.due_min_ms, dropped.buckets)],
        )

    def _merge(self, part: Part) -> None:
        """A loaded part of a bucket falling due: its records kept join the near list."""
        name, kept = self._names[part.slot], 0
        if name is not None and part.data is not None:
            blocks = self._blocks.setdefault(name, {})
            low, high, bound = part.from_offset, part.to_offset, part.due_min_ms
            for due, _, offset, frame in records(part.data):
                if low <= offset < high and due >= bound:
                    heapq.heappush(self._near, (due, part.slot, offset, frame))
                    block = offset // OFFSET_BLOCK
                    blocks[block] = blocks.get(block, 0) + 1
                    kept += 1
        self.filed -= part.entry.count - kept
        self.loaded_records += kept

    # --- falling due -----------------------------------------------------------------------

    def next_due_ms(self) -> int | None:
        """When to step next: the earliest due time near, or LOAD_AHEAD_MS before the
        earliest bucket not near yet falls due (buckets waiting for a snapshot's load aside:
        the load's end says when), or at once while a bucket is being moved near."""
        if self._ahead_key is not None:
            return self._ahead_key * BUCKET_MS - LOAD_AHEAD_MS
        near = self._near[0][0] if self._near else None
        far = self._earliest_bucket_ms(skip_waiting=True)
        if far is not None and far == self._earliest_bucket_ms(skip_waiting=False):
            far -= LOAD_AHEAD_MS  # the earliest bucket, ready: moved near ahead of its time
        if near is None or far is None:
            return near if far is None else far
        return min(near, far)

    def _earliest_bucket_ms(self, *, skip_waiting: bool) -> int | None:
        keys, buckets = self._bucket_keys, self._buckets
        while keys and keys[0] not in buckets:
            heapq.heappop(keys)
        if not keys:
            return None
        if not skip_waiting or not self._loads.waiting(keys[0]):
            return keys[0] * BUCKET_MS
        ready = self._loads.ready([key for key in keys if key in buckets])
        return min(ready) * BUCKET_MS if ready else None

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
        ahead = self._ahead_key
        if ahead is not None and ahead * BUCKET_MS <= now_ms:
            self._move_near(None)  # due: the rest of it at once
        waiting: list[int] = []  # due, but a snapshot's part of it is not loaded yet
        while keys and keys[0] * BUCKET_MS <= now_ms:
            key = heapq.heappop(keys)
            bucket = buckets.get(key)
            if bucket is None:
                continue
            if self._loads.waiting(key):
                waiting.append(key)
                continue
            self._start_moving(key, bucket)
            self._move_near(None)
        for key in waiting:
            heapq.heappush(keys, key)
        if waiting:
            return
        # Not due yet: the next bucket a slice at a time, so none is moved in one step.
        if self._ahead_key is None:
            while keys and keys[0] not in buckets:
                heapq.heappop(keys)
            if not keys or keys[0] * BUCKET_MS > now_ms + LOAD_AHEAD_MS:
                return
            if self._loads.waiting(keys[0]):
                return
            key = heapq.heappop(keys)
            self._start_moving(key, buckets[key])
        self._move_near(LOAD_SLICE)

    def _start_moving(self, key: int, bucket: _Bucket) -> None:
        """Take bucket ``key`` out of the buckets (a message filed for it from now on starts
        a new one) to move its records near; a snapshot's parts of it join at once."""
        del self._buckets[key]
        data = self.spill.take(key) if bucket.spilled else b""
        self._memory_bytes -= len(bucket.buffer)
        self._spill_at = max(
            self.memory_bytes_max,
            min(self._spill_at, self._memory_bytes + self.memory_bytes_max // 2),
        )
        self._ahead = itertools.chain(self._ahead, records(data), records(bytes(bucket.buffer)))
        self._ahead_key = key if self._ahead_key is None else min(key, self._ahead_key)
        for part in self._loads.take(key):
            self._merge(part)

    def _move_near(self, count_max: int | None) -> None:
        """Move up to ``count_max`` (None: all) records of the bucket being moved near."""
        near, moved = self._near, 0
        for item in itertools.islice(self._ahead, count_max):
            heapq.heappush(near, item)
            moved += 1
        if count_max is None or moved < count_max:
            self._ahead_key = None
            self._ahead = iter(())

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
        self._rescans.drop(partition)
        self._loads.drop_partition(partition)
        self._chains.drop(partition)
        for ref in [ref for ref in self._out if ref[0] == partition]:
            del self._out[ref]

    def clear(self) -> None:
        """Forget everything, the spill included (the subscription stops here)."""
        self.spill.clear()
        self._buckets.clear()
        self._near.clear()
        self._ahead_key, self._ahead = None, iter(())
        self._chains.clear()

    # --- what is stored --------------------------------------------------------------------

    def delay_from(self, partition: str, read_position: int) -> int | None:
        """A lower bound of the offsets of ``partition``'s delayed messages not acked
        (None: none below ``read_position``)."""
        blocks = self._blocks.get(partition)
        candidates = [min(blocks) * OFFSET_BLOCK] if blocks else []
        rescanning = self._rescans.low_offset(partition)
        if rescanning is not None:
            candidates.append(rescanning)
        loading = self._loads.low_offset(partition)
        if loading is not None:
            candidates.append(loading)
        found = min(candidates, default=None)
        if found is None or found >= read_position:
            return None
        return found

    def due_floor_ms(self) -> int | None:
        """A lower bound of the due times of the delayed messages not acked (None: none)."""
        out = self._out_heap
        while out and self._out.get((out[0][1], out[0][2])) != out[0][0]:
            heapq.heappop(out)
        near = self._near[0][0] if self._near else None
        far = self._earliest_bucket_ms(skip_waiting=False)
        moving = None if self._ahead_key is None else self._ahead_key * BUCKET_MS
        restored = self._rescans.restored_due_ms
        candidates = [m for m in (near, far, moving, restored) if m is not None]
        if out:
            candidates.append(out[0][0])
        return min(candidates) if candidates else None

    @property
    def reread_frames(self) -> int:
        """Frames read from the log again since start (rescans)."""
        return self._rescans.reread_frames

    @property
    def held(self) -> int:
        """Delayed messages not acked: filed, and out for delivery."""
        return self.filed + len(self._out)

    @property
    def memory_bytes(self) -> int:
        """Bytes of buffers held in memory (the near list not counted: one bucket)."""
        return self._memory_bytes
