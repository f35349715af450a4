"""When a claimant may end another dispatcher's lease (danube.runtime.liveness.gone_door),
against a real etcd and real sockets: only when the node is registered under the very lease
that holds the key and its door refuses connections. A frozen node (its door listens, nobody
accepts), a node registered again under a new lease, and a node that left are not gone."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.runtime.liveness import GoneNodes, gone_door
from danube.runtime.service import register_node

pytestmark = pytest.mark.integration


@pytest.fixture
def frozen_door() -> Iterator[str]:
    """A door that listens but never accepts: a SIGSTOPped process's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def dead_door() -> str:
    """A door nothing listens on any more: a killed process's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_only_a_refusing_door_under_the_same_lease_is_gone(
    store: MetaStore, frozen_door: str, dead_door: str
) -> None:
    killed = await store.grant_lease(10)
    frozen = await store.grant_lease(10)
    try:
        await register_node(store, "dispatcher", "killed", "x:1", killed, data_url=dead_door)
        await register_node(store, "dispatcher", "frozen", "x:1", frozen, data_url=frozen_door)

        assert await gone_door(store, "dispatcher", "killed", killed.id) == dead_door
        assert await gone_door(store, "dispatcher", "frozen", frozen.id) is None
        # The killed node's key held by a lease other than its registration's: another
        # incarnation's, whose own reclaim decides.
        assert await gone_door(store, "dispatcher", "killed", frozen.id) is None
        assert await gone_door(store, "dispatcher", "nobody", killed.id) is None  # left
        assert await gone_door(store, "ingest", "killed", killed.id) is None  # another kind
    finally:
        await killed.revoke()
        await frozen.revoke()


async def test_many_keys_of_one_dead_node_probe_it_once_and_end_its_lease_once(
    store: MetaStore, frozen_door: str, dead_door: str
) -> None:
    """A killed leader's partitions each find it silent at once: one probe, one revoke,
    every asker told; a frozen node's keys are left to their lease."""
    killed = await store.grant_lease(30)
    frozen = await store.grant_lease(30)
    ended: list[tuple[str, str]] = []
    nodes = GoneNodes(store, "ingest", on_ended=lambda node, door: ended.append((node, door)))
    try:
        await register_node(store, "ingest", "killed", "x:1", killed, data_url=dead_door)
        await register_node(store, "ingest", "frozen", "x:1", frozen, data_url=frozen_door)
        for partition in range(20):
            await store.put(f"keys/held-{partition}", b"k", lease=killed)
        asked = await asyncio.gather(*(nodes.gone("killed", killed.id) for _ in range(20)))
        assert asked == [dead_door] * 20
        assert ended == [("killed", dead_door)]
        assert await store.get("keys/held-0") is None  # the lease went, and its keys
        assert await nodes.gone("frozen", frozen.id) is None
        assert await store.get(meta_keys.node_key("ingest", "frozen")) is not None
    finally:
        await killed.revoke()
        await frozen.revoke()
