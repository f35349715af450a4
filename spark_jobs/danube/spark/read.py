"""Reading one task's object slices in an executor: range reads through
:class:`danube.storage.ObjectStore` (OpenDAL: no Hadoop jars for S3, GCS or Azure), every
frame checked by :class:`danube.storage.ObjectScan`, rows yielded as Arrow record batches.

The executor needs the cloud section of the settings only (shipped from the driver with the
task): never etcd. The storage calls are async; a task runs them on an event loop of its
own, reading the next chunk while the current one is decoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator

import pyarrow as pa

from danube.config import CloudConfig
from danube.spark.arrow import BatchBuilder
from danube.spark.decode import PayloadDecoder, TopicSchema
from danube.spark.options import ReadOptions
from danube.spark.plan import ObjectSlice, Task
from danube.storage import ObjectScan, ObjectStore


def read_task(
    cloud: CloudConfig,
    task: Task,
    options: ReadOptions,
    decoding: TopicSchema | None = None,
    *,
    location: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of every slice of ``task``, in order, in batches of ``options.batch_rows``;
    with ``decoding``, each payload decoded with the topic's registered schema too.
    ``location`` is what a missing object's error says of where the store looked."""
    decoder = None if decoding is None else PayloadDecoder(decoding)
    loop = asyncio.new_event_loop()
    try:
        objects = ObjectStore.from_config(cloud, location=location)
        for piece in task:
            yield from _read_slice(loop, objects, piece, options, decoder)
    finally:
        loop.close()


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause CPython's cycle collector for a block that makes no reference cycles.

    Decoding allocates a few small objects per message, and the collector, run every 700
    allocations, rescanned them again and again: about 40% of the read time. Only the
    decoding of a chunk runs paused (refcounting frees all it makes), never I/O nor the code
    Spark runs between batches (a job's own function may run in the same process).
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _read_slice(
    loop: asyncio.AbstractEventLoop,
    objects: ObjectStore,
    piece: ObjectSlice,
    options: ReadOptions,
    decoder: PayloadDecoder | None,
) -> Iterator[pa.RecordBatch]:
    descriptor = piece.descriptor
    scan = ObjectScan(descriptor, piece.from_offset, to_offset=piece.to_offset)
    rows = BatchBuilder(
        piece.topic,
        piece.partition,
        descriptor.key,
        start_time_ms=options.start_time_ms,
        end_time_ms=options.end_time_ms,
        decoder=decoder,
    )
    reads = _Prefetch(loop, objects, descriptor.key)
    try:
        while True:
            full: list[pa.RecordBatch] = []
            with _collector_paused():
                for frame in scan.frames():
                    rows.add(frame)
                    if len(rows) >= options.batch_rows:
                        full.append(rows.take())
            yield from full
            wanted = scan.next_range(options.chunk_bytes)
            if wanted is None:
                break
            scan.feed(reads.get(wanted, ahead=_next(wanted, scan.read_end, options)))
        scan.finish()
    finally:
        reads.cancel()
    if len(rows):
        yield rows.take()


def _next(wanted: tuple[int, int], end: int, options: ReadOptions) -> tuple[int, int] | None:
    """The chunk after ``wanted``, to read ahead (``None`` at the end of the object)."""
    start = wanted[0] + wanted[1]
    return None if start >= end else (start, min(options.chunk_bytes, end - start))


class _Prefetch:
    """Range reads of one object, each started one chunk ahead of its use: OpenDAL moves the
    bytes on its own threads while this one decodes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, objects: ObjectStore, key: str) -> None:
        self._loop = loop
        self._objects = objects
        self._key = key
        self._ahead: tuple[tuple[int, int], asyncio.Task[bytes]] | None = None

    def get(self, wanted: tuple[int, int], *, ahead: tuple[int, int] | None) -> bytes:
        """The bytes of ``wanted``; starts reading ``ahead`` before returning."""
        if self._ahead is not None and self._ahead[0] == wanted:
            task = self._ahead[1]
        else:
            self.cancel()
            task = self._start(wanted)
        self._ahead = None
        data = self._loop.run_until_complete(task)
        if ahead is not None:
            self._ahead = (ahead, self._start(ahead))
            # One turn of the loop: the read is sent now, not when the loop runs next.
            self._loop.run_until_complete(asyncio.sleep(0))
        return data

    def _start(self, wanted: tuple[int, int]) -> asyncio.Task[bytes]:
        return self._loop.create_task(self._objects.read_range(self._key, *wanted))

    def cancel(self) -> None:
        """Drop a read ahead that will not be used (the slice ended, or failed)."""
        if self._ahead is not None:
            task = self._ahead[1]
            self._ahead = None
            task.cancel()
            # Its outcome is of no use: the slice ended (or failed) without it.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                self._loop.run_until_complete(task)
