"""Wires one ingest node: bus, etcd, node lease and registration, health, partitions."""

from __future__ import annotations

import asyncio
import logging

from danube.bus import Bus
from danube.config import DanubeSettings
from danube.ingest.handlers import serve_claims, serve_deletes
from danube.ingest.node import Node
from danube.meta import MetaStore
from danube.runtime.http import HealthServer
from danube.runtime.service import register_node, wait_for_any

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The node lease expired: everything was fenced; a restart claims afresh."""


class WalFailed(Exception):
    """A WAL write or fsync failed: the process exits and recovers the WAL on restart."""


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Run the node until ``stop``; raise LeaseLost if its lease is lost first."""
    config = settings.ingest
    bus = await Bus.connect(settings.bus, name=node_id)
    store = await MetaStore.connect(settings.wal_cloud.metadata)
    lease = await store.grant_lease(config.lease_ttl_s)
    node = Node(settings, node_id=node_id, bus=bus, store=store, lease=lease)
    started = asyncio.Event()  # ready only once the partitions owned before are served again
    health = HealthServer(
        config.host,
        config.metrics_port,
        ready=lambda: started.is_set() and bus.is_connected and lease.alive,
    )
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(health.serve(), name="health")
            address = f"{config.host}:{config.metrics_port}"
            await register_node(store, "ingest", node_id, address, lease)
            # Assignments first: a partition now assigned elsewhere is not taken back.
            revision = await node.follower.load()
            await node.resume_owned()
            claims = await serve_claims(bus, node)
            deletes = await serve_deletes(bus, node)
            started.set()
            log.info("ingest %s serving %d partitions", node_id, len(node.partitions))
            watcher = tg.create_task(
                node.watch_ownership(start_revision=revision + 1), name="ownership-watch"
            )
            await wait_for_any(stop, lease.lost, node.failed)
            watcher.cancel()
            await claims.drain()
            await deletes.unsubscribe()
            await node.close(release=lease.alive)
            health.stop()
    finally:
        await store.close()  # revokes the lease: our keys go at once
        await bus.close()
    if node.failed.is_set():
        raise WalFailed(f"ingest {node_id}: a WAL failed; restart to recover it from disk")
    if not stop.is_set():
        raise LeaseLost(f"ingest {node_id}: node lease lost")
