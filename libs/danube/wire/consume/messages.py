"""Polled messages to their public form, ack and nack bodies to the runs of offsets the
dispatcher takes, and :class:`ConsumerCalls`: what a consume door asks of the subscription's
dispatcher (discovery over the bus, ``DispatcherClient``; a dispatcher's own consume door in
its process)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from danube.errors import BadRequestError
from danube.frame import CorruptFrameError, decode_record
from danube.meta import TopicName
from danube.names import InvalidNameError
from danube.wire import delivery
from danube.wire.consume.models import AckRequest, MessageOut, MessageRefOut
from danube.wire.dispatcher import protocol

log = logging.getLogger(__name__)

POLL_MAX_MESSAGES = 1000
POLL_WAIT_MS_MAX = 30_000


class ConsumerCalls(Protocol):
    """The consumer operations of a subscription's dispatcher, wherever it runs."""

    async def poll(
        self, topic: TopicName, sub: str, consumer_id: str, *, max: int = 100, wait_ms: int = 1000
    ) -> protocol.PollBatch: ...

    async def poll_frames(
        self, topic: TopicName, sub: str, consumer_id: str, *, max: int = 100, wait_ms: int = 1000
    ) -> protocol.PolledFrames: ...

    async def ack_ranges(
        self, topic: TopicName, sub: str, consumer_id: str, ranges: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int]]: ...

    async def nack_ranges(
        self,
        topic: TopicName,
        sub: str,
        consumer_id: str,
        ranges: Sequence[tuple[str, int, int]],
        *,
        delay_ms: int = 0,
    ) -> None: ...

    async def nack(
        self,
        topic: TopicName,
        sub: str,
        consumer_id: str,
        refs: Sequence[tuple[str, int]],
        *,
        delay_ms: int = 0,
    ) -> None: ...

    async def touch(self, topic: TopicName, sub: str, consumer_id: str) -> None: ...

    async def detach(self, topic: TopicName, sub: str, consumer_id: str) -> None: ...


def message_out(topic: TopicName, message: protocol.PolledMessage) -> MessageOut:
    """The public form of a polled message of ``topic``: the partition by its full name (as
    produce answers it), the payload as text when it is UTF-8, else base64. Its frame is
    checked here (CorruptFrameError), where its record is decoded."""
    record = decode_record(message.record)
    try:
        payload, encoding = record.payload.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(record.payload).decode("ascii"), "base64"
    return MessageOut(
        partition=str(TopicName(topic.namespace, message.partition)),
        offset=message.offset,
        payload=payload,
        encoding=encoding,
        key=record.key,
        attributes=dict(record.attributes),
        publish_time_ms=record.publish_time_ms,
        producer=record.producer,
        redelivery_count=message.redelivery_count,
        schema_id=record.schema_id,
        schema_version=record.schema_version,
    )


async def messages_out(
    calls: ConsumerCalls,
    topic: TopicName,
    sub: str,
    dispatcher_id: str,
    batch: protocol.PollBatch,
) -> list[MessageOut]:
    """The public form of a polled batch. A message whose frame fails its check (damaged on
    the way: it was checked where it was read) is left out and nacked, so that it comes
    again, read afresh."""
    out: list[MessageOut] = []
    corrupt: list[tuple[str, int]] = []
    for message in batch.messages:
        try:
            out.append(message_out(topic, message))
        except CorruptFrameError as exc:
            log.warning("%s@%d: %s; nacked", message.partition, message.offset, exc)
            corrupt.append((message.partition, message.offset))
    if corrupt:
        await calls.nack(topic, sub, dispatcher_id, corrupt, delay_ms=0)
    return out


def message_ranges(topic: TopicName, body: AckRequest) -> list[tuple[str, int, int]]:
    """The ``(partition segment, first, last)`` runs the dispatcher takes for an ack or nack
    body of a consumer of ``topic`` (``messages`` each a run of one, then ``ranges`` as they
    came: never one object per offset); BadRequestError ``invalid_partition`` when one names
    a partition that is not the topic or one of its partitions."""
    # The dispatcher names a partition by its topic segment; the API by its full name, as
    # polled. Another topic's partition is a caller mistake, refused before anything moves.
    # Each name is checked once, however many refs name it: a consumer acking out of order
    # sends a run per message.
    segments: dict[str, str] = {}
    runs: list[tuple[str, int, int]] = []
    for i, m in enumerate(body.messages):
        name = m.partition
        found = segments.get(name) or segments.setdefault(
            name, _segment(topic, name, f"messages[{i}]")
        )
        runs.append((found, m.offset, m.offset))
    for i, run in enumerate(body.ranges):
        name = run.partition
        found = segments.get(name) or segments.setdefault(
            name, _segment(topic, name, f"ranges[{i}]")
        )
        runs.append((found, run.first, run.last))
    return runs


def _segment(topic: TopicName, name: str, where: str) -> str:
    try:
        partition = TopicName.parse(name)
    except InvalidNameError as exc:
        raise BadRequestError(
            f"{where}.partition: {exc.message}", code="invalid_partition"
        ) from exc
    if partition.parent != topic:
        raise BadRequestError(
            f"{where}.partition {partition} is not a partition of {topic}",
            code="invalid_partition",
        )
    return partition.topic


def full_names(topic: TopicName) -> Callable[[str], str]:
    """Renames a partition named by its topic segment (as the dispatcher names it) to its
    full name (as produce answers it and acks take it)."""
    return lambda segment: str(TopicName(topic.namespace, segment))


def wants_frames(accept: str | None) -> bool:
    """Whether an ``Accept`` header asks for delivery batches (danube.wire.delivery)."""
    return accept is not None and delivery.MEDIA_TYPE in accept


def not_in_flight(topic: TopicName, refs: Sequence[tuple[str, int]]) -> list[MessageRefOut]:
    """The public form of refs the dispatcher told were not in flight: the partition by its
    full name, as polled and acked."""
    return [MessageRefOut(partition=str(TopicName(topic.namespace, p)), offset=o) for p, o in refs]
