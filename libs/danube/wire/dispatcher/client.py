"""How other services (discovery, tests) talk to the dispatcher of a subscription.

Every call goes to ``subjects.dispatch(topic, sub, op)``. When nobody serves the
subscription yet, the call asks the dispatcher queue group to claim it, then retries with
jittered backoff, all within the call's deadline (as :class:`IngestClient.produce` does).
:meth:`DispatcherClient.stats` is the exception: it never claims (a subscription nobody
serves has no live state to show; its stored state is in etcd).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

import orjson

from danube.aio import GoneError, unless_gone
from danube.bus import Bus, BusTimeoutError, NoRespondersError, RemoteError
from danube.bus.subjects import DispatchOp
from danube.meta import TopicName
from danube.meta.failure_policy import FailurePolicy, FailurePolicyIn
from danube.wire.claim import request_with_claim
from danube.wire.dispatcher import protocol
from danube.wire.dispatcher.errors import ClaimRefusedError

# A long poll's request deadline is its wait plus this much for the reply to travel.
_POLL_MARGIN_S = 2.0
# Claims asked in a row while members refuse (each ask picks a member at random).
_CLAIM_ASKS = 3
# A request not answered this long after it was due (a poll: after its wait) asks whether
# the subscription's owner is gone (``owner_gone``), then again at this pace.
QUIET_S = 0.5

OwnerGone = Callable[[TopicName, str], Awaitable[bool]]


class Attached(NamedTuple):
    """An attached consumer: its id at the dispatcher, and that dispatcher's consume door."""

    consumer_id: str
    url: str | None


