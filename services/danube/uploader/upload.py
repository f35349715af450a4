"""One partition's uploads: durable WAL frames from ingest to one object per cycle, then the
descriptor and the checkpoint in one etcd transaction.

A cycle, for the range after the checkpoint's ``uploaded_through``:

1. **Plan.** Read frames from ingest (``wal.fetch``) until caught up or ``max_object_mb`` is
   reached; the range ends at the last frame read. Record it as ``pending_end`` in the
   checkpoint (CAS on its mod revision, and on our assignment key).
2. **Write** the object ``<first>-<last>.dnb`` whole: from memory when the range was small
   enough to keep while planning (``MEMORY_OBJECT_BYTES``), else streamed (multipart) by reading
   the range from ingest a second time.
3. **Commit**: the descriptor (with its sparse index and the lowest and highest publish time
   of its records, for searches by time) and ``uploaded_through = pending_end`` in one
   transaction, compared on the checkpoint's and the assignment key's mod revisions.

A crash anywhere leaves either nothing pending (redo the cycle) or a ``pending_end``: whoever
uploads next writes exactly that range again (same frames, same key, same bytes) and commits
it. So objects never overlap and the range after ``uploaded_through`` is never skipped. A
write that lost its assignment fails its transaction and changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from danube.bus import TopicName
from danube.config import UploaderConfig
from danube.errors import DanubeError
from danube.frame import Frame, FrameError, append_frame, record_publish_time_ms
from danube.meta import MetaStore, Txn, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import DamagedRange, UploaderCheckpoint
from danube.storage import ObjectDescriptor, ObjectStore, SparseIndexBuilder, object_key
from danube.uploader import metrics
from danube.wire.ingest.client import IngestClient
from danube.wire.ingest.protocol import Damaged

log = logging.getLogger(__name__)

MEMORY_OBJECT_BYTES = 32 << 20  # objects up to this size are built in memory in one pass
FETCH_MAX_BYTES = 1 << 20
FETCH_MAX_COUNT = 10_000
FETCH_TIMEOUT_S = 10.0
_MiB = 1 << 20


class PublishTimes:
    """The lowest and highest ``publish_time_ms`` of the records of one object; unknown
    (``None``) once a record's time cannot be read, so a descriptor never claims a range
    that a record it holds lies outside."""

    def __init__(self) -> None:
        self._low: int | None = None
        self._high: int | None = None
        self._known = True

    def add(self, record: bytes | memoryview) -> None:
        """Count one record (a frame's payload)."""
        if not self._known:
            return
        try:
            time_ms = record_publish_time_ms(record)
        except FrameError:
            self._known = False  # not a record of a version we read: no time range at all
            return
        self._low = time_ms if self._low is None else min(self._low, time_ms)
        self._high = time_ms if self._high is None else max(self._high, time_ms)

    @property
    def range(self) -> tuple[int, int] | None:
        """``(lowest, highest)``, ``None`` when unknown or nothing was added."""
        if not self._known or self._low is None or self._high is None:
            return None
        return self._low, self._high


class UploadError(DanubeError):
    """An upload that cannot go on now; the next cycle starts again from the checkpoint."""

    code = "upload_failed"
    retriable = True


class UploadFencedError(UploadError):
    """The checkpoint or the assignment changed under us: another uploader has the partition."""

    code = "upload_fenced"
    retriable = False


class DataLostError(DanubeError):
    """Offsets not yet uploaded are gone from the WAL (below its start): nothing can bring
    them back; the uploader records the loss (:meth:`PartitionUploader.skip_lost`) and moves
    on."""

    code = "data_lost"

    def __init__(self, partition: TopicName, offset: int, wal_start: int) -> None:
        super().__init__(
            f"{partition}: offsets {offset}..{wal_start - 1} left the WAL before they were uploaded"
        )
        self.wal_start = wal_start


class WalDamagedError(DanubeError):
    """The WAL's copy of the next offsets to upload is damaged: everything before it is
    uploaded; the uploader records the range (:meth:`PartitionUploader.record_damage`) and
    tries again each interval (a repaired or skipped range lets it go on)."""

    code = "wal_damaged"

    def __init__(self, partition: TopicName, damaged: Damaged) -> None:
        super().__init__(f"{partition}: cannot upload past damaged WAL {damaged}")
        self.damaged = damaged


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The stored checkpoint and the mod revision a CAS compares (0: absent)."""

    value: UploaderCheckpoint
    revision: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class PartitionUploader:
    """Uploads one partition while this uploader holds its assignment key."""

    def __init__(
        self,
        partition: TopicName,
        *,
        store: MetaStore,
        objects: ObjectStore,
        ingest: IngestClient,
        config: UploaderConfig,
        assignment_revision: int,
    ) -> None:
        self.partition = partition
        self.store = store
        self.objects = objects
        self.ingest = ingest
        self.config = config
        self.assignment_revision = assignment_revision
        self.checkpoint_key = meta_keys.uploader_checkpoint_key(partition)
        self.assignment_key = meta_keys.uploader_assignment_key(partition)
        self.max_object_bytes = config.max_object_mb * _MiB

    async def load_checkpoint(self) -> Checkpoint:
        found = await self.store.get_model_kv(self.checkpoint_key, UploaderCheckpoint)
        if found is None:
            return Checkpoint(UploaderCheckpoint(uploaded_through=-1, updated_ms=0), 0)
        return Checkpoint(found[0], found[1].mod_revision)

    async def cycle(self) -> int:
        """Upload what is durable and not uploaded yet, in objects of at most
        ``max_object_mb``; returns the number of messages uploaded."""
        uploaded = 0
        while True:
            count, more = await self._one_object()
            uploaded += count
            if not more:
                return uploaded

    async def _one_object(self) -> tuple[int, bool]:
        """One object; ``(messages, whether more is waiting)``."""
        checkpoint = await self.load_checkpoint()
        damaged = checkpoint.value.damaged
        size = 0 if damaged is None else damaged.to_offset - damaged.from_offset
        metrics.DAMAGED_OFFSETS.labels(str(self.partition)).set(size)
        start = checkpoint.value.uploaded_through + 1
        held: list[Frame] | None = None
        more = False
        end = checkpoint.value.pending_end
        if end is None:
            plan = await self._plan(start)
            if plan is None:
                return 0, False
            end, held, more = plan
            checkpoint = await self._write_checkpoint(
                checkpoint,
                UploaderCheckpoint(
                    uploaded_through=checkpoint.value.uploaded_through,
                    pending_end=end,
                    last_object_key=checkpoint.value.last_object_key,
                    updated_ms=_now_ms(),
                    skipped_offsets=checkpoint.value.skipped_offsets,
                ),
            )
        else:
            log.info("%s: finishing the pending upload of %d..%d", self.partition, start, end)
            more = True
        descriptor = await self._write_object(start, end, held)
        await self._commit(checkpoint, descriptor, end)
        metrics.OBJECTS.inc()
        metrics.BYTES.inc(descriptor.size_bytes)
        metrics.MESSAGES.inc(descriptor.message_count)
        log.info(
            "%s: uploaded %d..%d (%d messages, %d bytes) as %s",
            self.partition,
            descriptor.first_offset,
            descriptor.last_offset,
            descriptor.message_count,
            descriptor.size_bytes,
            descriptor.key,
        )
        return descriptor.message_count, more

    async def _plan(self, start: int) -> tuple[int, list[Frame] | None, bool] | None:
        """Where the next object ends: ``(end, its frames when small enough to keep, whether
        more is waiting)``, or None when nothing new is durable."""
        frames: list[Frame] | None = []
        last: int | None = None
        size = 0
        offset = start
        while size < self.max_object_bytes:
            reply = await self.ingest.fetch(
                self.partition,
                offset,
                max_bytes=min(FETCH_MAX_BYTES, self.max_object_bytes - size),
                max_count=FETCH_MAX_COUNT,
                timeout_s=FETCH_TIMEOUT_S,
            )
            if reply.below_wal_start:
                raise DataLostError(self.partition, offset, reply.wal_start)
            if reply.damaged is not None:
                if last is None:
                    raise WalDamagedError(self.partition, reply.damaged)
                return last, frames, False  # the good part before it goes up now
            if not reply.frames:
                break  # caught up with what is durable
            for frame in reply.frames:
                if last is not None and size + frame.size_bytes > self.max_object_bytes:
                    return last, frames, True
                size += frame.size_bytes
                last = frame.offset
                if frames is not None and size <= MEMORY_OBJECT_BYTES:
                    frames.append(frame)  # views the reply body, which stays alive with it
                else:
                    frames = None  # too big to hold: the object is streamed in a second pass
            offset = reply.next_offset
        if last is None:
            return None
        return last, frames, size >= self.max_object_bytes

    async def _frames(self, start: int, end: int) -> AsyncIterator[Frame]:
        """The frames of ``[start, end]`` read again from ingest."""
        offset = start
        while offset <= end:
            reply = await self.ingest.fetch(
                self.partition,
                offset,
                max_bytes=FETCH_MAX_BYTES,
                max_count=min(FETCH_MAX_COUNT, end - offset + 1),
                timeout_s=FETCH_TIMEOUT_S,
            )
            if reply.below_wal_start:
                raise DataLostError(self.partition, offset, reply.wal_start)
            if reply.damaged is not None:  # read intact a moment ago: a disk going bad
                raise UploadError(f"{self.partition}: WAL damaged since planned: {reply.damaged}")
            if not reply.frames:  # the range was read before: it cannot have vanished
                raise UploadError(f"{self.partition}: {offset}..{end} not served by ingest")
            for frame in reply.frames:
                if frame.offset > end:
                    return
                yield frame
            offset = reply.next_offset

    async def _write_object(
        self, start: int, end: int, held: list[Frame] | None
    ) -> ObjectDescriptor:
        builder = SparseIndexBuilder()
        times = PublishTimes()
        if held is not None:
            body = bytearray()
            for frame in held:
                position = len(body)
                append_frame(body, frame.offset, frame.payload)
                builder.add(frame.offset, position, len(body) - position)
                times.add(frame.payload)
            key = self._key(builder)
            await self.objects.write(key, bytes(body))
        else:
            key = await self._stream(start, end, builder, times)
        return ObjectDescriptor.from_builder(
            key,
            builder,
            created_ms=_now_ms(),
            contiguous=_contiguous(builder),
            publish_ms=times.range,
        )

    async def _stream(
        self, start: int, end: int, builder: SparseIndexBuilder, times: PublishTimes
    ) -> str:
        # The key names the first and last frame, known only after reading them: a first
        # pass finds them (only sizes are kept), the second writes. Both read the same
        # immutable WAL range.
        first = last = None
        async for frame in self._frames(start, end):
            first = frame.offset if first is None else first
            last = frame.offset
        if first is None or last is None:
            raise UploadError(f"{self.partition}: nothing to upload in {start}..{end}")
        key = self._name(first, last)
        position = 0
        async with self.objects.writer(key) as writer:
            chunk = bytearray()
            async for frame in self._frames(start, end):
                before = len(chunk)
                append_frame(chunk, frame.offset, frame.payload)
                size = len(chunk) - before
                builder.add(frame.offset, position, size)
                times.add(frame.payload)
                position += size
                if len(chunk) >= 8 * _MiB:
                    await writer.write(bytes(chunk))
                    chunk.clear()
            if chunk:
                await writer.write(bytes(chunk))
        return key

    def _key(self, builder: SparseIndexBuilder) -> str:
        if builder.first_offset is None or builder.last_offset is None:
            raise ValueError(f"{self.partition}: an object without frames")
        return self._name(builder.first_offset, builder.last_offset)

    def _name(self, first: int, last: int) -> str:
        return object_key(
            self.config.root_prefix,
            self.partition.namespace,
            self.partition.topic,
            first,
            last,
        )

    async def _write_checkpoint(
        self, checkpoint: Checkpoint, value: UploaderCheckpoint
    ) -> Checkpoint:
        txn = self._fenced_txn(checkpoint).then_put(self.checkpoint_key, encode_model(value))
        result = await txn.commit()
        if not result.succeeded:
            raise UploadFencedError(f"{self.partition}: checkpoint or assignment changed")
        return Checkpoint(value, result.revision)

    async def _commit(self, checkpoint: Checkpoint, descriptor: ObjectDescriptor, end: int) -> None:
        value = UploaderCheckpoint(
            uploaded_through=end,
            last_object_key=descriptor.key,
            updated_ms=_now_ms(),
            skipped_offsets=checkpoint.value.skipped_offsets,
        )
        descriptor_key = meta_keys.object_descriptor_key(self.partition, descriptor.first_offset)
        txn = (
            self._fenced_txn(checkpoint)
            .then_put(descriptor_key, descriptor.to_bytes())
            .then_put(self.checkpoint_key, encode_model(value))
        )
        result = await txn.commit()
        if not result.succeeded:
            raise UploadFencedError(f"{self.partition}: checkpoint or assignment changed")

    def _fenced_txn(self, checkpoint: Checkpoint) -> Txn:
        txn = self.store.txn().if_mod_revision(self.assignment_key, "==", self.assignment_revision)
        if checkpoint.revision == 0:
            return txn.if_absent(self.checkpoint_key)
        return txn.if_mod_revision(self.checkpoint_key, "==", checkpoint.revision)

    async def record_damage(self, damaged: Damaged) -> None:
        """Record in the checkpoint (once per range: one log line, one count) that uploads
        stop before ``damaged``; ``topics describe`` shows it."""
        checkpoint = await self.load_checkpoint()
        found = DamagedRange(
            from_offset=damaged.from_offset, to_offset=damaged.to_offset, file=damaged.file
        )
        if checkpoint.value.damaged == found:
            return
        log.error(
            "%s: uploads stop at offset %d: the WAL copy of offsets %d..%d is damaged (%s); "
            "everything before it is uploaded",
            self.partition,
            found.from_offset,
            found.from_offset,
            found.to_offset - 1,
            found.file,
        )
        metrics.DAMAGED_RANGES.inc()
        metrics.DAMAGED_OFFSETS.labels(str(self.partition)).set(found.to_offset - found.from_offset)
        value = checkpoint.value.model_copy(update={"damaged": found, "updated_ms": _now_ms()})
        await self._write_checkpoint(checkpoint, value)

    async def skip_lost(self, wal_start: int) -> None:
        """Record that everything below ``wal_start`` is gone (it will never be uploaded)."""
        checkpoint = await self.load_checkpoint()
        if checkpoint.value.uploaded_through + 1 >= wal_start:
            return
        log.error(
            "%s: offsets %d..%d were lost before upload; the cloud tier skips them",
            self.partition,
            checkpoint.value.uploaded_through + 1,
            wal_start - 1,
        )
        metrics.LOST_OFFSETS.inc(wal_start - 1 - checkpoint.value.uploaded_through)
        await self._write_checkpoint(
            checkpoint,
            UploaderCheckpoint(
                uploaded_through=wal_start - 1,
                last_object_key=checkpoint.value.last_object_key,
                updated_ms=_now_ms(),
                skipped_offsets=checkpoint.value.skipped_offsets,
            ),
        )


def _contiguous(builder: SparseIndexBuilder) -> bool:
    first, last = builder.first_offset, builder.last_offset
    return first is not None and last is not None and builder.message_count == last - first + 1
