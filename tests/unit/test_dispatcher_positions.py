"""Start and seek positions resolved per partition: an offset past a partition's end is
refused (naming the first such partition), an unknown end refuses rather than guesses, and
a time older than the WAL is looked up in the cloud tier."""

from __future__ import annotations

import asyncio

import pytest

from danube.bus import NoRespondersError
from danube.dispatcher.positions import check_offset, resolve_all, resolve_start
from danube.meta import TopicName
from danube.wire.dispatcher.errors import OffsetOutOfRangeError, PositionUnavailableError
from danube.wire.ingest.client import WalOffsets

pytestmark = pytest.mark.unit

P0, P1, P2 = TopicName("ns", "t").partitions(3)


class FakeIngest:
    """Each partition's WAL ends; a partition missing from ``ends`` has no owner. Answers
    come in the order of ``delays_s`` (later partitions may answer first)."""

    def __init__(self, ends: dict[TopicName, WalOffsets], delays_s: dict[TopicName, float]) -> None:
        self.ends = ends
        self.delays_s = delays_s
        self.asked: list[TopicName] = []

    async def wal_offsets(self, partition: TopicName, *, timeout_s: float = 5.0) -> WalOffsets:
        self.asked.append(partition)
        await asyncio.sleep(self.delays_s.get(partition, 0.0))
        if partition not in self.ends:
            raise NoRespondersError(f"wal.stats.{partition}")
        return self.ends[partition]

    async def offset_for_time(
        self, partition: TopicName, timestamp_ms: int, *, timeout_s: float = 5.0
    ) -> int:
        # As wal.time does: the WAL start for a time older than the WAL (records at
        # offset o were published at time o here), the end for a newer one.
        wal = await self.wal_offsets(partition)
        return min(max(timestamp_ms, wal.start_offset), wal.durable_next)


class FakeCloud:
    """Objects hold offsets ``[0, uploaded_end)``, published at time = offset; ``None``:
    no cloud reader runs."""

    def __init__(self, uploaded_end: int | None) -> None:
        self.uploaded_end = uploaded_end
        self.asked = 0

    async def offset_for_time(
        self, partition: TopicName, timestamp_ms: int, *, timeout_s: float = 10.0
    ) -> int | None:
        self.asked += 1
        if self.uploaded_end is None:
            raise NoRespondersError(f"cloud.time.{partition}")
        return timestamp_ms if timestamp_ms < self.uploaded_end else None


NO_CLOUD = FakeCloud(None)


def test_an_offset_up_to_the_end_is_fine_past_it_is_refused_with_the_range() -> None:
    wal = WalOffsets(start_offset=5, durable_next=9)
    assert check_offset(P0, 9, wal) == 9  # the end: the next message
    assert check_offset(P0, 2, wal) == 2  # below the WAL start: the cloud tier has it
    with pytest.raises(OffsetOutOfRangeError) as refused:
        check_offset(P0, 1000, wal)
    error = refused.value
    assert error.code == "offset_out_of_range"
    assert (error.partition, error.offset, error.wal_start, error.end) == (str(P0), 1000, 5, 9)
    for named in (str(P0), "1000", "[0, 9]"):  # partition, offset, valid range
        assert named in error.message


async def test_seek_past_the_end_of_any_partition_names_the_first_one_in_order() -> None:
    ends = {
        P0: WalOffsets(0, 50),
        P1: WalOffsets(0, 10),  # 20 is past this one...
        P2: WalOffsets(0, 5),  # ...and this one, which answers first
    }
    ingest = FakeIngest(ends, {P1: 0.05})
    with pytest.raises(OffsetOutOfRangeError) as refused:
        await resolve_all(ingest, NO_CLOUD, [P0, P1, P2], {"offset": 20})
    assert refused.value.partition == str(P1)
    assert await resolve_all(ingest, NO_CLOUD, [P0, P1, P2], {"offset": 5}) == [5, 5, 5]


async def test_an_unknown_end_refuses_an_offset_but_zero_needs_no_answer() -> None:
    ingest = FakeIngest({P0: WalOffsets(0, 10)}, {})
    with pytest.raises(PositionUnavailableError) as unknown:
        await resolve_start(ingest, NO_CLOUD, P1, {"offset": 3})
    assert (unknown.value.code, unknown.value.retriable) == ("position_unavailable", True)
    ingest.asked.clear()
    assert await resolve_start(ingest, NO_CLOUD, P1, {"offset": 0}) == 0
    assert ingest.asked == []
    # Positions other than an offset keep their answers for a partition nobody owns.
    assert await resolve_start(ingest, NO_CLOUD, P1, "latest") == 0
    assert await resolve_start(ingest, NO_CLOUD, P1, "earliest") == 0
    assert await resolve_start(ingest, NO_CLOUD, P0, "latest") == 10


async def test_a_time_older_than_the_wal_is_found_in_the_cloud_tier() -> None:
    # Offsets 0..99 uploaded, the WAL holds 60..119 (its start is 60).
    ingest = FakeIngest({P0: WalOffsets(start_offset=60, durable_next=120)}, {})
    cloud = FakeCloud(uploaded_end=100)
    assert await resolve_start(ingest, cloud, P0, {"timestamp_ms": 1}) == 1
    assert await resolve_start(ingest, cloud, P0, {"timestamp_ms": 0}) == 0
    # Inside the WAL past its start: the WAL's answer, the cloud is not asked.
    cloud.asked = 0
    assert await resolve_start(ingest, cloud, P0, {"timestamp_ms": 75}) == 75
    assert await resolve_start(ingest, cloud, P0, {"timestamp_ms": 500}) == 120
    assert cloud.asked == 0
    # At the WAL start exactly the cloud is asked; its higher (or no) answer loses.
    assert await resolve_start(ingest, FakeCloud(uploaded_end=50), P0, {"timestamp_ms": 60}) == 60
    # Older than the WAL with no cloud reader: refused, never the WAL start in silence.
    with pytest.raises(PositionUnavailableError):
        await resolve_start(ingest, NO_CLOUD, P0, {"timestamp_ms": 1})
    # A WAL that starts at 0 has nothing below it: no cloud needed.
    whole = FakeIngest({P0: WalOffsets(start_offset=0, durable_next=10)}, {})
    assert await resolve_start(whole, NO_CLOUD, P0, {"timestamp_ms": 0}) == 0
