"""The consumer operations of the subscriptions this dispatcher owns, called in its own
process (danube.wire.consume.messages.ConsumerCalls): what its consume door serves with,
where discovery goes over the bus (DispatcherClient). The requests are the bus's own
(danube.wire.dispatcher.protocol), checked the same; only the hop is gone.

A subscription this dispatcher does not own (any more: it moved, it was never here) is
:class:`~danube.errors.NotLeaderError`, naming its owner's consume door when etcd says who
owns it and that owner advertises one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from danube.dispatcher.served import ServedSubscription
from danube.errors import NotLeaderError
from danube.meta import MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.doors import owner_door
from danube.wire.dispatcher import protocol

# An ack or a detach is answered within this (as DispatcherClient's calls).
CALL_TIMEOUT_S = 10.0

Owned = Callable[[TopicName, str], ServedSubscription | None]


class LocalConsumers:
    """ConsumerCalls over the runtimes of this dispatcher's subscriptions."""

    def __init__(self, owned: Owned, store: MetaStore) -> None:
        self.owned = owned
        self.store = store

    async def runtime(self, topic: TopicName, sub: str) -> ServedSubscription:
        """The runtime serving ``sub`` of ``topic`` here; NotLeaderError when there is none."""
        runtime = self.owned(topic, sub)
        if runtime is None or runtime.failed or runtime.deleted:
            raise NotLeaderError(
                f"this dispatcher does not own {topic}/{sub}; attach again or use discovery",
                leader_url=await self.owner_url(topic, sub),
            )
        return runtime

    async def owner_url(self, topic: TopicName, sub: str) -> str | None:
        """The consume door of ``sub``'s owner as etcd says now (two reads), None when
        nobody owns it, its owner advertises none, or etcd does not answer."""
        try:
            _, url = await owner_door(
                self.store, meta_keys.subscription_owner_key(topic, sub), "dispatcher"
            )
        except Exception:  # a hint only: the client attaches again through discovery
            return None
        return url

    async def poll(
        self, topic: TopicName, sub: str, consumer_id: str, *, max: int = 100, wait_ms: int = 1000
    ) -> protocol.PollBatch:
        """Up to ``max`` messages, waiting at most ``wait_ms`` for the first."""
        return protocol.decode_poll_reply(await self._poll(topic, sub, consumer_id, max, wait_ms))

    async def poll_frames(
        self, topic: TopicName, sub: str, consumer_id: str, *, max: int = 100, wait_ms: int = 1000
    ) -> protocol.PolledFrames:
        """:meth:`poll`, the delivery batch to pass on as it is."""
        return protocol.check_poll_reply(await self._poll(topic, sub, consumer_id, max, wait_ms))

    async def _poll(
        self, topic: TopicName, sub: str, consumer_id: str, max: int, wait_ms: int
    ) -> bytes:
        runtime = await self.runtime(topic, sub)
        request = protocol.PollRequest(consumer_id=consumer_id, max=max, wait_ms=wait_ms)
        return await runtime.poll(request, wait_ms / 1000)

    async def ack_ranges(
        self, topic: TopicName, sub: str, consumer_id: str, ranges: Sequence[tuple[str, int, int]]
    ) -> list[tuple[str, int]]:
        """Acknowledge runs of offsets; the refs that were not in flight."""
        runtime = await self.runtime(topic, sub)
        return await runtime.ack(_acks(consumer_id, ranges, 0), CALL_TIMEOUT_S)

    async def nack_ranges(
        self,
        topic: TopicName,
        sub: str,
        consumer_id: str,
        ranges: Sequence[tuple[str, int, int]],
        *,
        delay_ms: int = 0,
    ) -> None:
        """Refuse runs of offsets: redelivered after ``delay_ms``."""
        runtime = await self.runtime(topic, sub)
        await runtime.nack(_acks(consumer_id, ranges, delay_ms))

    async def nack(
        self,
        topic: TopicName,
        sub: str,
        consumer_id: str,
        refs: Sequence[tuple[str, int]],
        *,
        delay_ms: int = 0,
    ) -> None:
        """Refuse ``(partition, offset)`` pairs."""
        ranges = protocol.ref_ranges(refs)
        await self.nack_ranges(topic, sub, consumer_id, ranges, delay_ms=delay_ms)

    async def touch(self, topic: TopicName, sub: str, consumer_id: str) -> None:
        """The consumer is alive (an ack of nothing); ``consumer_not_found`` if it is not."""
        runtime = await self.runtime(topic, sub)
        await runtime.ack(_acks(consumer_id, (), 0), CALL_TIMEOUT_S)

    async def detach(self, topic: TopicName, sub: str, consumer_id: str) -> None:
        """Detach a consumer; its unacked messages go to the others."""
        runtime = await self.runtime(topic, sub)
        await runtime.detach(consumer_id)


def _acks(
    consumer_id: str, ranges: Sequence[tuple[str, int, int]], delay_ms: int
) -> protocol.AckRequest:
    # The bus's request, with the checks of the bus's handler (its model's), taken from the
    # values as they are rather than from a JSON body written for the purpose.
    fields = {"consumer_id": consumer_id, "ranges": ranges, "delay_ms": delay_ms}
    return protocol.validated(fields, protocol.AckRequest)
