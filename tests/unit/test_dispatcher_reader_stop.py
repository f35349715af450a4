"""A partition reader stops when cancelled even if the cancel is swallowed by the fetch it
lands in (asyncio.wait_for on Python 3.11 can return the reply and drop the cancel)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import pytest

from danube.bus import Subjects
from danube.dispatcher.damage import DamageBook
from danube.dispatcher.events import Action, MessagesAvailable, PauseReading
from danube.dispatcher.readers import PartitionReader, ReadLinks
from danube.frame import RawFrame, append_frame, walk_frames
from danube.meta import TopicName
from danube.wire.ingest.client import FetchReply

pytestmark = pytest.mark.unit

PARTITION = TopicName("ns", "t")


class FakeLive:
    async def unsubscribe(self) -> None:
        return None


class FakeBus:
    subjects = Subjects()

    async def subscribe(self, subject: str, callback: Any, **_: Any) -> FakeLive:
        return FakeLive()


@dataclass
class FakeCursor:
    read_position: int = 0


@dataclass
class FakeMachine:
    cursor_: FakeCursor = field(default_factory=FakeCursor)

    def cursor(self, name: str) -> FakeCursor:
        return self.cursor_


class SwallowingIngest:
    """A fetch that, once cancelled, still answers (as a wait_for whose reply arrived in the
    same turn of the loop does on Python 3.11)."""

    def __init__(self) -> None:
        self.fetching = asyncio.Event()

    async def fetch_frames(
        self, partition: TopicName, from_offset: int, **limits: Any
    ) -> FetchReply[RawFrame]:
        self.fetching.set()
        with contextlib.suppress(asyncio.CancelledError):  # swallowed
            await asyncio.sleep(3600)
        body = bytearray()
        append_frame(body, from_offset, b"record")
        frames, _ = walk_frames(bytes(body))
        return FetchReply(False, 0, from_offset + 1, frames)  # a message: read on at once


class FakeRuntime:
    def __init__(self) -> None:
        self.bus = FakeBus()
        self.machine = FakeMachine()
        self.ingest = SwallowingIngest()
        self.damage = DamageBook()
        self.reader: PartitionReader | None = None

    def feed(self, event: MessagesAvailable) -> list[Action]:
        assert event.next_offset is not None
        self.machine.cursor_.read_position = event.next_offset
        return [PauseReading(event.partition)]  # memory full: the reader waits paused

    async def run_actions(self, actions: list[Action]) -> None:
        assert self.reader is not None
        self.reader.set_paused(True)


async def test_a_swallowed_cancel_still_stops_the_reader() -> None:
    runtime = FakeRuntime()
    links = ReadLinks(runtime.bus, runtime.ingest, runtime.damage, lambda: None, "ns/t/sub")  # type: ignore[arg-type]

    async def deliver(event: MessagesAvailable) -> None:
        await runtime.run_actions(runtime.feed(event))

    reader = PartitionReader(
        links,
        PARTITION,
        PARTITION.topic,
        position=lambda: runtime.machine.cursor_.read_position,
        deliver=deliver,
    )
    runtime.reader = reader
    task = asyncio.create_task(reader.run())
    await runtime.ingest.fetching.wait()
    task.cancel()
    await asyncio.wait({task}, timeout=2)
    stopped = task.done()
    if not stopped:
        task.cancel()  # the second cancel lands where the reader waits: clean up
        await asyncio.wait({task})
    assert stopped
    assert task.cancelled()
