"""Wires one dispatcher: bus, etcd, node lease and registration, health, subscriptions."""

from __future__ import annotations

import asyncio
import logging

from danube.bus import Bus
from danube.config import DanubeSettings
from danube.dispatcher.handlers import serve_claims
from danube.dispatcher.node import DispatcherNode
from danube.meta import MetaStore
from danube.runtime.http import HealthServer
from danube.runtime.service import register_node, wait_for_any

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
            address = f"{config.host}:{config.metrics_port}"
            await register_node(store, "dispatcher", node_id, address, lease)
            claims = await serve_claims(bus, node)
            started.set()
            log.info("dispatcher %s up", node_id)
            await wait_for_any(stop, lease.lost)
            await claims.drain()
            await node.close(release=lease.alive)
            health.stop()
    finally:
        await store.close()  # revokes the lease: our keys go at once
        await bus.close()
    if not stop.is_set():
        raise LeaseLost(f"dispatcher {node_id}: node lease lost")
