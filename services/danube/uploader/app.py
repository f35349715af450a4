"""Wires one uploader: bus, etcd, object storage, node lease and registration, health, and
the partition workers (danube.uploader.node)."""

from __future__ import annotations

import asyncio
import logging

from danube.bus import Bus
from danube.config import DanubeSettings
from danube.meta import MetaStore
from danube.runtime.http import HealthServer
from danube.runtime.service import register_node, wait_for_any
from danube.storage import ObjectStore
from danube.uploader.node import UploaderNode

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The node lease expired: its assignment keys are gone; a restart claims afresh."""


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Upload until ``stop``; raise LeaseLost if the node lease is lost first."""
    config = settings.uploader
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)
    bus = await Bus.connect(settings.bus, name=node_id)
    store = await MetaStore.connect(settings.wal_cloud.metadata)
    lease = await store.grant_lease(config.lease_ttl_s)
    node = UploaderNode(
        settings, node_id=node_id, bus=bus, store=store, lease=lease, objects=objects
    )
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
            await register_node(store, "uploader", node_id, address, lease)
            assigner = tg.create_task(node.run(), name="assign")
            started.set()
            log.info("uploader %s up", node_id)
            await wait_for_any(stop, lease.lost)
            assigner.cancel()
            await node.close()
            health.stop()
    finally:
        await store.close()  # revokes the lease: our assignment keys go at once
        await bus.close()
    if not stop.is_set():
        raise LeaseLost(f"uploader {node_id}: node lease lost")
