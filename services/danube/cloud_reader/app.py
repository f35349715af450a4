"""Wires one cloud reader: bus (queue group ``cloud_reader`` on every partition's
``cloud.fetch`` subject), etcd (descriptors), object storage, node lease and health."""

from __future__ import annotations

import asyncio
import logging
import time

from danube.bus import Bus, Kind, Request
from danube.cloud_reader import metrics
from danube.cloud_reader.reader import CloudReader, CorruptObjectError
from danube.config import DanubeSettings
from danube.frame import FRAME_HEADER_BYTES
from danube.ingest import protocol
from danube.meta import MetaStore
from danube.runtime.http import HealthServer
from danube.runtime.service import register_node, wait_for_any
from danube.storage import ObjectStore

log = logging.getLogger(__name__)

QUEUE = "cloud_reader"
READ_CONCURRENCY = 16
_REPLY_MARGIN_BYTES = 4096


class LeaseLost(Exception):
    """The node lease expired; a restart registers afresh."""


class FetchHandler:
    """Answers ``cloud.fetch`` requests in the ingest fetch reply format."""

    def __init__(self, bus: Bus, reader: CloudReader) -> None:
        self.bus = bus
        self.reader = reader

    async def __call__(self, request: Request) -> bytes:
        started = time.monotonic()
        fetch = protocol.FetchRequest.decode(request.body)
        partition = self.bus.subjects.parse(request.subject).name
        limit = self.bus.max_payload_bytes - _REPLY_MARGIN_BYTES
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
        status = protocol.FetchStatus.OK if read.in_cloud else protocol.FetchStatus.NOT_IN_CLOUD
        metrics.READS.labels(status.name.lower()).inc()
        metrics.MESSAGES.inc(len(read.frames))
        metrics.BYTES.inc(sum(f.size_bytes for f in read.frames))
        reply = protocol.encode_fetch_reply(
            status, 0, read.next_offset, [(f.offset, f.payload) for f in read.frames]
        )
        metrics.READ_SECONDS.observe(time.monotonic() - started)
        return reply


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Serve reads until ``stop``; raise LeaseLost if the node lease is lost first."""
    config = settings.cloud_reader
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    bus = await Bus.connect(settings.bus, name=node_id)
    store = await MetaStore.connect(settings.wal_cloud.metadata)
    lease = await store.grant_lease(config.lease_ttl_s)
    reader = CloudReader(store, objects, chunk_bytes=config.chunk_bytes)
    started = asyncio.Event()
    health = HealthServer(
        config.host,
        config.metrics_port,
        ready=lambda: started.is_set() and bus.is_connected and lease.alive,
    )
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(health.serve(), name="health")
            address = f"{config.host}:{config.metrics_port}"
            await register_node(store, "cloud_reader", node_id, address, lease)
            responder = await bus.serve(
                bus.subjects.all_of_kind(Kind.CLOUD_FETCH),
                FetchHandler(bus, reader),
                queue=QUEUE,
                max_concurrency=READ_CONCURRENCY,
            )
            started.set()
            log.info("cloud reader %s up", node_id)
            await wait_for_any(stop, lease.lost)
            await responder.drain()
            health.stop()
    finally:
        await store.close()
        await bus.close()
    if not stop.is_set():
        raise LeaseLost(f"cloud reader {node_id}: node lease lost")
