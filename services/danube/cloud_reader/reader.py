"""Reading a partition's history from its objects: find the object by its descriptor, seek
with the sparse index, range-read in bounded chunks, check every frame.

A read from ``from_offset`` answers frames of ONE object (the one holding ``from_offset``, or
the first one after it when the range before was deleted by retention), starting at
``from_offset``, within the reply's count and byte budget. ``next_offset`` is the offset after
the last frame returned, or after the object's last offset when the object is done, so a
caller that follows ``next_offset`` walks the objects in order without a gap or a duplicate.
No object at or after ``from_offset``: ``NOT_IN_CLOUD`` (read the WAL).

A search by time (:meth:`CloudReader.offset_for_time`) answers the first uploaded offset
whose record was published at or after ``T``: it takes the objects in offset order, skips
those whose descriptor says every record is older (its highest publish time below ``T``),
and scans the first other one frame by frame (checked as a read is); an object whose
descriptor has no publish times (written before they existed) is scanned, and if nothing in
it is recent enough the search goes on with the next. ``T`` past every object: not found,
with the offset after the last object (0 when there is none).

Frames are served whole, as they lie in the object: checked here once (CRC, length, offset;
:meth:`~danube.storage.ObjectScan.whole_frames`), then sent on as they are, header and CRC
included, for whoever decodes their records to check again; nothing frames them anew.

A frame whose CRC, length or offset is wrong is never served: a read answers the good frames
before it; a read that starts at it answers no frame, the
:class:`~danube.storage.CorruptObjectError` naming the object, the byte position and the
offset, and where the object's intact frames resume (its next sparse-index entry), so the
caller can read that range from the WAL and go on. The checks are
:class:`~danube.storage.ObjectScan`'s, shared with the Spark source.
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict
from dataclasses import dataclass

from danube.bus import TopicName
from danube.frame import RawFrame, record_publish_time_ms
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.storage import (
    CorruptObjectError,
    ObjectDescriptor,
    ObjectNotFoundError,
    ObjectScan,
    ObjectStore,
)

log = logging.getLogger(__name__)

_CACHED_PARTITIONS = 1024
READ_MIN_BYTES = 64 * 1024
"""The smallest range read: about one sparse-index step (what a seek may read before the
wanted frame), so that reading a reply's last frames takes one request, not many."""


@dataclass(frozen=True, slots=True)
class CloudRead:
    """The answer to one read: ``frames`` from one object (may be empty), each whole as it lies
    in the object (checked, to be sent on unchanged), ``next_offset`` where to continue;
    ``in_cloud`` False when no object holds ``from_offset`` or later."""

    in_cloud: bool
    next_offset: int
    frames: list[RawFrame]
    damaged: CorruptObjectError | None = None
    """Set when the read starts at a bad frame: no frame; ``next_offset`` is where the
    object's intact frames resume (its next sparse-index entry, or past its end)."""


