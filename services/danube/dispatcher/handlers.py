"""The bus edges of the dispatcher: the operations of each owned subscription, and the
claim request any dispatcher of the queue group may answer."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson

from danube.bus import Bus, Kind, Request, Responder
from danube.bus.subjects import DispatchOp
from danube.dispatcher.served import ServedSubscription
from danube.errors import ErrorKind
from danube.meta import TopicName
from danube.wire.dispatcher import protocol

log = logging.getLogger(__name__)

DISPATCHER_QUEUE = "dispatcher"
# Requests of one subscription handled at once: long polls wait here, so this also bounds
# how many consumers may be polling one subscription together.
OPS_CONCURRENCY = 256
# A poll (or an ack) answers this long before the caller's deadline, so the reply still reaches it.
_REPLY_MARGIN_S = 0.25
_OK = b'{"ok":true}'


class SubscriptionHandlers:
    """Request handlers of one subscription (one responder over all its ops)."""

    def __init__(
        self, runtime: ServedSubscription, door_url: Callable[[], str | None] = lambda: None
    ) -> None:
        self.runtime = runtime
        self.door_url = door_url

    async def serve(self, bus: Bus, topic: TopicName, sub: str) -> Responder:
        """Answer ``subjects.dispatch(topic, sub, op)`` for every op."""
        return await bus.serve(
            bus.subjects.dispatch_all_ops(topic, sub), self.handle, max_concurrency=OPS_CONCURRENCY
        )

    async def handle(self, request: Request) -> bytes:
        """Route one request by the op token of its subject."""
        op = request.subject.rsplit(".", 1)[-1]
        runtime = self.runtime
        if op == DispatchOp.ATTACH:
            attach = protocol.parse(request.body, protocol.AttachRequest)
            consumer_id = await runtime.attach(attach)
            # Where the consumer reaches this dispatcher without the bus (its consume door).
            return orjson.dumps({"consumer_id": consumer_id, "url": self.door_url()})
        if op == DispatchOp.POLL:
            poll = protocol.parse(request.body, protocol.PollRequest)
            wait_s = min(poll.wait_ms / 1000, request.remaining_s() - _REPLY_MARGIN_S)
            return await runtime.poll(poll, max(wait_s, 0.0))
        if op == DispatchOp.ACK:
            ack = protocol.parse(request.body, protocol.AckRequest)
            ignored = await runtime.ack(ack, request.remaining_s() - _REPLY_MARGIN_S)
            return protocol.encode_ack_reply(ignored)
        if op == DispatchOp.NACK:
            await runtime.nack(protocol.parse(request.body, protocol.AckRequest))
            return _OK
        if op == DispatchOp.DETACH:
            detach = protocol.parse(request.body, protocol.DetachRequest)
            await runtime.detach(detach.consumer_id)
            return _OK
        if op == DispatchOp.SEEK:
            seek = protocol.parse(request.body, protocol.SeekRequest)
            return orjson.dumps({"offsets": await runtime.seek(seek.position)})
        if op == DispatchOp.SKIP:
            skip = protocol.parse(request.body, protocol.SkipRequest)
            return protocol.encode(await runtime.skip(skip.partition, skip.to_offset))
        if op == DispatchOp.STATS:
            protocol.parse(request.body, protocol.EmptyRequest)
            return protocol.encode(await runtime.stats())
        if op == DispatchOp.POLICY:
            policy = protocol.parse(request.body, protocol.PolicyRequest)
            return protocol.encode(await runtime.failure_policy(policy.policy))
        if op == DispatchOp.DELETE:
            protocol.parse(request.body, protocol.EmptyRequest)
            await runtime.delete()
            return _OK
        raise protocol.BadRequestError(  # a bug in the caller: no client names an operation
            f"unknown dispatcher operation {op!r}", code="unknown_op", kind=ErrorKind.INTERNAL
        )


async def serve_claims(
    bus: Bus,
    node_id: str,
    ensure_serving: Callable[[TopicName, str], Awaitable[ServedSubscription]],
) -> Responder:
    """Answer claim requests for subscriptions nobody serves (one dispatcher of the queue
    group takes each): a request that finds no responders asks here, then retries.
    ``ensure_serving`` is the node's (danube.dispatcher.node): claim and serve, or the
    runtime already served."""

    async def claim(request: Request) -> bytes:
        parsed = bus.subjects.parse(request.subject)
        if parsed.subscription is None:
            raise protocol.BadRequestError(f"no subscription in {request.subject}")
        runtime = await ensure_serving(parsed.name, parsed.subscription)
        claim_ = runtime.store.claim
        epoch = 0 if claim_ is None else claim_.epoch
        return orjson.dumps({"node_id": node_id, "epoch": epoch})

    return await bus.serve(
        bus.subjects.all_of_kind(Kind.SUBSCRIPTION_OWNERSHIP),
        claim,
        queue=DISPATCHER_QUEUE,
        max_concurrency=16,
    )
