"""Followers fetch straight from their leader's data door (danube.ingest.replica_link), on
two ingest nodes with real NATS, etcd and files: the copies are the leader's, byte for byte;
the door answers a fetch without the term's ticket 401 and one for a partition it does not
lead 421, serving nothing; a follower whose link fails fetches over the bus and produce goes
on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY

from danube.bus import Bus, TopicName
from danube.config import (
    BusConfig,
    DanubeSettings,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.frame import Record, encode_record
from danube.ingest import app, fetcher, replica_link
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.doors import node_door
from danube.meta.records import Owner
from danube.up import free_port
from danube.wire.ingest import replication
from danube.wire.ingest.client import IngestClient
from tests.walfiles import segment_frames

pytestmark = pytest.mark.integration

P = TopicName("default", "linked-part-0")
NODES = ("node-a", "node-b")
COPIED_S = 10.0


def _settings(nats_url: str, etcd: str, prefix: str, wal_dir: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=wal_dir),
            metadata=MetadataConfig(etcd_endpoint=etcd, prefix=prefix),
        ),
        ingest=IngestConfig(
            lease_ttl_s=3,
            metrics_port=free_port(),
            replication_factor=2,
            min_insync_replicas=2,
        ),
    )


@asynccontextmanager
async def _two_nodes(settings_for: Callable[[str], DanubeSettings]) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for node in NODES:
            stop = asyncio.Event()
            task = asyncio.create_task(app.serve(settings_for(node), node, stop))

            async def end(stop: asyncio.Event = stop, task: asyncio.Task[None] = task) -> None:
                stop.set()
                await asyncio.gather(task, return_exceptions=True)

            stack.push_async_callback(end)
        yield


@pytest.fixture
def settings_for(
    nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path
) -> Callable[[str], DanubeSettings]:
    return lambda node: _settings(nats_url, etcd_endpoint, meta_prefix, tmp_path / node)


def _records(count: int, start: int = 0) -> list[bytes]:
    return [
        encode_record(Record(payload=b"m%d" % i, publish_time_ms=7, producer="t"))
        for i in range(start, start + count)
    ]


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def _change_offers(
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[int, replica_link.LinkOffer | None], replica_link.LinkOffer | None],
) -> list[replica_link.LinkOffer | None]:
    """Followers read the leaders' offers through ``change(n, offer)`` (``n``: how many
    were read so far, this one included); the offers read, as the follower took them."""
    real = replica_link.LinkOffer.from_json
    taken: list[replica_link.LinkOffer | None] = []

    def changed(value: object) -> replica_link.LinkOffer | None:
        taken.append(None)
        taken[-1] = change(len(taken), real(value))
        return taken[-1]

    monkeypatch.setattr(replica_link.LinkOffer, "from_json", staticmethod(changed))
    return taken


async def _leader(store: MetaStore) -> str:
    owner = await store.get_model(meta_keys.partition_owner_key(P), Owner)
    assert owner is not None
    return owner.node_id


def _copy(tmp_path: Path, node: str) -> list[tuple[int, bytes]]:
    """The frames of ``node``'s copy of P, as its segment files hold them."""
    frames: list[tuple[int, bytes]] = []
    for segment in sorted((tmp_path / node).rglob("*.wal")):
        frames.extend((f.offset, bytes(f.payload)) for f in segment_frames(segment))
    return sorted(frames)


async def _copies_equal(tmp_path: Path, end: int) -> list[tuple[int, bytes]]:
    async with asyncio.timeout(COPIED_S):
        while True:
            copies = [_copy(tmp_path, node) for node in NODES]
            if len(copies[0]) >= end and copies[0] == copies[1]:
                return copies[0]
            await asyncio.sleep(0.05)


