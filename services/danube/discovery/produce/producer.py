"""Produce on the proxy path: store a batch admitted (danube.admission: every
door's checks), route it, send one bus request per partition (split to fit the bus and
ingest limits), concurrently, and answer in message order.

Nothing is sent before every message of the batch has been decoded, admitted and encoded
as a record, so a bad message leaves no trace anywhere. The topic is
auto-created (when allowed) only after that check. A batch spread over several partitions
is not atomic: when one partition fails, the others may have stored their messages, and a
retried batch may store those again (at-least-once). An idempotent producer's batch
(sequenced: :mod:`danube.admission.sequences`) names one partition, and its resend is
answered with the offsets first given, ``duplicate``, appending nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from danube.admission import Admitted, Sequencing
from danube.admission.payloads import stamped_frames
from danube.admission.sequences import check_target
from danube.bus import Bus, BusError, NoRespondersError, RemoteError, TopicName
from danube.config import DanubeSettings
from danube.discovery import metrics
from danube.discovery.catalog.catalog import Catalog
from danube.discovery.errors import (
    NotFoundError,
    OverLimitError,
    TooLargeError,
    UnavailableError,
)
from danube.discovery.produce.batch import Batch, FramesBatch, RecordsBatch
from danube.discovery.produce.routing import RoundRobin, group, route, split
from danube.frame.produce import ProducedFrames
from danube.meta.records import Dispatch, Policies
from danube.runtime.topic_metrics import topic_label
from danube.wire import codes
from danube.wire.ingest.client import IngestClient
from danube.wire.ingest.protocol import ProduceReply
from danube.wire.limits import (
    BACKLOG_QUOTA_EXCEEDED,
    RATE_LIMITED,
    PartitionLimits,
    for_partition,
    retry_after_ms,
)
from danube.wire.sizes import body_limit

log = logging.getLogger(__name__)

# Placing a new topic's partitions at its creation (Producer.place): how long the creation
# may wait for it in all, and how many claims go at once.
PLACE_TIMEOUT_S = 1.0
PLACE_CONCURRENCY = 16

# Room for NATS headers (deadline...) inside the server's max_payload.


@dataclass(frozen=True, slots=True)
class Stored:
    """Where a produce's messages went, in message order: ``routed[i]`` indexes ``names``;
    ``duplicates[i]``: message ``i`` was an idempotent producer's resend, stored before at
    ``offsets[i]`` (its partition's leader appended nothing)."""

    names: list[TopicName]
    routed: list[int]
    offsets: list[int]
    duplicates: list[bool]
    partitions: int = 0  # the topic's partitions as this instance knows them (0: none)


@dataclass(frozen=True, slots=True)
class Limits:
    """How an admitted batch is stored, from the settings (what a produce may carry is
    admission's: danube.admission.ProduceLimits)."""

    max_batch_records: int
    timeout_s: float
    auto_create: bool

    @classmethod
    def from_settings(cls, settings: DanubeSettings) -> Limits:
        """The limits configured for this instance."""
        return cls(
            max_batch_records=settings.ingest.max_batch_messages,
            timeout_s=settings.discovery.produce_timeout_s,
            auto_create=settings.discovery.auto_create_topics,
        )


class Producer:
    """Stores admitted batches (danube.admission) through the bus; at most
    ``max_inflight`` at once."""

    def __init__(
        self,
        bus: Bus,
        catalog: Catalog,
        limits: Limits,
        *,
        max_inflight: int,
    ) -> None:
        self.bus = bus
        self.catalog = catalog
        self.limits = limits
        self.client = IngestClient(bus)
        self._robin = RoundRobin()
        self._slots = asyncio.Semaphore(max_inflight)

    async def place(self, topic: TopicName, partitions: int, *, first: int = 0) -> None:
        """Place a new topic's partitions now, so that its first produce does not pay their
        claim (etcd transactions, the WAL's first segment and epoch file created and
        fsynced: ~20-35 ms, with every message sent meanwhile queued behind it). Best
        effort, within PLACE_TIMEOUT_S in all: a partition not placed here (no ingest node
        up, too few for its replication factor, a slow claim) is placed by its first
        produce, as before. ``first``: the partitions before it exist already (a growth)."""
        slots = asyncio.Semaphore(PLACE_CONCURRENCY)
        unplaced: list[str] = []

        async def place_one(partition: TopicName) -> None:
            try:
                async with slots:
                    reason = await self.client.place(partition, timeout_s=PLACE_TIMEOUT_S)
            except BusError as exc:  # the bus itself (closed, reconnecting): not the creation's
                unplaced.append(f"{partition}: {exc}")
                return
            if reason is not None:
                unplaced.append(f"{partition}: {reason.code}")

        names = topic.partitions(partitions)[first:]
        try:
            async with asyncio.timeout(PLACE_TIMEOUT_S), asyncio.TaskGroup() as tasks:
                for partition in names:
                    tasks.create_task(place_one(partition))
        except TimeoutError:
            unplaced.append(f"not all {len(names)} within {PLACE_TIMEOUT_S}s")
        if unplaced:
            log.info("topic %s: left to its first produce: %s", topic, "; ".join(unplaced))

    async def produce_frames(
        self, admitted: Admitted, frames: ProducedFrames, *, dispatch: Dispatch
    ) -> Stored:
        """:meth:`produce` of a binary body (checked frames, danube.frame.produce): the same
        routing, with no record decoded or encoded again unless the topic has a schema
        (then its records are stamped)."""
        async with self._admitted():
            if admitted.stamp is not None:
                stamp = admitted.stamp
                frames = stamped_frames(frames, stamp.schema_id, stamp.version)
            return await self._stored(
                admitted.topic,
                FramesBatch(frames),
                frames.keys,
                dispatch,
                admitted.policies,
                admitted.sequencing,
            )

    @contextlib.asynccontextmanager
    async def _admitted(self) -> AsyncIterator[None]:
        """One of the instance's ``max_inflight`` produce slots, or 429 at once."""
        if self._slots.locked():
            raise OverLimitError("too many produce requests in flight on this instance; retry")
        async with self._slots:
            yield

    async def store(
        self,
        admitted: Admitted,
        records: Sequence[bytes],
        keys: Sequence[str | None],
        *,
        dispatch: Dispatch,
    ) -> Stored:
        """Store encoded records ``admitted``: to a topic (routed over its partitions by key,
        auto-created with ``dispatch`` when allowed) or one partition of an existing topic
        (``<t>-part-N``, as Danube's clients name them); where each went, in order. A full
        instance answers 429 at once."""
        async with self._admitted():
            return await self._stored(
                admitted.topic,
                RecordsBatch(records),
                keys,
                dispatch,
                admitted.policies,
                admitted.sequencing,
            )

    async def _stored(
        self,
        topic: TopicName,
        batch: Batch,
        keys: Sequence[str | None],
        dispatch: Dispatch,
        policies: Policies,
        sequencing: Sequencing | None,
    ) -> Stored:
        """Route and send ``batch``. A sequenced batch goes to one partition only (400
        ``partition_required`` for a partitioned topic's own name)."""
        started = time.perf_counter()
        count = len(batch.sizes)
        if topic.partition is None:
            partitions = await self._partitions_of(topic, dispatch)
            routed = route(keys, partitions, self._robin)
            names = topic.partitions(partitions)
        else:
            partitions = await self._check_partition(topic)
            routed, names = [0] * count, [topic]
        check_target(topic, partitions, sequencing)
        limits = for_partition(policies, partitions)
        offsets, duplicates = await self._send(names, routed, batch, limits)
        metrics.PRODUCE_SECONDS.observe(time.perf_counter() - started)
        metrics.MESSAGES_PRODUCED.inc(count)
        metrics.TOPIC_MESSAGES_PRODUCED.labels(topic_label(topic)).inc(count)
        log.debug("produce: %d messages to %s stored", count, topic)
        return Stored(names, routed, offsets, duplicates, partitions)

    async def _partitions_of(self, topic: TopicName, dispatch: Dispatch) -> int:
        config, _ = await self.catalog.ensure_topic(
            topic, auto_create=self.limits.auto_create, dispatch=dispatch
        )
        return config.partitions

    async def _check_partition(self, partition: TopicName) -> int:
        """A partition is written only while its topic exists and has it (a deleted topic's
        partition is not brought back by a late produce); the topic's partition count."""
        config = await self.catalog.cached_topic(partition.parent)
        assert partition.partition is not None
        if config is None or config.partitions <= partition.partition:
            raise NotFoundError(f"topic {partition} does not exist", code=codes.TOPIC_NOT_FOUND)
        return config.partitions

    async def _send(
        self,
        names: Sequence[TopicName],
        routed: Sequence[int],
        batch: Batch,
        limits: PartitionLimits,
    ) -> tuple[list[int], list[bool]]:
        """Each message's offset, and whether its partition's leader answered it as stored
        before: an idempotent producer's resend (a whole bus request), or a repeated
        message id within the topic's window (record by record)."""
        max_request_bytes = body_limit(self.bus.max_payload_bytes)
        sizes = batch.sizes
        framing = batch.head_bytes + batch.framing_bytes
        too_big = [i for i, size in enumerate(sizes) if size + framing > max_request_bytes]
        if too_big:
            raise TooLargeError(
                f"messages[{too_big[0]}] does not fit in one bus message "
                f"({max_request_bytes} bytes)",
                code=codes.PAYLOAD_TOO_LARGE,
                limit=max_request_bytes,
            )
        offsets = [0] * len(sizes)
        duplicates = [False] * len(sizes)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.timeout_s

        async def send_partition(partition: int, indexes: list[int]) -> None:
            chunks = split(
                partition,
                indexes,
                sizes,
                max_request_bytes=max_request_bytes,
                max_records=self.limits.max_batch_records,
                head_bytes=batch.head_bytes,
                framing_bytes=batch.framing_bytes,
            )
            for chunk in chunks:  # in order: a partition's offsets follow message order
                remaining_s = deadline - loop.time()
                if remaining_s <= 0:
                    raise UnavailableError(f"no durable answer from {names[partition]} in time")
                reply = await self._produce_chunk(
                    names[partition], batch.request(chunk.indexes), remaining_s, limits
                )
                for position, index in enumerate(chunk.indexes):
                    offsets[index] = reply.offset(position)
                    duplicates[index] = reply.duplicate_at(position)

        if len(names) == 1:  # one partition: no task group to build
            await send_partition(0, list(range(len(sizes))))
            return offsets, duplicates
        try:
            async with asyncio.TaskGroup() as tg:
                for partition, indexes in group(routed).items():
                    tg.create_task(send_partition(partition, indexes))
        except ExceptionGroup as eg:
            raise eg.exceptions[0] from None  # one error is answered; the first is as good
        return offsets, duplicates

    async def _produce_chunk(
        self,
        partition: TopicName,
        body: bytes,
        timeout_s: float,
        limits: PartitionLimits,
    ) -> ProduceReply:
        try:
            with metrics.BUS_PRODUCE_SECONDS.time():
                return await self.client.produce_answer(
                    partition, body, timeout_s=timeout_s, limits=limits
                )
        except RemoteError as exc:
            if exc.code not in (RATE_LIMITED, BACKLOG_QUOTA_EXCEEDED):
                raise
            metrics.POLICY_REFUSALS.labels(exc.code).inc()
            # Retry-After is in whole seconds: at least 1.
            wait_ms = retry_after_ms(exc.message) or 1000
            raise OverLimitError(
                exc.message, code=exc.code, retry_after_s=max(1, -(-wait_ms // 1000))
            ) from None
        except TimeoutError as exc:
            raise UnavailableError(
                f"no owner of {partition} answered within the produce deadline", code="no_owner"
            ) from exc
        except NoRespondersError as exc:
            raise UnavailableError(f"no owner of {partition}", code="no_owner") from exc
