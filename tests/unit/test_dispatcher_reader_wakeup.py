"""A tailing partition reader fetches once per live wake-up: a read that reached the end the
wake-ups announced is not followed by a fetch that could only come back empty; a read short
of it (or a live subject that carries no wake-ups) reads on at once; a wake-up that carries
its frames from the read position is read without a fetch."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from danube.bus import Message, Subjects
from danube.dispatcher import readers
from danube.dispatcher.damage import DamageBook
from danube.dispatcher.events import Action, MessagesAvailable
from danube.dispatcher.readers import PartitionReader, ReadLinks
from danube.frame import RawFrame, append_frame, walk_frames
from danube.meta import TopicName
from danube.wire.ingest.client import FetchReply
from danube.wire.ingest.protocol import Carried, Wakeup

pytestmark = pytest.mark.unit

PARTITION = TopicName("ns", "t")
SETTLE_S = 0.1  # well below readers.IDLE_POLL_S: no idle fetch falls in it


class FakeLive:
    async def unsubscribe(self) -> None:
        return None


class FakeBus:
    subjects = Subjects()

    def __init__(self) -> None:
        self.live: Any = None

    async def subscribe(self, subject: str, callback: Any, **_: Any) -> FakeLive:
        self.live = callback
        return FakeLive()


class FakeCursor:
    read_position = 0


class FakeMachine:
    def __init__(self) -> None:
        self.cursor_ = FakeCursor()

    def cursor(self, name: str) -> FakeCursor:
        return self.cursor_


class LogIngest:
    """A committed log of records; a fetch answers at most ``max_count`` of them."""

    def __init__(self, max_count: int) -> None:
        self.records: list[bytes] = []
        self.max_count = max_count
        self.fetches: list[tuple[int, int]] = []  # (from, messages answered)

    async def fetch_frames(
        self, partition: TopicName, from_offset: int, **limits: Any
    ) -> FetchReply[RawFrame]:
        end = min(len(self.records), from_offset + self.max_count)
        body = bytearray()
        for offset in range(from_offset, end):
            append_frame(body, offset, self.records[offset])
        frames, _ = walk_frames(bytes(body))
        self.fetches.append((from_offset, len(frames)))
        return FetchReply(False, 0, max(end, from_offset), frames)


class FakeRuntime:
    def __init__(self, max_count: int) -> None:
        self.bus = FakeBus()
        self.machine = FakeMachine()
        self.ingest = LogIngest(max_count)
        self.damage = DamageBook()
        self.fed: list[int] = []
        self.frames: list[Any] = []

    def feed(self, event: MessagesAvailable) -> list[Action]:
        assert event.next_offset is not None
        self.fed += [offset for offset, _ in event.messages]
        self.frames += [frame for _, frame in event.messages]
        self.machine.cursor_.read_position = event.next_offset
        return []

    async def run_actions(self, actions: list[Action]) -> None:
        return None

    def notify(self) -> None:
        return None

    def reader(self) -> PartitionReader:
        """A reader of PARTITION wired as the runtime wires one: its cursor's read position,
        each read fed to the machine and its actions carried out."""
        links = ReadLinks(self.bus, self.ingest, self.damage, self.notify, "ns/t/sub")  # type: ignore[arg-type]

        async def deliver(event: MessagesAvailable) -> None:
            await self.run_actions(self.feed(event))

        return PartitionReader(
            links,
            PARTITION,
            PARTITION.topic,
            position=lambda: self.machine.cursor_.read_position,
            deliver=deliver,
        )


async def _commit(runtime: FakeRuntime, count: int, *, wakeup: bool = True) -> None:
    """Append ``count`` records and announce them on the live subject."""
    ingest = runtime.ingest
    ingest.records += [b"record"] * count
    # Without a wake-up: a live body that is not one (frames).
    body = Wakeup(len(ingest.records), count, 6 * count).encode() if wakeup else b"\x00" * 64
    await runtime.bus.live(Message("live", body, {}))
    await asyncio.sleep(SETTLE_S)


async def _reader(runtime: FakeRuntime) -> asyncio.Task[None]:
    reader = runtime.reader()
    task = asyncio.create_task(reader.run())
    await asyncio.sleep(SETTLE_S)  # subscribed, first (empty) fetch made
    assert runtime.bus.live is not None
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_one_fetch_per_wakeup_when_it_reaches_the_announced_end() -> None:
    runtime = FakeRuntime(max_count=1000)
    task = await _reader(runtime)
    try:
        runtime.ingest.fetches.clear()
        await _commit(runtime, 3)
        await _commit(runtime, 2)
        assert runtime.ingest.fetches == [(0, 3), (3, 2)]
        assert runtime.fed == [0, 1, 2, 3, 4]
    finally:
        await _stop(task)


async def test_a_read_short_of_the_announced_end_reads_on_at_once() -> None:
    runtime = FakeRuntime(max_count=2)
    task = await _reader(runtime)
    try:
        runtime.ingest.fetches.clear()
        await _commit(runtime, 5)
        assert runtime.ingest.fetches == [(0, 2), (2, 2), (4, 1)]
        assert runtime.fed == [0, 1, 2, 3, 4]
    finally:
        await _stop(task)


async def test_without_wakeups_it_reads_until_a_fetch_comes_back_empty() -> None:
    runtime = FakeRuntime(max_count=1000)
    task = await _reader(runtime)
    try:
        runtime.ingest.fetches.clear()
        await _commit(runtime, 3, wakeup=False)
        assert runtime.ingest.fetches == [(0, 3), (3, 0)]
        assert runtime.fed == [0, 1, 2]
    finally:
        await _stop(task)


def _carried_body(runtime: FakeRuntime, count: int, payload: bytes = b"live") -> bytes:
    """Append ``count`` records; the wake-up announcing them with their frames."""
    ingest = runtime.ingest
    first = len(ingest.records)
    ingest.records += [b"record"] * count  # what a fetch would answer: not the carried bytes
    frames = bytearray()
    for offset in range(first, first + count):
        append_frame(frames, offset, payload)
    wakeup = Wakeup(first + count, count, len(payload) * count)
    return Carried.encode(first, 0, wakeup, bytes(frames))


async def _commit_carried(runtime: FakeRuntime, count: int) -> None:
    """Append ``count`` records and announce them with their frames (protocol.Carried)."""
    await runtime.bus.live(Message("live", _carried_body(runtime, count), {}))
    await asyncio.sleep(SETTLE_S)


def _payloads(runtime: FakeRuntime) -> list[bytes]:
    return [bytes(frame.record) for frame in runtime.frames]


async def test_a_wakeup_carrying_frames_at_the_read_position_is_taken_without_a_fetch() -> None:
    runtime = FakeRuntime(max_count=1000)
    task = await _reader(runtime)
    try:
        runtime.ingest.fetches.clear()
        await _commit_carried(runtime, 3)
        await _commit_carried(runtime, 2)
        assert runtime.ingest.fetches == []
        assert runtime.fed == [0, 1, 2, 3, 4]
        assert _payloads(runtime) == [b"live"] * 5  # the carried frames, not a fetch's
    finally:
        await _stop(task)


async def test_carried_frames_that_do_not_start_at_the_read_position_are_fetched() -> None:
    """A reader behind (here: a commit announced by a plain wake-up it has not read) fetches
    from its position; the carried frames it passed are dropped, never fed twice."""
    runtime = FakeRuntime(max_count=1000)
    task = await _reader(runtime)
    try:
        runtime.ingest.fetches.clear()
        runtime.ingest.records += [b"record"] * 2  # offsets 0-1, no wake-up heard
        await _commit_carried(runtime, 3)  # offsets 2-4 carried; the reader is at 0
        assert runtime.ingest.fetches == [(0, 5)]
        assert runtime.fed == [0, 1, 2, 3, 4]
        await _commit_carried(runtime, 1)  # at its position now: taken
        assert runtime.ingest.fetches == [(0, 5)]
        assert runtime.fed == [0, 1, 2, 3, 4, 5]
        assert _payloads(runtime) == [b"record"] * 5 + [b"live"]
    finally:
        await _stop(task)


async def test_a_paused_reader_keeps_no_carried_frames_and_fetches_when_it_resumes() -> None:
    runtime = FakeRuntime(max_count=1000)
    reader = runtime.reader()
    task = asyncio.create_task(reader.run())
    try:
        await asyncio.sleep(SETTLE_S)
        runtime.ingest.fetches.clear()
        reader.set_paused(True)
        await _commit_carried(runtime, 2)
        assert len(reader._carried) == 0
        reader.set_paused(False)
        await asyncio.sleep(SETTLE_S)
        assert runtime.ingest.fetches == [(0, 2)]
        # Tailing: at most CARRIED_KEPT (the newest) wait for a read; a pause drops them.
        reader.set_paused(True)
        reader._resumed.set()  # hear wake-ups as a running reader does, without reading
        for _ in range(3):
            await runtime.bus.live(Message("live", _carried_body(runtime, 1), {}))
        assert [c.first_offset for c in reader._carried] == [3, 4]
        reader.set_paused(True)
        assert len(reader._carried) == 0
        reader.set_paused(False)
        await asyncio.sleep(SETTLE_S)
        assert runtime.ingest.fetches == [(0, 2), (2, 3)]
        assert runtime.fed == [0, 1, 2, 3, 4]
    finally:
        await _stop(task)


class WatchedIngest(LogIngest):
    """A LogIngest that says when a fetch was made."""

    def __init__(self, max_count: int) -> None:
        super().__init__(max_count)
        self.fetched = asyncio.Event()

    async def fetch_frames(
        self, partition: TopicName, from_offset: int, **limits: Any
    ) -> FetchReply[RawFrame]:
        reply = await super().fetch_frames(partition, from_offset, **limits)
        self.fetched.set()
        return reply


class HookedRuntime(FakeRuntime):
    """Runs ``during_feed`` (a coroutine function) while the actions of each feed are carried
    out: the reader is then between handing a read over and reading again."""

    def __init__(self, max_count: int) -> None:
        super().__init__(max_count)
        self.ingest: WatchedIngest = WatchedIngest(max_count)
        self.during_feed: Any = None

    async def run_actions(self, actions: list[Action]) -> None:
        if self.during_feed is not None:
            await self.during_feed()


async def _fetch_started(ingest: WatchedIngest, from_offset: int) -> None:
    """Until a fetch from ``from_offset`` was made (bounded: fails the test if never)."""
    async with asyncio.timeout(1.0):
        while not any(start == from_offset for start, _ in ingest.fetches):
            ingest.fetched.clear()
            await ingest.fetched.wait()


async def test_a_catching_up_reader_fetches_the_next_range_while_the_last_is_handed_over() -> None:
    """The fetch from where a read ended is under way before that read's actions are done: a
    reader that fetched only afterwards would never get past the first feed here."""
    runtime = HookedRuntime(max_count=2)
    runtime.ingest.records += [b"record"] * 5  # a backlog: no wake-up announced its end
    seen: list[list[tuple[int, int]]] = []

    async def during_feed() -> None:
        position = runtime.machine.cursor_.read_position
        if position < 5:
            await _fetch_started(runtime.ingest, position)
        seen.append(list(runtime.ingest.fetches))

    runtime.during_feed = during_feed
    task = await _reader(runtime)
    try:
        assert runtime.fed == [0, 1, 2, 3, 4]
        # Each range fetched once, in order: the one sent ahead was the one read.
        assert runtime.ingest.fetches == [(0, 2), (2, 2), (4, 1), (5, 0)]
        assert seen[0] == [(0, 2), (2, 2)]
    finally:
        await _stop(task)


async def test_a_pause_drops_the_fetch_sent_ahead_and_a_resumed_reader_fetches_anew() -> None:
    runtime = HookedRuntime(max_count=2)
    runtime.ingest.records += [b"record"] * 4
    reader = runtime.reader()

    async def pause_after_first_feed() -> None:
        runtime.during_feed = None
        reader.set_paused(True)  # as the machine does when it holds too many

    runtime.during_feed = pause_after_first_feed
    task = asyncio.create_task(reader.run())
    try:
        await asyncio.sleep(SETTLE_S)
        assert runtime.fed == [0, 1]
        assert reader._ahead is None  # dropped with the pause, its reply not kept
        reader.set_paused(False)
        await asyncio.sleep(SETTLE_S)
        assert runtime.fed == [0, 1, 2, 3]  # nothing twice, nothing skipped
        assert runtime.ingest.fetches[-2:] == [(2, 2), (4, 0)]
    finally:
        await _stop(task)


async def test_a_fetch_sent_ahead_is_not_used_when_the_read_position_moved() -> None:
    """A seek while a read is handed over: the reply fetched ahead (from the old end) is
    dropped and the reader fetches from the new position."""
    runtime = HookedRuntime(max_count=2)
    runtime.ingest.records += [b"record"] * 4

    async def seek_back_once() -> None:
        runtime.during_feed = None
        await _fetch_started(runtime.ingest, 2)
        runtime.machine.cursor_.read_position = 0  # fed [0, 1]; then moved back to 0

    runtime.during_feed = seek_back_once
    task = await _reader(runtime)
    try:
        assert runtime.fed == [0, 1, 0, 1, 2, 3]
        assert runtime.ingest.fetches[:3] == [(0, 2), (2, 2), (0, 2)]
    finally:
        await _stop(task)


async def test_idle_polls_back_off_and_a_wakeup_brings_them_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no wake-up, the reader fetches anyway, each time after twice the wait of the last
    idle fetch that found nothing, up to IDLE_POLL_MAX_S; a wake-up, or an idle fetch that
    found something (its wake-up was lost), starts again from IDLE_POLL_S."""
    monkeypatch.setattr(readers, "IDLE_POLL_S", 0.02)
    monkeypatch.setattr(readers, "IDLE_POLL_MAX_S", 0.4)
    runtime = HookedRuntime(max_count=1000)
    reader = runtime.reader()
    loop = asyncio.get_running_loop()
    times: list[float] = []

    async def fetches(count: int) -> list[float]:
        """The gaps between the next ``count`` fetches (bounded: fails if they never come)."""
        times.clear()
        async with asyncio.timeout(5.0):
            while len(times) < count + 1:
                runtime.ingest.fetched.clear()
                await runtime.ingest.fetched.wait()
                times.append(loop.time())
        return [b - a for a, b in itertools.pairwise(times)]

    task = asyncio.create_task(reader.run())
    try:
        gaps = await fetches(5)
        # At least each doubled wait (a timer may fire ~1 ms early; a loaded machine only
        # makes a gap longer): without the backoff every gap would be 0.02.
        waits = (0.02, 0.04, 0.08, 0.16, 0.32)
        assert all(gap >= 0.9 * wait for gap, wait in zip(gaps, waits, strict=True)), gaps
        assert (await fetches(1))[0] >= 0.39
        assert reader.idle_wait_s() == 0.4  # capped at IDLE_POLL_MAX_S (0.64 uncapped)
        # A wake-up: read at once, then the waits start again from IDLE_POLL_S.
        runtime.ingest.records += [b"record"] * 2
        gaps_after = asyncio.create_task(fetches(2))
        await asyncio.sleep(0)  # the task waits for the next fetch
        await runtime.bus.live(Message("live", Wakeup(2, 2, 12).encode(), {}))
        gaps = await gaps_after  # the read the wake-up made, then two idle ones
        assert runtime.fed == [0, 1]
        assert gaps[0] < 0.2, gaps  # 0.02, not the 0.4 it had backed off to
        await fetches(4)  # backed off again
        runtime.ingest.records += [b"record"]  # committed, its wake-up lost
        async with asyncio.timeout(5.0):
            while runtime.fed != [0, 1, 2]:
                runtime.ingest.fetched.clear()
                await runtime.ingest.fetched.wait()
        assert reader.idle_wait_s() == 0.02
    finally:
        await _stop(task)