async def test_followers_fetch_over_the_link_and_hold_the_leaders_bytes(
    bus: Bus, store: MetaStore, settings_for: Callable[[str], DanubeSettings], tmp_path: Path
) -> None:
    client = IngestClient(bus)
    served_before = _sample("danube_ingest_replica_link_fetches_total")
    async with _two_nodes(settings_for):
        first = await client.produce(P, _records(5), timeout_s=15)
        assert first == 0
        for i in range(5, 25):  # one at a time: each acknowledged once both copies hold it
            assert await client.produce(P, _records(1, i), timeout_s=10) == i
        served = _sample("danube_ingest_replica_link_fetches_total") - served_before
        # Every acknowledgement needed a fetch reporting it: they came over the link.
        assert served >= 20, served
        leader = await _leader(store)
        follower = next(n for n in NODES if n != leader)
        copy = await _copies_equal(tmp_path, 25)
        assert [offset for offset, _ in copy] == list(range(25))

        # The door serves a link fetch only for the term's ticket ...
        url = await node_door(store, "ingest", leader)
        assert url is not None
        fetch = replication.ReplFetchRequest(1, 0, 1 << 20, 0, follower).encode()
        path = replica_link.fetch_path(P)
        served_now = _sample("danube_ingest_replica_link_fetches_total")
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:
            for headers in ({}, {replica_link.TICKET_HEADER: "not-the-ticket"}):
                refused = await http.post(path, content=fetch, headers=headers)
                assert refused.status_code == 401, refused.text
                assert refused.json()["error"]["code"] == "unauthenticated"
            # ... and only where this node leads the partition.
            other = await node_door(store, "ingest", follower)
            assert other is not None
            elsewhere = await http.post(
                other + path, content=fetch, headers={replica_link.TICKET_HEADER: "x"}
            )
            assert elsewhere.status_code == 421, elsewhere.text
            wrong_method = await http.get(path)
            assert wrong_method.status_code == 405
        assert _sample("danube_ingest_replica_link_fetches_total") == served_now


async def test_a_follower_whose_link_fails_fetches_over_the_bus(
    bus: Bus,
    store: MetaStore,
    settings_for: Callable[[str], DanubeSettings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The follower's ticket is wrong (as after a leader's term changed under it): its link
    is refused, given up, and every fetch after it goes over the bus."""
    _change_offers(
        monkeypatch, lambda n, offer: offer and replica_link.LinkOffer(offer.url, "stale")
    )
    client = IngestClient(bus)
    failures_before = _sample("danube_ingest_replica_link_failures_total")
    served_before = _sample("danube_ingest_replica_link_fetches_total")
    async with _two_nodes(settings_for):
        assert await client.produce(P, _records(5), timeout_s=15) == 0
        for i in range(5, 15):
            assert await client.produce(P, _records(1, i), timeout_s=10) == i
        assert _sample("danube_ingest_replica_link_failures_total") - failures_before == 1
        assert _sample("danube_ingest_replica_link_fetches_total") == served_before
        assert [offset for offset, _ in await _copies_equal(tmp_path, 15)] == list(range(15))
        # Not taken for a dead leader: its door accepted the connection.
        assert _sample("danube_ingest_dead_leader_leases_ended_total") == 0


async def test_a_leader_that_offered_no_link_is_asked_again(
    bus: Bus,
    store: MetaStore,
    settings_for: Callable[[str], DanubeSettings],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node opens its data door after its first terms began (at its start): their
    followers, told of no link, ask once more a while later and fetch over the link."""
    answers = _change_offers(monkeypatch, lambda n, offer: None if n == 1 else offer)
    monkeypatch.setattr(fetcher, "OFFER_AGAIN_S", 0.3)
    client = IngestClient(bus)
    served_before = _sample("danube_ingest_replica_link_fetches_total")
    async with _two_nodes(settings_for):
        assert await client.produce(P, _records(5), timeout_s=15) == 0
        assert _sample("danube_ingest_replica_link_fetches_total") == served_before  # the bus
        async with asyncio.timeout(COPIED_S):  # asked again: the offer taken this time
            while len(answers) < 2:  # noqa: ASYNC110  (a count of calls: no event to await)
                await asyncio.sleep(0.02)
        for i in range(5, 15):
            assert await client.produce(P, _records(1, i), timeout_s=10) == i
        assert _sample("danube_ingest_replica_link_fetches_total") - served_before >= 10
        assert len(answers) == 2  # asked once more, and only once
        assert [offset for offset, _ in await _copies_equal(tmp_path, 15)] == list(range(15))
