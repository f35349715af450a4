"""Wires one dispatcher: bus, etcd, node lease and registration, health, subscriptions."""

from __future__ import annotations

import asyncio
import logging
import time

from danube.bus import Bus
from danube.config import DanubeSettings
from danube.dispatcher.handlers import serve_claims
from danube.dispatcher.node import DispatcherNode
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import NodeRecord
from danube.runtime.http import HealthServer

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The node lease expired: every subscription was fenced; a restart claims afresh."""


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Run the dispatcher until ``stop``; raise LeaseLost if its lease is lost first."""
    config = settings.dispatcher
    bus = await Bus.connect(settings.bus, name=node_id)
    store = await MetaStore.connect(settings.wal_cloud.metadata)
    lease = await store.grant_lease(config.lease_ttl_s)
    node = DispatcherNode(settings, node_id=node_id, bus=bus, store=store, lease=lease)
    started = asyncio.Event()
    health = HealthServer(
        config.host,
        config.metrics_port,
        ready=lambda: started.is_set() and bus.is_connected and lease.alive,
    )
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(health.serve(), name="health")
            record = NodeRecord(
                node_id=node_id,
                kind="dispatcher",
                address=f"{config.host}:{config.metrics_port}",
                started_ms=int(time.time() * 1000),
            )
            await store.put_model(meta_keys.node_key("dispatcher", node_id), record, lease=lease)
            claims = await serve_claims(bus, node)
            started.set()
            log.info("dispatcher %s up", node_id)
            waits = [asyncio.ensure_future(e.wait()) for e in (stop, lease.lost)]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            await claims.drain()
            await node.close(release=lease.alive)
            health.stop()
    finally:
        await store.close()  # revokes the lease: our keys go at once
        await bus.close()
    if not stop.is_set():
        raise LeaseLost(f"dispatcher {node_id}: node lease lost")
