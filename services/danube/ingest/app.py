"""Wires one ingest node: the node session (bus, etcd, lease, registration, health) and its
partitions."""

from __future__ import annotations

import asyncio
import logging

from danube.aio import cancel_all_and_wait
from danube.config import DanubeSettings
from danube.ingest.disk import DiskRoom, check_wal_volume
from danube.ingest.door import DoorAdmission, open_door
from danube.ingest.grpc_door import open_grpc_door
from danube.ingest.handlers import serve_claims, serve_deletes, serve_probes
from danube.ingest.load import report_load
from danube.ingest.node import Node
from danube.ingest.wal.errors import WalFailedError
from danube.runtime.service import node_session, wait_for_any

log = logging.getLogger(__name__)

__all__ = ["serve"]


async def serve(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    """Run the node until ``stop``; raise WalFailedError if a WAL failed (the process exits
    and its restart recovers the WAL from disk), ConfigError if the WAL's volume can never
    take a write under the disk reserve (danube.ingest.disk). A lost node lease does not
    end it (see below)."""
    await check_wal_volume(settings)
    room = DiskRoom(settings.wal_cloud.wal.dir, settings.ingest.disk_free_min_bytes)
    await room.read()
    # The node lease is renewed in place after a loss (an etcd outage longer than its
    # TTL): leaders serve through it while their followers confirm them, then write their
    # owner keys again under the new lease (docs/replication.md). Not ready while the WAL
    # refuses every append for want of disk (docs/ingest.md).
    async with node_session(
        settings,
        "ingest",
        node_id,
        settings.ingest,
        stop,
        renew_lease=True,
        ready_checks=[room.not_ready],
    ) as s:
        disk = s.tasks.create_task(room.watch(), name="disk-room")
        node = Node(settings, node_id=node_id, bus=s.bus, store=s.store, lease=s.lease)
        s.renewed.append(node.lease_renewed)
        bus_watch = s.tasks.create_task(node.bus_watch.run(), name="bus-watch")
        revision = await node.load()
        claims = await serve_claims(s.bus, node.answer_claim)
        probes = await serve_probes(s.bus, node.answer_probe)
        deletes = await serve_deletes(s.bus, node.delete_local)
        ingest = settings.ingest
        admission = None
        if ingest.data_enabled or ingest.grpc_enabled:  # the doors' one admission
            admission = DoorAdmission(settings, s.store)
            await admission.open()
        door = grpc = None
        if admission is not None and ingest.data_enabled:
            door = await open_door(settings, node, s, admission)
        if admission is not None and ingest.grpc_enabled:
            grpc = await open_grpc_door(settings, node, s, admission)
        s.started.set()
        log.info("ingest %s keeps %d replicas", node_id, len(node.replicas))
        watcher = s.tasks.create_task(
            node.watch(start_revision=revision + 1), name="partition-watch"
        )
        reporter = s.tasks.create_task(
            report_load(s.store, node_id, lambda: s.lease), name="load-report"
        )
        await wait_for_any(stop, node.failed)
        await cancel_all_and_wait([watcher, reporter, bus_watch, disk])
        if door is not None or grpc is not None:
            # Closed doors of a node that still leads would look like a killed node's to
            # its followers (danube.ingest.fetcher): it names none while it hands over.
            await s.withdraw_doors()
            node.ctx.links.serve_at(None)  # nor offers its followers links to them
        if door is not None:
            await door.close()
        if grpc is not None:
            await grpc.close()
        if admission is not None:
            await admission.close()
        await claims.drain()
        await probes.drain()
        await deletes.unsubscribe()
        await node.close(release=s.lease.alive)
    if node.failed.is_set():
        raise WalFailedError(f"ingest {node_id}: restart to recover it from disk")