class DispatcherClient:
    """Attach, poll, ack, nack and detach consumers of a subscription over the bus."""

    def __init__(
        self, bus: Bus, *, timeout_s: float = 10.0, owner_gone: OwnerGone | None = None
    ) -> None:
        """``owner_gone(topic, sub)``: whether the dispatcher that owns the subscription is
        provably gone (danube.runtime.liveness.subscription_owner_gone). A request it
        answers no longer waits out its deadline when that owner was killed under it:
        after QUIET_S without a reply it asks, and on yes the request goes the way of one
        that found no responder (a claim, then again to the new owner)."""
        self.bus = bus
        self.timeout_s = timeout_s
        self._owner_gone = owner_gone

    async def attach(
        self,
        topic: TopicName,
        sub: str,
        consumer: str,
        *,
        type: str = "exclusive",
        start: protocol.StartPosition = "latest",
        key_filters: Sequence[str] = (),
        failure_policy: FailurePolicy | Mapping[str, Any] | None = None,
    ) -> str:
        """:meth:`attach_consumer`'s consumer id."""
        attached = await self.attach_consumer(
            topic,
            sub,
            consumer,
            type=type,
            start=start,
            key_filters=key_filters,
            failure_policy=failure_policy,
        )
        return attached.consumer_id

    async def attach_consumer(
        self,
        topic: TopicName,
        sub: str,
        consumer: str,
        *,
        type: str = "exclusive",
        start: protocol.StartPosition = "latest",
        key_filters: Sequence[str] = (),
        failure_policy: FailurePolicy | Mapping[str, Any] | None = None,
        hold_delayed: bool = False,
    ) -> Attached:
        """Attach a consumer: its consumer id, and the consume door of the dispatcher that
        owns the subscription (None: it has none). RemoteError ``subscription_taken`` when an
        exclusive subscription already has its consumer. ``key_filters`` (glob patterns, only
        with ``type="key_shared"``): the keys it takes; none, every key. ``failure_policy``
        is applied when this attach creates the subscription; naming another one than an
        existing subscription's is refused (RemoteError ``policy_conflict``), None keeps it.
        ``hold_delayed``: the consumer keeps a delayed message handed early until its time
        (danube.wire.opens.ConsumerOpen)."""
        if isinstance(key_filters, str):
            raise TypeError("key_filters is a sequence of glob patterns, not one string")
        fields: dict[str, object] = {"consumer": consumer, "type": type, "start": start}
        if key_filters:
            fields["key_filters"] = list(key_filters)
        policy = _policy_body(failure_policy)
        if policy is not None:
            fields["failure_policy"] = policy
        if hold_delayed:
            fields["hold_delayed"] = True
        body = orjson.dumps(fields)
        reply = orjson.loads(
            await self._request(topic, sub, DispatchOp.ATTACH, body, self.timeout_s)
        )
        url = reply.get("url")
        return Attached(str(reply["consumer_id"]), url if isinstance(url, str) else None)

    async def poll(
        self, topic: TopicName, sub: str, consumer_id: str, *, max: int = 100, wait_ms: int = 1000
    ) -> protocol.PollBatch:
        """Up to ``max`` messages, waiting at most ``wait_ms`` for the first: a delivery
        batch, frames as the WAL holds them (not checked: see PolledMessage.record)."""
        reply = await self._poll(topic, sub, consumer_id, max=max, wait_ms=wait_ms)
        return protocol.decode_poll_reply(reply)

    async def poll_frames(
        self, topic: TopicName, sub: str, consumer_id: str, *, max: int = 100, wait_ms: int = 1000
    ) -> protocol.PolledFrames:
        """:meth:`poll`, the reply to pass on as it is (binary delivery): its layout checked,
        its message count, no message built per frame."""
        reply = await self._poll(topic, sub, consumer_id, max=max, wait_ms=wait_ms)
        return protocol.check_poll_reply(reply)

    async def _poll(
        self, topic: TopicName, sub: str, consumer_id: str, *, max: int, wait_ms: int
    ) -> bytes:
        body = protocol.encode(
            protocol.PollRequest(consumer_id=consumer_id, max=max, wait_ms=wait_ms)
        )
        timeout_s = wait_ms / 1000 + _POLL_MARGIN_S
        quiet_s = wait_ms / 1000 + QUIET_S
        return await self._request(topic, sub, DispatchOp.POLL, body, timeout_s, quiet_s)

    async def ack(
        self, topic: TopicName, sub: str, consumer_id: str, refs: Sequence[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        """Acknowledge ``(partition, offset)`` pairs; the pairs that were not in flight (never
        delivered, dropped by a seek...: the ack did nothing for them)."""
        reply = await self._acks(topic, sub, DispatchOp.ACK, consumer_id, refs, 0)
        return protocol.decode_ack_reply(reply)

    async def nack(
        self,
        topic: TopicName,
        sub: str,
        consumer_id: str,
        refs: Sequence[tuple[str, int]],
        *,
        delay_ms: int = 0,
    ) -> None:
        """Refuse ``(partition, offset)`` pairs: redelivered after ``delay_ms``."""
        await self._acks(topic, sub, DispatchOp.NACK, consumer_id, refs, delay_ms)

    async def ack_ranges(
        self, topic: TopicName, sub: str, consumer_id: str, ranges: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int]]:
        """:meth:`ack` of ``(partition, first, last)`` runs of offsets as they came (an HTTP
        or stream ack body's ``ranges``): passed on as runs, never one ref per offset."""
        reply = await self._ack_runs(topic, sub, DispatchOp.ACK, consumer_id, ranges, 0)
        return protocol.decode_ack_reply(reply)

    async def nack_ranges(
        self,
        topic: TopicName,
        sub: str,
        consumer_id: str,
        ranges: Sequence[tuple[str, int, int]],
        *,
        delay_ms: int = 0,
    ) -> None:
        """:meth:`nack` of ``(partition, first, last)`` runs of offsets."""
        await self._ack_runs(topic, sub, DispatchOp.NACK, consumer_id, ranges, delay_ms)

    async def touch(self, topic: TopicName, sub: str, consumer_id: str) -> None:
        """Tell the subscription the consumer is alive without taking or acking anything (an
        ack of no message): its session does not expire. RemoteError ``consumer_not_found``
        when it is not attached."""
        await self._acks(topic, sub, DispatchOp.ACK, consumer_id, (), 0)

    async def detach(self, topic: TopicName, sub: str, consumer_id: str) -> None:
        """Detach a consumer; its unacked messages go to the others."""
        body = orjson.dumps({"consumer_id": consumer_id})
        await self._request(topic, sub, DispatchOp.DETACH, body, self.timeout_s)

    async def seek(
        self, topic: TopicName, sub: str, position: protocol.StartPosition
    ) -> dict[str, int]:
        """Move the subscription's cursors to ``position``; the offset each partition (by
        its topic segment) resolved to. RemoteError ``subscription_not_found`` when the
        subscription does not exist."""
        body = orjson.dumps({"position": position})
        reply = await self._request(topic, sub, DispatchOp.SEEK, body, self.timeout_s)
        offsets = orjson.loads(reply)["offsets"]
        return {str(name): int(offset) for name, offset in offsets.items()}

    async def skip(
        self, topic: TopicName, sub: str, partition: str, to_offset: int | None
    ) -> protocol.SkipReply:
        """Move one partition's cursor forward to ``to_offset`` (None: past the damage that
        stops it); the offsets skipped are never delivered. RemoteError ``nothing_to_skip``,
        ``skip_backwards``, ``offset_out_of_range``."""
        body = orjson.dumps({"partition": partition, "to_offset": to_offset})
        reply = await self._request(topic, sub, DispatchOp.SKIP, body, self.timeout_s)
        return protocol.parse(reply, protocol.SkipReply)

    async def stats(
        self, topic: TopicName, sub: str, *, timeout_s: float | None = None
    ) -> protocol.SubscriptionStats | None:
        """The live state of the subscription, ``None`` when no dispatcher serves it (this
        call does not claim it). RemoteError ``subscription_not_found`` when the dispatcher
        serving it knows no such subscription."""
        subject = self.bus.subjects.dispatch(topic, sub, DispatchOp.STATS)
        try:
            reply = await self.bus.request(subject, b"{}", timeout_s=timeout_s or self.timeout_s)
        except NoRespondersError:
            return None
        return protocol.parse(reply.body, protocol.SubscriptionStats)

    async def failure_policy(
        self,
        topic: TopicName,
        sub: str,
        policy: FailurePolicy | Mapping[str, Any] | None = None,
    ) -> protocol.PolicyReply:
        """Replace the subscription's failure policy with ``policy`` (applied at once by
        the dispatcher serving it), or read it (None). RemoteError
        ``subscription_not_found``; ``bad_request`` for a policy out of bounds."""
        body = orjson.dumps({"policy": _policy_body(policy)})
        reply = await self._request(topic, sub, DispatchOp.POLICY, body, self.timeout_s)
        return protocol.parse(reply, protocol.PolicyReply)

    async def delete(self, topic: TopicName, sub: str) -> None:
        """Delete the subscription (consumers detached, config, cursors and owner key
        removed); the next attach creates it afresh."""
        await self._request(topic, sub, DispatchOp.DELETE, b"{}", self.timeout_s)

    async def _acks(
        self,
        topic: TopicName,
        sub: str,
        op: DispatchOp,
        consumer_id: str,
        refs: Sequence[tuple[str, int]],
        delay_ms: int,
    ) -> bytes:
        # Runs of offsets, not an object per ref: one parse per run at the dispatcher.
        ranges = protocol.ref_ranges(refs)
        return await self._ack_runs(topic, sub, op, consumer_id, ranges, delay_ms)

    async def _ack_runs(
        self,
        topic: TopicName,
        sub: str,
        op: DispatchOp,
        consumer_id: str,
        ranges: Sequence[tuple[str, int, int]],
        delay_ms: int,
    ) -> bytes:
        body = orjson.dumps({"consumer_id": consumer_id, "ranges": ranges, "delay_ms": delay_ms})
        return await self._request(topic, sub, op, body, self.timeout_s)

    async def _request(
        self,
        topic: TopicName,
        sub: str,
        op: DispatchOp,
        body: bytes,
        timeout_s: float,
        quiet_s: float = QUIET_S,
    ) -> bytes:
        subject = self.bus.subjects.dispatch(topic, sub, op)
        owner_gone = self._owner_gone

        async def attempt(deadline: float) -> bytes:
            remaining_s = deadline - asyncio.get_running_loop().time()
            request = self.bus.request(subject, body, timeout_s=max(remaining_s, 0.001))
            if owner_gone is None:
                return (await request).body
            try:
                reply = await unless_gone(
                    request,
                    partial(owner_gone, topic, sub),
                    quiet_s=quiet_s,
                    every_s=QUIET_S,
                    name=f"{op} on {topic}/{sub}",
                )
            except GoneError:  # killed under the request: no reply will come
                raise NoRespondersError(subject) from None
            return reply.body

        return await request_with_claim(
            attempt,
            lambda deadline: self._ask_claim(topic, sub, deadline),
            timeout_s=timeout_s,
            timeout_message=f"{op} on {topic}/{sub}: no answer in {timeout_s}s",
        )

    async def _ask_claim(self, topic: TopicName, sub: str, deadline: float) -> RemoteError | None:
        """Ask the queue group to claim; a member that refuses (balancing, drain) is asked
        past at once, up to _CLAIM_ASKS times (each ask picks a member at random), then the
        refusal is returned: the caller backs off, keeping it as the reason should the
        deadline pass."""
        refused: RemoteError | None = None
        for _ in range(_CLAIM_ASKS):
            if deadline <= asyncio.get_running_loop().time():
                break  # the refusal so far stays the reason
            refused = await self._ask_claim_once(topic, sub, deadline)
            if refused is None:
                return None
        return refused

    async def _ask_claim_once(
        self, topic: TopicName, sub: str, deadline: float
    ) -> RemoteError | None:
        remaining_s = deadline - asyncio.get_running_loop().time()
        if remaining_s <= 0:
            return None
        # No dispatcher up yet, or another one won: the retry finds out.
        with contextlib.suppress(NoRespondersError, BusTimeoutError):
            try:
                await self.bus.request(
                    self.bus.subjects.subscription_ownership(topic, sub),
                    b"",
                    timeout_s=remaining_s,
                )
            except RemoteError as exc:
                return exc if exc.code == ClaimRefusedError.code else None
        return None


def _policy_body(policy: FailurePolicy | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A failure policy as a request body carries it (a mapping is checked first:
    BadRequestError naming the bad field)."""
    if policy is None:
        return None
    if not isinstance(policy, FailurePolicy):
        policy = protocol.parse(orjson.dumps(dict(policy)), FailurePolicyIn).stored()
    return policy.model_dump(exclude_none=True)
