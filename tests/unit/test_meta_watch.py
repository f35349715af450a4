"""Watch buffering against a fake aetcd stream: bounded buffer, overflow, errors, cleanup."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aetcd
import pytest

from danube.meta.errors import WatchCompactedError, WatchError, WatchOverflowError
from danube.meta.watch import Watch, WatchEvent

pytestmark = pytest.mark.unit

PREFIX = b"/danube/"


@dataclass
class FakeKv:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int = 1
    lease: int = 0


@dataclass
class FakeEvent:
    kind: str
    kv: FakeKv


def put(key: str, revision: int, value: bytes = b"v") -> FakeEvent:
    return FakeEvent("PUT", FakeKv(PREFIX + key.encode(), value, revision, revision))


class FakeStream:
    """aetcd's ``Watch``: an async iterator fed by the test, ended by ``cancel()``."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()  # unbounded, like aetcd's
        self.cancelled = asyncio.Event()
        self.start_revisions: list[int | None] = []

    def feed(self, *items: Any) -> None:
        for item in items:
            self.queue.put_nowait(item)

    async def cancel(self) -> None:
        self.cancelled.set()
        self.queue.put_nowait(None)

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> FakeEvent:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, FakeEvent)
        return item


def make_watch(stream: FakeStream, *, buffer_size: int = 8, start: int | None = None) -> Watch:
    async def create(revision: int | None) -> FakeStream:
        stream.start_revisions.append(revision)
        return stream

    return Watch(
        create,
        prefix_bytes=len(PREFIX),
        start_revision=start,
        buffer_size=buffer_size,
        cancel_timeout_s=1.0,
    )


async def _next(watch: Watch) -> WatchEvent:
    return await asyncio.wait_for(anext(watch), 1.0)


async def test_events_arrive_in_order_with_keys_relative_to_the_prefix() -> None:
    stream = FakeStream()
    deleted = FakeEvent("DELETE", FakeKv(PREFIX + b"a/1", b"", 0, 12))
    async with make_watch(stream, start=10) as watch:
        stream.feed(put("a/1", 10, b"x"), put("a/2", 11, b"y"), deleted)
        got = [await _next(watch) for _ in range(3)]
    assert got == [
        WatchEvent("put", "a/1", b"x", 10, 10, 0),
        WatchEvent("put", "a/2", b"y", 11, 11, 0),
        WatchEvent("delete", "a/1", b"", 12, 0, 0),
    ]
    assert stream.start_revisions == [10]
    assert watch.last_revision == 12


async def test_a_slow_consumer_gets_the_buffer_then_an_overflow_error_to_resume_from() -> None:
    stream = FakeStream()
    watch = await make_watch(stream, buffer_size=3).start()
    stream.feed(*(put(f"k{i}", 20 + i) for i in range(6)))
    await asyncio.wait_for(stream.cancelled.wait(), 1.0)  # the pump gave up on its own
    got = [(await _next(watch)).mod_revision for _ in range(3)]
    assert got == [20, 21, 22]
    with pytest.raises(WatchOverflowError) as info:
        await _next(watch)
    assert info.value.resume_revision == 23  # the first event that did not fit
    assert info.value.buffer_size == 3
    assert info.value.retriable
    await watch.aclose()


async def test_compaction_is_raised_after_the_buffered_events() -> None:
    stream = FakeStream()
    async with make_watch(stream) as watch:
        stream.feed(put("a", 30), put("b", 31), aetcd.RevisionCompactedError(40))
        assert (await _next(watch)).key == "a"
        assert (await _next(watch)).key == "b"
        with pytest.raises(WatchCompactedError) as info:
            await _next(watch)
    assert info.value.compact_revision == 40
    assert info.value.resume_revision == 32
    assert info.value.code == "revision_compacted"


async def test_a_lost_connection_is_a_retriable_watch_error_with_a_resume_point() -> None:
    stream = FakeStream()
    async with make_watch(stream, start=5) as watch:
        stream.feed(aetcd.ConnectionFailedError("connection refused"))
        with pytest.raises(WatchError) as info:
            await _next(watch)
    assert info.value.code == "meta_unavailable"
    assert info.value.retriable
    assert info.value.resume_revision == 5  # nothing received: resume where it started


async def test_a_stream_that_ends_by_itself_is_reported_as_closed() -> None:
    stream = FakeStream()
    async with make_watch(stream) as watch:
        stream.feed(put("a", 7), None)
        assert (await _next(watch)).key == "a"
        with pytest.raises(WatchError) as info:
            await _next(watch)
    assert info.value.code == "watch_closed"
    assert info.value.resume_revision == 8


async def test_leaving_the_block_cancels_the_etcd_watch_and_ends_iteration() -> None:
    stream = FakeStream()
    async with make_watch(stream) as watch:
        pass
    assert stream.cancelled.is_set()
    with pytest.raises(StopAsyncIteration):
        await _next(watch)
    await watch.aclose()  # idempotent


async def test_iterating_an_unstarted_watch_starts_it() -> None:
    stream = FakeStream()
    watch = make_watch(stream)
    stream.feed(put("a", 3))
    assert (await _next(watch)).key == "a"
    assert stream.start_revisions == [None]
    await watch.aclose()