class CloudReader:
    """Reads partitions from object storage through their descriptors (cached)."""

    def __init__(self, store: MetaStore, objects: ObjectStore, *, chunk_bytes: int) -> None:
        self.store = store
        self.objects = objects
        self.chunk_bytes = chunk_bytes
        self._descriptors: OrderedDict[TopicName, list[ObjectDescriptor]] = OrderedDict()

    async def descriptors(
        self, partition: TopicName, *, refresh: bool = False
    ) -> list[ObjectDescriptor]:
        """The partition's descriptors by first offset (cached; ``refresh`` reads etcd)."""
        cached = self._descriptors.get(partition)
        if cached is not None and not refresh:
            self._descriptors.move_to_end(partition)
            return cached
        kvs = await self.store.range(meta_keys.object_descriptors_prefix(partition))
        found = sorted((ObjectDescriptor.from_bytes(kv.value) for kv in kvs), key=_first)
        self._descriptors[partition] = found
        self._descriptors.move_to_end(partition)
        while len(self._descriptors) > _CACHED_PARTITIONS:
            self._descriptors.popitem(last=False)
        return found

    async def _find(self, partition: TopicName, offset: int) -> ObjectDescriptor | None:
        """The object holding ``offset``, or the first one after it."""
        for refresh in (False, True):
            found = await self.descriptors(partition, refresh=refresh)
            at = bisect.bisect_left([d.last_offset for d in found], offset)
            if at < len(found):
                return found[at]
        return None  # even after a fresh look: not uploaded (yet)

    async def read(
        self, partition: TopicName, from_offset: int, *, max_bytes: int, max_count: int
    ) -> CloudRead:
        """Frames from ``from_offset`` on (see the module docstring)."""
        descriptor = await self._find(partition, from_offset)
        if descriptor is None:
            return CloudRead(False, from_offset, [])
        try:
            return await self._read_object(descriptor, from_offset, max_bytes, max_count)
        except ObjectNotFoundError:
            # Deleted by retention since we cached its descriptor: look again once.
            await self.descriptors(partition, refresh=True)
            descriptor = await self._find(partition, from_offset)
            if descriptor is None:
                return CloudRead(False, from_offset, [])
            return await self._read_object(descriptor, from_offset, max_bytes, max_count)

    async def offset_for_time(self, partition: TopicName, timestamp_ms: int) -> CloudTime:
        """The first uploaded offset published at or after ``timestamp_ms`` (see the module
        docstring). Descriptors are read afresh: a search is rare, and must see every object."""
        try:
            return await self._search_time(partition, timestamp_ms)
        except ObjectNotFoundError:
            # Deleted by retention while we searched: once more, from fresh descriptors.
            return await self._search_time(partition, timestamp_ms)

    async def _search_time(self, partition: TopicName, timestamp_ms: int) -> CloudTime:
        found = await self.descriptors(partition, refresh=True)
        for descriptor in found:
            if descriptor.may_hold_time(timestamp_ms):
                offset = await self._scan_for_time(descriptor, timestamp_ms)
                if offset is not None:
                    return CloudTime(True, offset)
        return CloudTime(False, found[-1].last_offset + 1 if found else 0)

    async def _scan_for_time(self, descriptor: ObjectDescriptor, timestamp_ms: int) -> int | None:
        """The first offset of the object published at or after the time, if any."""
        low = descriptor.publish_ms_min
        if low is not None and low >= timestamp_ms:
            return descriptor.first_offset  # every record of it is recent enough
        scan = ObjectScan(descriptor, descriptor.first_offset)
        while True:
            for frame in scan.frames():
                if record_publish_time_ms(frame.payload) >= timestamp_ms:
                    return frame.offset
            wanted = scan.next_range(self.chunk_bytes)
            if wanted is None:
                break
            scan.feed(await self.objects.read_range(descriptor.key, *wanted))
        scan.finish()
        return None

    async def _read_object(
        self, descriptor: ObjectDescriptor, from_offset: int, max_bytes: int, max_count: int
    ) -> CloudRead:
        scan = ObjectScan(descriptor, from_offset)
        frames: list[RawFrame] = []
        used = 0
        fed_to = scan.position  # the end of the bytes fed so far
        try:
            while True:
                # Frames are checked as they are taken: a bad frame after the budget is full
                # is left for the read that gets there. Taken whole, they go into the reply as
                # they lie in the object: no framing again, no second CRC.
                for frame in scan.whole_frames():
                    frames.append(frame)
                    used += frame.size_bytes
                    if len(frames) >= max_count or used >= max_bytes:
                        return CloudRead(True, frame.offset + 1, frames)
                wanted = scan.next_range(self._read_size(max_bytes - used, fed_to - scan.position))
                if wanted is None:
                    break
                scan.feed(await self.objects.read_range(descriptor.key, *wanted))
                fed_to = wanted[0] + wanted[1]
            scan.finish()
        except CorruptObjectError as exc:
            if frames:  # serve the good frames before it; a read from the bad one says so
                return CloudRead(True, frames[-1].offset + 1, frames)
            position = scan.position if exc.position is None else exc.position
            resume = max(resume_after(descriptor, position), from_offset + 1)
            return CloudRead(True, resume, [], exc)
        return CloudRead(True, descriptor.last_offset + 1, frames)

    def _read_size(self, budget_bytes: int, partial_bytes: int) -> int:
        """How much to read next: what is left of the reply's byte budget, not a whole chunk,
        so that a read does not fetch and check frames it cannot serve (they would be read and
        checked again by the next request). At least ``READ_MIN_BYTES``, and at least the
        ``partial_bytes`` of a frame begun (a large frame takes a few doubling reads, not many
        small ones); at most ``chunk_bytes``."""
        return min(self.chunk_bytes, max(budget_bytes, READ_MIN_BYTES, partial_bytes))


@dataclass(frozen=True, slots=True)
class CloudTime:
    """The answer to a search by time: ``found`` with the first uploaded offset published at
    or after it, else (the time is past every object) the offset after the last object."""

    found: bool
    offset: int


def resume_after(descriptor: ObjectDescriptor, position: int) -> int:
    """Where the object's intact frames resume after a bad frame at byte ``position``: the
    offset of the first sparse-index entry past it (a frame boundary the uploader recorded,
    so a scan can start there), else past the object's last offset."""
    for entry in descriptor.index:
        if entry.position > position:
            return entry.offset
    return descriptor.last_offset + 1


def _first(descriptor: ObjectDescriptor) -> int:
    return descriptor.first_offset
