"""A node leaving before a clean stop (NodeSession.leave): its registration goes at once, and
a lease lost afterwards does not write it back, as it does while the node serves. Peers
counting the live nodes (the dispatchers' balancing) then count it out while it hands its
work over (docs/dispatcher.md, SIGTERM)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from danube.config import (
    BusConfig,
    DanubeSettings,
    DispatcherConfig,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
)
from danube.meta import MetaStore
from danube.meta.topics import live_nodes
from danube.runtime.liveness import gone_door
from danube.runtime.service import NodeSession, node_session
from danube.up import free_port

pytestmark = pytest.mark.integration

REGISTERED_AGAIN_S = 10.0  # a lost lease: a new one and the registration, once etcd answers


async def _revoke(session: NodeSession, store: MetaStore) -> None:
    """Revoke the session's lease from outside (as an etcd stall past its TTL would end it)
    and wait until the session has seen it go."""
    lease = session.lease
    assert await store.revoke_lease(lease.id)
    async with asyncio.timeout(REGISTERED_AGAIN_S):
        await lease.lost.wait()


async def test_a_node_that_left_is_not_registered_again_when_its_lease_goes(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, store: MetaStore
) -> None:
    settings = DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            metadata=MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix)
        ),
        dispatcher=DispatcherConfig(metrics_port=free_port()),
    )
    stop = asyncio.Event()
    config = settings.dispatcher
    async with node_session(
        settings, "dispatcher", "leaver", config, stop, renew_lease=True
    ) as session:
        assert await live_nodes(store, "dispatcher") == {"leaver"}
        # Serving: a lost lease is replaced and the registration written again.
        await _revoke(session, store)
        async with asyncio.timeout(REGISTERED_AGAIN_S):
            while await live_nodes(store, "dispatcher") != {"leaver"}:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert session.lease.alive

        await session.leave()
        assert await live_nodes(store, "dispatcher") == set()
        # Leaving: the next loss writes nothing back. Registering again took milliseconds
        # above; a second is room for it to show up if it were still going to.
        await _revoke(session, store)
        await asyncio.sleep(1.0)
        assert await live_nodes(store, "dispatcher") == set()
        stop.set()


async def test_a_node_that_withdrew_its_doors_is_no_evidence_of_death(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, store: MetaStore
) -> None:
    """A stopping ingest node closes its doors while it still hands over: once withdrawn
    (NodeSession.withdraw_doors) a closed door names nothing, so its followers cannot take
    it for a killed node's and end its lease (danube.runtime.liveness)."""
    settings = DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            metadata=MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix)
        ),
        ingest=IngestConfig(metrics_port=free_port()),
    )
    stop = asyncio.Event()
    with socket.socket() as s:  # a port nothing listens on: a closed door
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with node_session(settings, "ingest", "stopping", settings.ingest, stop) as session:
        await session.advertise(closed)
        assert await gone_door(store, "ingest", "stopping", session.lease.id) == closed
        await session.withdraw_doors()
        assert await gone_door(store, "ingest", "stopping", session.lease.id) is None
        stop.set()
