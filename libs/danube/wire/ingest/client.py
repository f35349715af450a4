"""How other services talk to ingest over the bus: produce to, fetch from and find a time in
a partition.

Discovery produces through :meth:`IngestClient.produce`; the uploader and dispatchers
read through :meth:`IngestClient.fetch`. A produce that finds no leader asks the ingest
queue group to place the partition (if it has no replicas yet) and waits for a leader, then
retries, all within the call's deadline; when no leader comes, it raises the reason
(``partition_unavailable``, ``not_enough_replicas``) rather than a bare timeout. A produce
whose leader dies with the request in flight is sent again to the next leader once a probe
sees the leader move (danube.wire.leader_watch): answered within the lease TTL + 2 s, not at
the deadline, and possibly stored twice (at least once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import orjson

from danube.aio import awaited_task
from danube.bus import Bus, BusTimeoutError, NoRespondersError, RemoteError, Reply, TopicName
from danube.frame import Frame, RawFrame, decode_frames, walk_frames
from danube.wire.claim import request_with_claim
from danube.wire.ingest import control, protocol
from danube.wire.ingest.control import SegmentInfo
from danube.wire.leader_watch import (
    PROBE_AFTER_S,
    PROBE_EVERY_S,
    Leader,
    await_watching_leader,
)
from danube.wire.limits import BACKLOG_QUOTA_EXCEEDED, RATE_LIMITED, PartitionLimits

log = logging.getLogger(__name__)

# The code of danube.ingest.leadership.PartitionUnavailableError: no in-sync replica of the
# partition is alive, so retrying within one request's deadline cannot help.
UNAVAILABLE = "partition_unavailable"
# A probe (who leads?) waits this long for the first node's answer.
_PROBE_TIMEOUT_S = 1.0
# Slow requests to one partition share a probe started this recently (and after they were
# sent): in an outage every waiting request asks the same question, and every ingest node
# answers each probe from etcd. One shared probe per partition and window, not one per request.
_PROBE_SHARE_S = 0.25
# Retriable, but not within one request: a full disk stays full, and a partition with no live
# in-sync replica stays without a leader, for longer than a produce deadline, so the producer
# hears it at once (and retries on its own schedule).
# A partition over its rate or backlog quota (danube.wire.limits) is answered at once too: the
# producer is told to slow down, not held.
_RETRY_LATER_CODES = frozenset({"disk_full", UNAVAILABLE, RATE_LIMITED, BACKLOG_QUOTA_EXCEEDED})


F = TypeVar("F", Frame, RawFrame)


@dataclass(frozen=True)
class FetchReply(Generic[F]):
    """A fetch answer. ``below_wal_start``: read ``[from, wal_start)`` from the cloud tier.
    ``damaged``: the WAL has no intact frame in that range (read it from the cloud tier).
    ``frames``: checked :class:`Frame` s (:meth:`IngestClient.fetch`), or :class:`RawFrame` s
    as the WAL holds them (:meth:`IngestClient.fetch_frames`)."""

    below_wal_start: bool
    wal_start: int
    next_offset: int
    frames: list[F]
    damaged: protocol.Damaged | None = None


@dataclass(frozen=True)
class WalOffsets:
    """Where a partition's WAL starts and its durable next offset (from ``wal.stats``)."""

    start_offset: int
    durable_next: int
    """The partition's readable end: its high watermark (committed on every in-sync replica)."""


