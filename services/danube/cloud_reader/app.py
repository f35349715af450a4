"""Wires one cloud reader: bus (queue group ``cloud_reader`` on every partition's
``cloud.fetch`` and ``cloud.time`` subjects), etcd (descriptors), object storage, node lease
and health."""

from __future__ import annotations

import asyncio
import logging
import time

from danube.bus import Bus, Kind, Request
from danube.cloud_reader import metrics
from danube.cloud_reader.reader import CloudReader
from danube.config import DanubeSettings
from danube.frame import FRAME_HEADER_BYTES
from danube.runtime.service import node_session, wait_for_any
from danube.runtime.topic_metrics import topic_label
from danube.storage import CorruptObjectError, ObjectStore
from danube.wire.ingest import protocol
from danube.wire.sizes import body_limit

log = logging.getLogger(__name__)

__all__ = ["FetchHandler", "TimeHandler", "serve"]

QUEUE = "cloud_reader"
READ_CONCURRENCY = 16
TIME_CONCURRENCY = 4  # a search may scan a whole object: few at once


class FetchHandler:
    """Answers ``cloud.fetch`` requests in the ingest fetch reply format, with the object's
    frames unchanged."""

    def __init__(self, bus: Bus, reader: CloudReader) -> None:
        self.bus = bus
        self.reader = reader

    async def __call__(self, request: Request) -> bytes:
        started = time.monotonic()
        fetch = protocol.FetchRequest.decode(request.body)
        partition = self.bus.subjects.parse(request.subject).name
        limit = body_limit(self.bus.max_payload_bytes)
        try:
            read = await self.reader.read(
                partition,
                fetch.from_offset,
                max_bytes=min(fetch.max_bytes, limit),
                max_count=min(fetch.max_count, limit // (2 * FRAME_HEADER_BYTES)),
            )
        except CorruptObjectError as exc:
            metrics.CORRUPT.inc()
            log.error("%s: %s", partition, exc)
            raise
        if read.damaged is not None:
            metrics.CORRUPT.inc()
            metrics.READS.labels("damaged").inc()
            log.debug("%s: %s", partition, read.damaged)  # the reader reports it, once
            return protocol.encode_damaged_reply(0, read.next_offset, read.damaged.key or "")
        status = protocol.FetchStatus.OK if read.in_cloud else protocol.FetchStatus.NOT_IN_CLOUD
        metrics.READS.labels(status.name.lower()).inc()
        metrics.MESSAGES.inc(len(read.frames))
        if read.frames:
            metrics.TOPIC_MESSAGES_READ.labels(topic_label(partition)).inc(len(read.frames))
        metrics.BYTES.inc(sum(f.size_bytes for f in read.frames))
        # The frames as they lie in the object, checked by the read: one copy, into the reply.
        reply = protocol.encode_fetch_reply(status, 0, read.next_offset, read.frames)
        metrics.READ_SECONDS.observe(time.monotonic() - started)
        return reply


class TimeHandler:
    """Answers ``cloud.time`` requests: a u64 time in (ingest's ``wal.time`` body), a fetch
    reply head out with no frames: ``OK`` and the first uploaded offset published at or after
    the time, or ``NOT_IN_CLOUD`` and the offset after the last object."""

    def __init__(self, bus: Bus, reader: CloudReader) -> None:
        self.bus = bus
        self.reader = reader

    async def __call__(self, request: Request) -> bytes:
        timestamp_ms = protocol.decode_timestamp(request.body)
        partition = self.bus.subjects.parse(request.subject).name
        try:
            answer = await self.reader.offset_for_time(partition, timestamp_ms)
        except CorruptObjectError as exc:
            metrics.CORRUPT.inc()
            log.error("%s: %s", partition, exc)
            raise
        status = protocol.FetchStatus.OK if answer.found else protocol.FetchStatus.NOT_IN_CLOUD
        return protocol.encode_fetch_reply(status, 0, answer.offset, [])


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Serve reads until ``stop``; raise LeaseLostError if the node lease is lost first."""
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)  # no I/O: a bad config fails here
    config = settings.cloud_reader
    async with node_session(settings, "cloud_reader", node_id, config, stop) as s:
        reader = CloudReader(s.store, objects, chunk_bytes=config.chunk_bytes)
        responder = await s.bus.serve(
            s.bus.subjects.all_of_kind(Kind.CLOUD_FETCH),
            FetchHandler(s.bus, reader),
            queue=QUEUE,
            max_concurrency=READ_CONCURRENCY,
        )
        times = await s.bus.serve(
            s.bus.subjects.all_of_kind(Kind.CLOUD_TIME),
            TimeHandler(s.bus, reader),
            queue=QUEUE,
            max_concurrency=TIME_CONCURRENCY,
        )
        s.started.set()
        log.info("cloud reader %s up", node_id)
        await wait_for_any(stop, s.lease.lost)
        await times.drain()
        await responder.drain()
