"""Wires one retention node: bus, etcd, object store, node registration, health, the leader loop."""

from __future__ import annotations

import asyncio
import logging

from danube.bus import Bus
from danube.config import DanubeSettings
from danube.meta import MetaStore
from danube.retention.leader import Retention
from danube.runtime.http import HealthServer
from danube.runtime.service import register_node, wait_for_any
from danube.storage import ObjectStore

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The node lease expired: the process exits and registers afresh when restarted."""


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Run the node until ``stop``; raise LeaseLost if its lease is lost first."""
    config = settings.retention
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)  # no I/O: a bad config fails here
    bus = await Bus.connect(settings.bus, name=node_id)
    try:
        store = await MetaStore.connect(settings.wal_cloud.metadata)
    except BaseException:
        await bus.close()
        raise
    retention = Retention(settings, node_id=node_id, store=store, bus=bus, objects=objects)
    try:
        lease = await store.grant_lease(config.lease_ttl_s)
        health = HealthServer(
            config.host, config.metrics_port, ready=lambda: bus.is_connected and lease.alive
        )
        async with asyncio.TaskGroup() as tg:
            tg.create_task(health.serve(), name="health")
            address = f"{config.host}:{config.metrics_port}"
            await register_node(store, "retention", node_id, address, lease)
            leaving = asyncio.Event()
            leader = tg.create_task(retention.run(leaving), name="retention-leader")
            log.info("retention %s up (a pass every %.1f s)", node_id, retention.interval_s)
            await wait_for_any(stop, lease.lost)
            leaving.set()  # the leader loop resigns, so another node takes over at once
            await leader
            health.stop()
    finally:
        await store.close()  # revokes the leases: registration and election go at once
        await bus.close()
    if not stop.is_set():
        raise LeaseLost(f"retention {node_id}: node lease lost")
