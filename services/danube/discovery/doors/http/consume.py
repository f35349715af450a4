"""The consume routes (long-poll; DESIGN §5): attach, poll, ack, nack, detach.

Discovery keeps no consumer state: a subscription lives in the dispatcher that owns it
(reached through :class:`DispatcherClient`), and the public consumer id carries what is
needed to find it again on any instance: ``<ns>.<topic>.<sub>.<dispatcher consumer id>``
(name segments never contain dots).
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response

from danube.discovery.doors.bodies.consume import AttachRequest, AttachResponse
from danube.discovery.doors.http.failure_policy import check_dead_letter_topic
from danube.discovery.doors.http.params import ConsumerId, Namespace, Subscription, Topic
from danube.discovery.doors.http.state import ServicesDep
from danube.names import user_topic, validate_segment
from danube.wire import delivery
from danube.wire.consume.ids import consumer_id, parse_consumer_id
from danube.wire.consume.messages import (
    POLL_MAX_MESSAGES,
    POLL_WAIT_MS_MAX,
    full_names,
    message_ranges,
    messages_out,
    not_in_flight,
    wants_frames,
)
from danube.wire.consume.models import AckRequest, AckResult, MessagesOut
from danube.wire.dispatcher import protocol

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["consume"])


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
    attached = await services.dispatcher.attach_consumer(
        name,
        sub,
        body.name,
        type=body.type,
        start=start,
        key_filters=body.key_filters,
        failure_policy=policy,
        hold_delayed=body.hold_delayed,
    )
    return AttachResponse(
        consumer_id=consumer_id(name, sub, attached.consumer_id), url=attached.url
    )


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
    out = MessagesOut(messages=await messages_out(dispatcher, topic, sub, dispatcher_id, batch))
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
