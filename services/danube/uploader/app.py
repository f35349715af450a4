"""Wires one uploader: the node session (bus, etcd, lease, registration, health), object
storage and the partition workers (danube.uploader.node)."""

from __future__ import annotations

import asyncio
import logging

from danube.aio import cancel_all_and_wait
from danube.config import DanubeSettings
from danube.runtime.service import node_session, wait_for_any
from danube.storage import ObjectStore
from danube.uploader.node import UploaderNode
from danube.uploader.record import record_object_store

log = logging.getLogger(__name__)

__all__ = ["serve"]


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Upload until ``stop``; raise LeaseLostError if the node lease is lost first (its
    assignment keys are gone with it; a restart claims afresh)."""
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)  # no I/O: a bad config fails here
    async with node_session(settings, "uploader", node_id, settings.uploader, stop) as s:
        await record_object_store(s.store, settings.wal_cloud.cloud, node_id)
        node = UploaderNode(
            settings, node_id=node_id, bus=s.bus, store=s.store, lease=s.lease, objects=objects
        )
        assigner = s.tasks.create_task(node.run(), name="assign")
        s.started.set()
        log.info("uploader %s up", node_id)
        await wait_for_any(stop, s.lease.lost)
        await cancel_all_and_wait([assigner])
        await node.close()
