"""Wires one retention node: the node session (bus, etcd, lease, registration, health), object
storage and the leader loop."""

from __future__ import annotations

import asyncio
import logging

from danube.config import DanubeSettings
from danube.retention.leader import Retention
from danube.runtime.service import node_session, wait_for_any
from danube.storage import ObjectStore

log = logging.getLogger(__name__)

__all__ = ["serve"]


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Run the node until ``stop``; raise LeaseLostError if its lease is lost first."""
    objects = ObjectStore.from_config(settings.wal_cloud.cloud)  # no I/O: a bad config fails here
    async with node_session(settings, "retention", node_id, settings.retention, stop) as s:
        retention = Retention(settings, node_id=node_id, store=s.store, bus=s.bus, objects=objects)
        leaving = asyncio.Event()
        leader = s.tasks.create_task(retention.run(leaving), name="retention-leader")
        s.started.set()
        log.info("retention %s up (a pass every %.1f s)", node_id, retention.interval_s)
        await wait_for_any(stop, s.lease.lost)
        leaving.set()  # the leader loop resigns, so another node takes over at once
        await leader