class IngestClient:
    """Produce to and fetch from the ingest node owning a partition."""

    def __init__(
        self,
        bus: Bus,
        *,
        probe_after_s: float = PROBE_AFTER_S,
        probe_every_s: float = PROBE_EVERY_S,
    ) -> None:
        """``probe_after_s``, ``probe_every_s``: when a slow produce first asks who leads,
        then how often (danube.wire.leader_watch)."""
        self.bus = bus
        self.probe_after_s = probe_after_s
        self.probe_every_s = probe_every_s
        # The latest probe of each partition with a slow request: (started at, its answer);
        # forgotten _PROBE_SHARE_S after it ends, so it holds the partitions probed lately.
        self._probes: dict[TopicName, tuple[float, asyncio.Task[Leader | None]]] = {}

    async def produce(
        self,
        partition: TopicName,
        records: Sequence[bytes],
        *,
        timeout_s: float,
        limits: PartitionLimits | None = None,
    ) -> int:
        """Append encoded records; return the first offset. Retries retriable failures
        (no owner yet, owner moving) with jittered backoff until ``timeout_s`` runs out.
        ``limits``: the partition's share of its topic's policies, enforced by its leader
        (``rate_limited`` and ``backlog_quota_exceeded`` are raised at once)."""
        body = protocol.encode_produce_request(records)
        return await self.produce_body(partition, body, timeout_s=timeout_s, limits=limits)

    async def produce_body(
        self,
        partition: TopicName,
        body: bytes,
        *,
        timeout_s: float,
        limits: PartitionLimits | None = None,
    ) -> int:
        """:meth:`produce` of a request body already packed (either layout of
        :mod:`danube.wire.ingest.protocol`, e.g. produced frames passed on as they came)."""
        reply = await self.produce_answer(partition, body, timeout_s=timeout_s, limits=limits)
        return reply.first_offset

    async def produce_answer(
        self,
        partition: TopicName,
        body: bytes,
        *,
        timeout_s: float,
        limits: PartitionLimits | None = None,
    ) -> protocol.ProduceReply:
        """:meth:`produce_body` with the whole reply: also whether the records were an
        idempotent producer's resend, stored before."""
        headers = None if limits is None or limits.empty else limits.headers()

        async def attempt(deadline: float) -> protocol.ProduceReply:
            reply = await self._attempt(partition, body, deadline, headers)
            return protocol.decode_produce_reply(reply)

        return await request_with_claim(
            attempt,
            lambda deadline: self._ask_claim(partition, deadline),
            timeout_s=timeout_s,
            timeout_message=f"produce to {partition}: no durable answer in {timeout_s}s",
            give_up_codes=_RETRY_LATER_CODES,
        )

    async def _attempt(
        self,
        partition: TopicName,
        body: bytes,
        deadline: float,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        """One produce request, watched while it is slow (danube.wire.leader_watch): every
        second or so, ask who leads. The node holding the request may be gone (SIGKILL: it
        never answers) or frozen (it keeps its bus subscription though its lease, and
        leadership, are gone): once a probe names another leader or epoch than the first
        probe did, or none, the request is abandoned with ``not_owner`` (retriable; it may
        have been stored: at least once) and :meth:`produce_body` sends it again. With no
        in-sync replica alive the answer is ``partition_unavailable`` at once, not a bare
        timeout at the deadline."""
        remaining_s = max(deadline - asyncio.get_running_loop().time(), 0.001)
        subject = self.bus.subjects.produce(partition)
        request = self.bus.request(subject, body, timeout_s=remaining_s, headers=headers)
        return await self._watched(partition, subject, request, deadline)

    async def _watched(
        self, partition: TopicName, subject: str, request: Awaitable[Reply], deadline: float
    ) -> bytes:
        """``request``'s reply body, given up with ``not_owner`` (LeaderMovedError) once
        the partition's leader moved while it was in flight."""
        sent_at = asyncio.get_running_loop().time()
        sent_ms = int(time.time() * 1000)
        reply = await await_watching_leader(
            request,
            lambda probe_deadline: self._probe(partition, probe_deadline, sent_at=sent_at),
            deadline=deadline,
            subject=subject,
            give_up_codes=_RETRY_LATER_CODES,
            probe_after_s=self.probe_after_s,
            probe_every_s=self.probe_every_s,
            sent_ms=sent_ms,
        )
        return reply.body

    async def _probe(
        self, partition: TopicName, deadline: float, *, sent_at: float
    ) -> Leader | None:
        """Who leads the partition: the answer of a probe started in the last
        ``_PROBE_SHARE_S`` and not before the request was sent (``sent_at``), else of a new
        one. A waiter's cancel leaves a shared probe to the others."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        latest = self._probes.get(partition)
        if latest is None or latest[0] < max(sent_at, now - _PROBE_SHARE_S):
            task = awaited_task(self._ask_leader(partition, deadline), name="leader probe")
            latest = (now, task)
            self._probes[partition] = latest
            task.add_done_callback(lambda done: self._probe_done(partition, done))
        return await asyncio.shield(latest[1])

    def _probe_done(self, partition: TopicName, done: asyncio.Task[Leader | None]) -> None:
        def forget() -> None:
            latest = self._probes.get(partition)
            if latest is not None and latest[1] is done:
                del self._probes[partition]

        asyncio.get_running_loop().call_later(_PROBE_SHARE_S, forget)

    async def _ask_leader(self, partition: TopicName, deadline: float) -> Leader | None:
        """Ask every ingest node who leads the partition; the first answer wins (a frozen
        node keeps its subscription but never answers). None when nobody answered; the
        RemoteError when a node says none can (``partition_unavailable``)."""
        remaining_s = deadline - asyncio.get_running_loop().time()
        try:
            reply = await self.bus.request(
                self.bus.subjects.leader_probe(partition),
                b"",
                timeout_s=max(min(remaining_s, _PROBE_TIMEOUT_S), 0.001),
            )
        except (NoRespondersError, BusTimeoutError):
            return None
        try:
            node_id, epoch, since_ms = control.decode_probe_reply(reply.body)
        except protocol.BadRequestError as exc:
            log.warning("%s: %s", partition, exc)
            return None  # nothing learned; the request is still awaited
        return Leader(node_id, epoch, since_ms)

    async def place(self, partition: TopicName, *, timeout_s: float) -> RemoteError | None:
        """Ask the ``ingest`` queue group to place ``partition`` (its replica set, its
        leader's claim) and wait, up to ``timeout_s``, until the leader serves: what a first
        produce does before its first attempt. The reason when there can be no leader now
        (e.g. ``not_enough_replicas``); None when placed, or when nobody answered in time
        (the next produce claims again)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        return await self._ask_claim(partition, deadline)

    async def _ask_claim(self, partition: TopicName, deadline: float) -> RemoteError | None:
        """Ask an ingest node to place the partition and wait for its leader; the reason
        when it says there is none."""
        remaining_s = deadline - asyncio.get_running_loop().time()
        if remaining_s <= 0:
            return None
        try:
            await self.bus.request(
                self.bus.subjects.ownership(partition), b"", timeout_s=remaining_s
            )
        except RemoteError as exc:
            return exc
        except (NoRespondersError, BusTimeoutError):
            pass  # no ingest up yet: the produce retry finds out
        return None

    async def wal_offsets(self, partition: TopicName, *, timeout_s: float = 5.0) -> WalOffsets:
        """The WAL's start and durable next offset; NoRespondersError when nobody owns the
        partition (nothing was produced to it, or its owner is gone)."""
        reply = await self.bus.request(
            self.bus.subjects.wal_stats(partition), b"", timeout_s=timeout_s
        )
        try:
            doc = orjson.loads(reply.body)
            wal = doc["wal"]
            # Readers see up to the high watermark: what every in-sync replica holds.
            return WalOffsets(int(wal["start_offset"]), int(doc["high_watermark"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise protocol.BadRequestError(f"bad wal.stats reply from {partition}") from exc

    async def offset_for_time(
        self, partition: TopicName, timestamp_ms: int, *, timeout_s: float = 5.0
    ) -> int:
        """The first offset of ``partition`` published at or after ``timestamp_ms`` (its WAL
        start when the time is older; the next offset when it is newer than everything).
        NoRespondersError when nobody owns the partition."""
        reply = await self.bus.request(
            self.bus.subjects.wal_offset_for_time(partition),
            protocol.encode_timestamp(timestamp_ms),
            timeout_s=timeout_s,
        )
        return protocol.decode_offset(reply.body)

    async def fetch(
        self,
        partition: TopicName,
        from_offset: int,
        *,
        max_bytes: int = 1 << 20,
        max_count: int = 10_000,
        timeout_s: float = 5.0,
    ) -> FetchReply[Frame]:
        """Durable messages from ``from_offset`` on (CRC-checked), or where the WAL starts."""
        body = await self._fetch(partition, from_offset, max_bytes, max_count, timeout_s)
        return _fetch_reply(partition, from_offset, body, decode_frames)

    async def fetch_frames(
        self,
        partition: TopicName,
        from_offset: int,
        *,
        max_bytes: int = 1 << 20,
        max_count: int = 10_000,
        timeout_s: float = 5.0,
    ) -> FetchReply[RawFrame]:
        """:meth:`fetch`, the frames left as ingest sent them (checked where it read them,
        to be checked by whoever decodes their records): split, not checked, not copied."""
        body = await self._fetch(partition, from_offset, max_bytes, max_count, timeout_s)
        return _fetch_reply(partition, from_offset, body, walk_frames)

    async def _fetch(
        self,
        partition: TopicName,
        from_offset: int,
        max_bytes: int,
        max_count: int,
        timeout_s: float,
    ) -> bytes:
        # A fetch held by a leader that died is given up once a probe sees the leader move
        # (not_owner, retriable: readers fetch again, from the new leader), not at its timeout.
        deadline = asyncio.get_running_loop().time() + timeout_s
        subject = self.bus.subjects.wal_fetch(partition)
        fetch = protocol.FetchRequest(from_offset, max_bytes, max_count).encode()
        request = self.bus.request(subject, fetch, timeout_s=timeout_s)
        return await self._watched(partition, subject, request, deadline)

    async def wal_segments(
        self, partition: TopicName, *, max_segments: int, timeout_s: float = 5.0
    ) -> WalListing:
        """The WAL's sizes and its ``max_segments`` oldest segments (``wal.stats``).
        NoRespondersError when nobody owns the partition."""
        reply = await self.bus.request(
            self.bus.subjects.wal_stats(partition),
            control.encode_stats_request(max_segments),
            timeout_s=timeout_s,
        )
        return WalListing.decode(reply.body)

    async def drop_below(
        self, partition: TopicName, below_offset: int, *, timeout_s: float = 30.0
    ) -> tuple[int, int]:
        """Ask the owner to delete the sealed segments wholly below ``below_offset``;
        ``(segments removed, new WAL start)``."""
        reply = await self.bus.request(
            self.bus.subjects.wal_drop_below(partition),
            protocol.encode_offset(below_offset),
            timeout_s=timeout_s,
        )
        return protocol.decode_drop_reply(reply.body)


@dataclass(frozen=True)
class WalListing:
    """A ``wal.stats`` answer with its segment list: ``segments`` are the oldest ones, all of
    them when ``len(segments) == segment_count`` (the last is then the active segment)."""

    node_id: str
    epoch: int
    now_ms: int
    """The ingest host's clock when it listed: segment ages are measured against it."""
    start_offset: int
    durable_next: int
    disk_bytes: int
    segment_count: int
    segments: list[SegmentInfo]

    @classmethod
    def decode(cls, body: bytes) -> WalListing:
        """Parse and check a stats reply; BadRequestError if a field is missing or wrong."""
        try:
            doc = orjson.loads(body)
            wal = doc["wal"]
            segments = [
                SegmentInfo(
                    first_offset=_count(item["first_offset"]),
                    next_offset=_count_or_none(item["next_offset"]),
                    size_bytes=_count(item["size_bytes"]),
                    sealed=_flag(item["sealed"]),
                    modified_ms=_count(item["modified_ms"]),
                )
                for item in doc["segments"]
            ]
            listing = cls(
                node_id=str(doc["node_id"]),
                epoch=_count(doc["epoch"]),
                now_ms=_count(doc["now_ms"]),
                start_offset=_count(wal["start_offset"]),
                durable_next=_count(wal["durable_next"]),
                disk_bytes=_count(wal["disk_bytes"]),
                segment_count=_count(wal["segments"]),
                segments=segments,
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise protocol.BadRequestError(f"bad wal.stats reply: {exc!r}") from exc
        if len(segments) > listing.segment_count:
            raise protocol.BadRequestError("wal.stats lists more segments than it counts")
        firsts = [segment.first_offset for segment in segments]
        if firsts != sorted(set(firsts)):
            raise protocol.BadRequestError("wal.stats segments are not in offset order")
        return listing


def _count(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _count_or_none(value: object) -> int | None:
    return None if value is None else _count(value)


def _flag(value: object) -> bool:
    if type(value) is not bool:
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def carried_reply(partition: TopicName, carried: protocol.Carried) -> FetchReply[RawFrame]:
    """What a WAL fetch from ``carried.first_offset`` would answer, from the frames a live
    wake-up carried (:meth:`IngestClient.fetch_frames`'s form)."""
    return _fetch_reply(partition, carried.first_offset, carried.reply, walk_frames)


def _fetch_reply(
    partition: TopicName,
    from_offset: int,
    reply: bytes | memoryview,
    split: Callable[[memoryview], tuple[list[F], int]],
) -> FetchReply[F]:
    status, wal_start, next_offset, body = protocol.decode_fetch_reply_head(reply)
    if status is protocol.FetchStatus.DAMAGED:
        file = protocol.decode_damaged_file(body)
        damaged = protocol.Damaged(from_offset, next_offset, file)
        return FetchReply(False, wal_start, from_offset, [], damaged)
    frames, consumed = split(body)
    if consumed != len(body):
        raise protocol.BadRequestError(f"fetch reply ends in a partial frame ({partition})")
    return FetchReply(
        status is protocol.FetchStatus.BELOW_WAL_START, wal_start, next_offset, frames
    )
