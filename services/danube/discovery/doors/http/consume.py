"""The consume routes (long-poll; DESIGN §5): attach, poll, ack, nack, detach.

Discovery keeps no consumer state: a subscription lives in the dispatcher that owns it
(reached through :class:`DispatcherClient`), and the public consumer id carries what is
needed to find it again on any instance: ``<ns>.<topic>.<sub>.<dispatcher consumer id>``
(name segments never contain dots).
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Callable, Sequence
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response

from danube.discovery.doors.bodies.api import (
    AckRequest,
    AckResult,
    AttachRequest,
    AttachResponse,
    MessageOut,
    MessageRefOut,
    MessagesOut,
)
from danube.discovery.doors.http.failure_policy import check_dead_letter_topic
from danube.discovery.doors.http.params import (
    DISPATCHER_ID_CHARS_MAX,
    ConsumerId,
    Namespace,
    Subscription,
    Topic,
)
from danube.discovery.doors.http.state import Services, ServicesDep
from danube.discovery.errors import BadRequestError
from danube.frame import CorruptFrameError, decode_record
from danube.meta import TopicName
from danube.names import SEGMENT_CHARS, InvalidNameError, user_topic, validate_segment
from danube.wire import delivery
from danube.wire.dispatcher import protocol

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["consume"])

POLL_MAX_MESSAGES = 1000
POLL_WAIT_MS_MAX = 30_000
_DISPATCHER_ID = re.compile(f"[{SEGMENT_CHARS}]{{1,{DISPATCHER_ID_CHARS_MAX}}}")


def consumer_id(topic: TopicName, sub: str, dispatcher_id: str) -> str:
    """The public id of a consumer the dispatcher knows as ``dispatcher_id``."""
    return f"{topic.namespace}.{topic.topic}.{sub}.{dispatcher_id}"


def parse_consumer_id(value: str) -> tuple[TopicName, str, str]:
    """``(topic, subscription, dispatcher id)`` of a public consumer id; BadRequestError
    ``invalid_consumer_id`` when it is not one."""
    parts = value.split(".")
    if len(parts) != 4 or not _DISPATCHER_ID.fullmatch(parts[3]):
        raise BadRequestError(f"{value[:200]!r} is not a consumer id", code="invalid_consumer_id")
    ns, topic, sub, dispatcher_id = parts
    try:
        name = user_topic(ns, topic)
        validate_segment("subscription", sub)
    except InvalidNameError as exc:
        raise BadRequestError(
            f"{value[:200]!r} is not a consumer id: {exc.message}", code="invalid_consumer_id"
        ) from exc
    return name, sub, dispatcher_id


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


def message_ranges(topic: TopicName, body: AckRequest) -> list[tuple[str, int, int]]:
    """The ``(partition segment, first, last)`` runs the dispatcher takes for an ack or nack
    body of a consumer of ``topic`` (``messages`` each a run of one, then ``ranges`` as they
    came: never one object per offset); BadRequestError ``invalid_partition`` when one names
    a partition that is not the topic or one of its partitions."""
    # The dispatcher names a partition by its topic segment; the API by its full name, as
    # polled. Another topic's partition is a caller mistake, refused before anything moves.
    segments: dict[str, str] = {}  # each name checked once, however many refs name it

    def segment(name: str, where: str) -> str:
        found = segments.get(name)
        if found is None:
            found = segments[name] = _segment(topic, name, where)
        return found

    runs = [
        (segment(m.partition, f"messages[{i}]"), m.offset, m.offset)
        for i, m in enumerate(body.messages)
    ]
    runs += (
        (segment(run.partition, f"ranges[{i}]"), run.first, run.last)
        for i, run in enumerate(body.ranges)
    )
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


@router.post(
    "/topics/{ns}/{topic}/subscriptions/{sub}/consumers",
    response_model=AttachResponse,
    status_code=201,
)
async def attach(
    ns: Namespace, topic: Topic, sub: Subscription, body: AttachRequest, services: ServicesDep
) -> AttachResponse:
    """Attach a consumer (creating the subscription on the first attach); 409
    ``subscription_taken`` when an exclusive subscription already has its consumer."""
    name = user_topic(ns, topic)
    validate_segment("subscription", sub)
    # The dispatcher reads the partitions the topic config names: it must exist first.
    await services.catalog.ensure_topic(name, auto_create=services.producer.limits.auto_create)
    start: protocol.StartPosition = (
        body.start if isinstance(body.start, str) else body.start.model_dump()
    )
    policy = None if body.failure_policy is None else body.failure_policy.stored()
    check_dead_letter_topic(name, policy)
    dispatcher_id = await services.dispatcher.attach(
        name,
        sub,
        body.name,
        type=body.type,
        start=start,
        key_filters=body.key_filters,
        failure_policy=policy,
    )
    return AttachResponse(consumer_id=consumer_id(name, sub, dispatcher_id))


async def messages_out(
    services: Services, topic: TopicName, sub: str, dispatcher_id: str, batch: protocol.PollBatch
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
        await services.dispatcher.nack(topic, sub, dispatcher_id, corrupt, delay_ms=0)
    return out


def full_names(topic: TopicName) -> Callable[[str], str]:
    """Renames a partition named by its topic segment (as the dispatcher names it) to its
    full name (as produce answers it and acks take it)."""
    return lambda segment: str(TopicName(topic.namespace, segment))


def wants_frames(accept: str | None) -> bool:
    """Whether an ``Accept`` header asks for delivery batches (danube.wire.delivery)."""
    return accept is not None and delivery.MEDIA_TYPE in accept


@router.get(
    "/consumers/{cid}/messages",
    response_model=MessagesOut,
    responses={200: {"content": {delivery.MEDIA_TYPE: {}}}},
)
async def poll(
    cid: ConsumerId,
    services: ServicesDep,
    max: Annotated[int, Query(ge=1, le=POLL_MAX_MESSAGES)] = 100,
    wait_ms: Annotated[int, Query(ge=0, le=POLL_WAIT_MS_MAX)] = 1000,
    accept: Annotated[str | None, Header()] = None,
) -> Response:
    """Up to ``max`` messages, waiting at most ``wait_ms`` for the first (an empty list
    when none came). ``Accept: application/x-danube-frames``: one delivery batch, the
    frames as the WAL holds them (docs/http-api.md), else JSON."""
    topic, sub, dispatcher_id = parse_consumer_id(cid)
    dispatcher = services.dispatcher
    if wants_frames(accept):
        frames = await dispatcher.poll_frames(topic, sub, dispatcher_id, max=max, wait_ms=wait_ms)
        body = delivery.rename_partitions(frames.body, full_names(topic))
        return Response(body, media_type=delivery.MEDIA_TYPE)
    batch = await dispatcher.poll(topic, sub, dispatcher_id, max=max, wait_ms=wait_ms)
    out = MessagesOut(messages=await messages_out(services, topic, sub, dispatcher_id, batch))
    return Response(out.model_dump_json(), media_type="application/json")


@router.post(
    "/consumers/{cid}/ack",
    status_code=204,
    response_model=None,
    responses={
        200: {"model": AckResult, "description": "Some refs were not in flight"},
        204: {"description": "Every ref was in flight (or acked before)"},
    },
)
async def ack(cid: ConsumerId, body: AckRequest, services: ServicesDep) -> Response:
    """Acknowledge delivered messages: they are not delivered again. ``204`` when every ref
    was in flight (or acked before); ``200`` naming the refs that were not (never delivered,
    dropped by a seek, or not of the subscription's partitions): the ack did nothing for
    them."""
    topic, sub, dispatcher_id = parse_consumer_id(cid)
    ranges = message_ranges(topic, body)
    ignored = await services.dispatcher.ack_ranges(topic, sub, dispatcher_id, ranges)
    if not ignored:
        return Response(status_code=204)
    result = AckResult(not_in_flight=not_in_flight(topic, ignored))
    return Response(result.model_dump_json(), status_code=200, media_type="application/json")


def not_in_flight(topic: TopicName, refs: Sequence[tuple[str, int]]) -> list[MessageRefOut]:
    """The public form of refs the dispatcher told were not in flight: the partition by its
    full name, as polled and acked."""
    return [MessageRefOut(partition=str(TopicName(topic.namespace, p)), offset=o) for p, o in refs]


@router.post("/consumers/{cid}/nack", status_code=204)
async def nack(cid: ConsumerId, body: AckRequest, services: ServicesDep) -> Response:
    """Refuse delivered messages: redelivered after ``delay_ms`` (or dead-lettered)."""
    topic, sub, dispatcher_id = parse_consumer_id(cid)
    ranges = message_ranges(topic, body)
    await services.dispatcher.nack_ranges(topic, sub, dispatcher_id, ranges, delay_ms=body.delay_ms)
    return Response(status_code=204)


@router.delete("/consumers/{cid}", status_code=204)
async def detach(cid: ConsumerId, services: ServicesDep) -> Response:
    """Detach a consumer; its unacked messages go to the others (or the next one)."""
    topic, sub, dispatcher_id = parse_consumer_id(cid)
    await services.dispatcher.detach(topic, sub, dispatcher_id)
    return Response(status_code=204)
