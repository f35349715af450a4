"""Retry loops survive more than 1 024 consecutive failures (``2**failures`` used to overflow a
float there) and wait a bounded, jittered delay each time: the helper and its callers; the
uploader owns the task that releases a fenced partition."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from danube.bus import NoRespondersError, Subjects
from danube.config import DanubeSettings
from danube.dispatcher.damage import DamageBook
from danube.dispatcher.events import MessagesAvailable
from danube.dispatcher.readers import PartitionReader, ReadLinks
from danube.frame import RawFrame
from danube.ingest.node import Node as IngestNode
from danube.meta import TopicName
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.errors import MetaUnavailableError
from danube.storage.errors import StorageUnavailableError
from danube.uploader.node import UploaderNode, _Worker
from danube.uploader.upload import UploadFencedError
from danube.wire.dispatcher.client import DispatcherClient
from danube.wire.ingest.client import FetchReply

pytestmark = pytest.mark.unit

PARTITION = TopicName("ns", "t")
FAILURES = 1100  # past 1 024: float(2**1024) overflows


class RecordedSleeps:
    """Replaces asyncio.sleep: records each delay and yields without waiting; the test's
    ``stop`` runs once ``FAILURES`` delays were asked for."""

    def __init__(self, real_sleep: Callable[[float], Coroutine[Any, Any, None]]) -> None:
        self.delays: list[float] = []
        self.enough = asyncio.Event()
        self._real_sleep = real_sleep

    async def __call__(self, delay_s: float, *_: Any) -> None:
        self.delays.append(delay_s)
        if len(self.delays) >= FAILURES:
            self.enough.set()
        await self._real_sleep(0)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> RecordedSleeps:
    recorded = RecordedSleeps(asyncio.sleep)
    monkeypatch.setattr(asyncio, "sleep", recorded)
    return recorded


async def _run_until_enough(task: asyncio.Future[Any], sleeps: RecordedSleeps) -> None:
    enough = asyncio.ensure_future(sleeps.enough.wait())
    done, _ = await asyncio.wait({task, enough}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    enough.cancel()
    assert task not in done, f"the retry loop ended: {task.exception()!r}"
    assert sleeps.enough.is_set()
    task.cancel()
    await asyncio.wait({task})


def test_backoff_is_bounded_for_any_failure_count() -> None:
    for attempt in (-5, 0, 1, 10, 1023, 1024, 1100, 10**6, 10**100):
        delay_s = backoff_s(attempt, base_s=0.1, cap_s=5.0)
        assert 0.0 <= delay_s <= 5.0
    assert backoff_s(10**100, base_s=0.1, cap_s=5.0, rng=lambda: 0.0) == 2.5  # half the cap
    assert backoff_s(0, base_s=0.1, cap_s=5.0, rng=lambda: 1.0) == pytest.approx(0.1)


# --- the dispatcher's partition reader ------------------------------------------------------


class _Live:
    async def unsubscribe(self) -> None:
        return None


class _Bus:
    subjects = Subjects()

    async def subscribe(self, subject: str, callback: Any, **_: Any) -> _Live:
        return _Live()

    async def reconnect_stale(self) -> None:  # the node's bus watch holds it; never called
        return None


class _DownIngest:
    """Every fetch times out (the partition's owner is unreachable)."""

    def __init__(self) -> None:
        self.fetches = 0

    async def fetch_frames(
        self, partition: TopicName, from_offset: int, **_: Any
    ) -> FetchReply[RawFrame]:
        self.fetches += 1
        raise TimeoutError("fetch timed out")


async def _never_delivered(event: MessagesAvailable) -> None:
    raise AssertionError("every fetch fails: nothing is read")


async def test_reader_keeps_retrying_past_1024_failures(sleeps: RecordedSleeps) -> None:
    ingest = _DownIngest()
    links = ReadLinks(_Bus(), ingest, DamageBook(), lambda: None, "ns/t/sub")  # type: ignore[arg-type]
    reader = PartitionReader(links, PARTITION, "sub", position=lambda: 0, deliver=_never_delivered)
    await _run_until_enough(asyncio.create_task(reader.run()), sleeps)
    assert ingest.fetches >= FAILURES
    assert max(sleeps.delays) <= 2.0
    assert min(sleeps.delays[20:]) >= 1.0  # at the cap (equal jitter keeps half of it)


# --- the uploader's partition worker --------------------------------------------------------


class _StoreDownUploader:
    """A partition uploader whose object store is away: every cycle fails."""

    partition = PARTITION

    def __init__(self) -> None:
        self.cycles = 0

    async def cycle(self) -> int:
        self.cycles += 1
        raise StorageUnavailableError("object store unreachable", op="put", key="k")


class _NoIngest:
    async def wal_offsets(self, partition: TopicName) -> Any:
        raise NoRespondersError("wal_offsets")


async def test_upload_worker_survives_a_long_object_store_outage(sleeps: RecordedSleeps) -> None:
    settings = DanubeSettings()
    node = UploaderNode(
        settings,
        node_id="u1",
        bus=_Bus(),  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        lease=None,  # type: ignore[arg-type]
        objects=None,  # type: ignore[arg-type]
    )
    node.ingest = _NoIngest()  # type: ignore[assignment]
    uploader = _StoreDownUploader()
    task = asyncio.create_task(node._work(PARTITION))
    node._workers[PARTITION] = _Worker(uploader, task)  # type: ignore[arg-type]
    await _run_until_enough(task, sleeps)
    assert uploader.cycles >= FAILURES
    assert max(sleeps.delays) <= 10.0
    assert min(sleeps.delays[20:]) >= 5.0


# --- the ingest node's partition watch ------------------------------------------------------


class _BrokenWatch:
    async def __aenter__(self) -> Any:
        raise MetaUnavailableError("etcd unreachable")

    async def __aexit__(self, *_: object) -> None:
        return None


class _EtcdDown:
    def __init__(self) -> None:
        self.watches = 0

    def watch_prefix(self, prefix: bytes, *, start_revision: int | None = None) -> _BrokenWatch:
        self.watches += 1
        return _BrokenWatch()


class _Lease:
    alive = True  # read by the node's leaseless gauge, which outlives the test

    def on_lost(self, callback: Any) -> None:
        return None


async def test_ingest_watch_keeps_retrying_past_1024_failures(sleeps: RecordedSleeps) -> None:
    settings = DanubeSettings()  # the node touches no disk until a replica opens
    store = _EtcdDown()
    node = IngestNode(
        settings,
        node_id="i1",
        bus=_Bus(),  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        lease=_Lease(),  # type: ignore[arg-type]
    )
    await _run_until_enough(asyncio.create_task(node.watch()), sleeps)
    assert store.watches >= FAILURES
    assert max(sleeps.delays) <= 5.0


# --- the dispatcher client: a long deadline allows more than 1 024 retries ------------------


class _NobodyBus:
    subjects = Subjects()

    def __init__(self) -> None:
        self.requests = 0

    async def request(self, subject: str, body: bytes, **_: Any) -> Any:
        self.requests += 1
        raise NoRespondersError(subject)


async def test_dispatcher_client_retries_past_1024_attempts(sleeps: RecordedSleeps) -> None:
    bus = _NobodyBus()
    client = DispatcherClient(bus, timeout_s=300.0)  # type: ignore[arg-type]
    # The patched sleep takes no time, so only the count of attempts ends this.
    call = client.attach(TopicName("ns", "t"), "sub", "c1")
    await _run_until_enough(asyncio.ensure_future(call), sleeps)
    assert bus.requests >= FAILURES
    assert max(sleeps.delays) <= 0.5


# --- the uploader lets a fenced partition go in a task it owns ------------------------------


class _FencedUploader:
    partition = PARTITION
    assignment_revision = 7

    async def cycle(self) -> int:
        raise UploadFencedError("another uploader holds the assignment")


class _SlowDeleteStore:
    """compare_and_delete takes a while (etcd is slow): the release is still under way."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> bool:
        for _ in range(20):
            await asyncio.sleep(0)
        self.deleted.append(key)
        return True


async def test_close_waits_for_the_release_of_a_fenced_partition() -> None:
    store = _SlowDeleteStore()
    node = UploaderNode(
        DanubeSettings(),
        node_id="u1",
        bus=_Bus(),  # type: ignore[arg-type]
        store=store,  # type: ignore[arg-type]
        lease=None,  # type: ignore[arg-type]
        objects=None,  # type: ignore[arg-type]
    )
    node.ingest = _NoIngest()  # type: ignore[assignment]
    task = asyncio.create_task(node._work(PARTITION))
    node._workers[PARTITION] = _Worker(_FencedUploader(), task)  # type: ignore[arg-type]
    await asyncio.wait({task})  # fenced: the worker hands the release to another task
    assert node.partitions == []  # popped at once by the release
    await node.close()  # must not return with the release (its etcd delete) still under way
    assert store.deleted == [meta_keys.uploader_assignment_key(PARTITION)]
