"""A served subscription's helpers work from what they are handed, without a runtime: a seek
resolves, checks it is still served, then moves; eviction moves a cursor to keep the
quota; consumer sessions expire; the change signal wakes a waiter at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danube.dispatcher.changes import Changes
from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.cursors_admin import CursorMoves
from danube.dispatcher.damage import DamageBook
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Seek
from danube.dispatcher.policies import BacklogEviction
from danube.dispatcher.sessions import ConsumerSessions
from danube.dispatcher.store import NotOwnerError
from danube.meta import TopicName
from danube.wire.ingest.client import WalOffsets

pytestmark = pytest.mark.unit

TOPIC = TopicName("ns", "t")
PARTITIONS = {"t-part-0": TopicName("ns", "t-part-0"), "t-part-1": TopicName("ns", "t-part-1")}


class Moves:
    """The seeks handed to the machine."""

    def __init__(self) -> None:
        self.seeks: list[Seek] = []

    async def __call__(self, seek: Seek) -> list[Any]:
        self.seeks.append(seek)
        return []


async def test_a_seek_resolves_every_partition_then_moves_them_at_once() -> None:
    moves = Moves()

    async def resolve(partitions: Any, position: Any) -> list[int]:
        assert position == "earliest"
        return [7 * (i + 1) for i, _ in enumerate(partitions)]

    mover = CursorMoves(
        TOPIC,
        "s",
        PARTITIONS,
        DamageBook(),
        resolve=resolve,
        move=moves,
        check_serving=lambda: None,
    )
    assert await mover.seek("earliest") == {"t-part-0": 7, "t-part-1": 14}
    (seek,) = moves.seeks
    assert seek.offsets == {"t-part-0": 7, "t-part-1": 14}


async def test_a_seek_stops_when_a_delete_began_while_ingest_answered() -> None:
    moves = Moves()
    serving = [True]

    async def resolve(partitions: Any, position: Any) -> list[int]:
        serving[0] = False  # a delete begins meanwhile
        return [0] * len(partitions)

    def check_serving() -> None:
        if not serving[0]:
            raise NotOwnerError("being deleted")

    mover = CursorMoves(
        TOPIC,
        "s",
        PARTITIONS,
        DamageBook(),
        resolve=resolve,
        move=moves,
        check_serving=check_serving,
    )
    with pytest.raises(NotOwnerError):
        await mover.seek("latest")
    assert moves.seeks == []  # nothing moved


class Wal:
    def __init__(self, durable_next: int) -> None:
        self.durable_next = durable_next

    async def wal_offsets(self, partition: TopicName, *, timeout_s: float) -> WalOffsets:
        return WalOffsets(start_offset=0, durable_next=self.durable_next)


async def test_eviction_moves_the_cursor_to_keep_the_quota_and_no_further() -> None:
    machine = SubscriptionMachine("exclusive", {"t-part-0": PartitionCursor(0)})
    moves = Moves()

    async def no_policies() -> Any:
        raise AssertionError("not read by _evict")

    eviction = BacklogEviction(
        "ns/t/s",
        {"t-part-0": PARTITIONS["t-part-0"]},
        read_policies=no_policies,
        ingest=Wal(durable_next=100),  # type: ignore[arg-type]
        machine=lambda: machine,
        move=moves,
    )
    await eviction._evict("t-part-0", PARTITIONS["t-part-0"], quota=10)
    (seek,) = moves.seeks
    assert seek.offsets == {"t-part-0": 90}  # 10 left unacknowledged
    await eviction._evict("t-part-0", PARTITIONS["t-part-0"], quota=200)
    assert len(moves.seeks) == 1  # within the quota: not moved


def test_sessions_expire_the_consumers_not_heard_from() -> None:
    sessions = ConsumerSessions()
    sessions.begin("a", 0.0)
    sessions.begin("b", 0.0)
    sessions.seen("b", 50.0)
    sessions.seen("gone", 50.0)  # not attached: left out
    assert sessions.expired(61.0, 60.0) == ["a"]
    sessions.end("a")
    sessions.end("a")  # twice is not an error
    assert len(sessions) == 1
    sessions.clear()
    assert len(sessions) == 0


async def test_a_change_wakes_a_waiter_at_once() -> None:
    changes = Changes()
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiter = asyncio.create_task(changes.wait(5.0))
    await asyncio.sleep(0)  # it waits now
    changes.notify()
    await asyncio.wait_for(waiter, 1.0)
    assert loop.time() - started < 1.0
    await changes.wait(0.01)  # nothing changes: it ends at its timeout
