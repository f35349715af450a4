"""What a served subscription answers, whichever way it delivers: the interface the bus
handlers, the node and the metrics sampler use. :class:`SubscriptionRuntime` (reliable:
cursors, redelivery) and :class:`FanoutRuntime` (non-reliable: fan-out from memory) are the
two kinds (mypy checks both against it where the node builds them)."""

from __future__ import annotations

from typing import Protocol

from danube.dispatcher.store import SubscriptionStore
from danube.meta.failure_policy import FailurePolicy
from danube.wire.dispatcher import protocol


class ServedSubscription(Protocol):
    """One subscription this dispatcher serves."""

    dispatch: str
    """``"reliable"`` or ``"non_reliable"`` (a metric label)."""
    store: SubscriptionStore
    failed: bool
    """Fenced or broken: it answers nothing more."""
    deleted: bool
    """A delete began (for good)."""

    # Life cycle (danube.dispatcher.node).
    async def start(self) -> None: ...
    def fail(self, reason: str) -> None: ...
    def begin_stop(self) -> None: ...
    def hold_cursors(self, held: bool) -> None:
        """Without the node lease: answer acks from memory, hold cursor writes there."""
        ...

    async def flush_held(self) -> None:
        """After the reclaim: write the held cursors (fenced on the new owner key)."""
        ...

    async def stop(self) -> None: ...

    def grow(self, count: int) -> None:
        """Its topic has ``count`` partitions now (it grew): read the new ones too."""
        ...

    def unacked_count(self) -> int:
        """Messages delivered and not acked (non-reliable: buffered), all consumers: what a
        hand-over may deliver again (balancing hands over the smallest first)."""
        ...

    # The operations of the bus (danube.dispatcher.handlers).
    async def attach(self, request: protocol.AttachRequest) -> str: ...
    async def poll(self, request: protocol.PollRequest, wait_s: float) -> bytes:
        """The poll reply: a delivery batch (danube.wire.delivery)."""
        ...

    async def ack(
        self, request: protocol.AckRequest, timeout_s: float
    ) -> list[tuple[str, int]]: ...
    async def nack(self, request: protocol.AckRequest) -> None: ...
    async def detach(self, consumer_id: str) -> None: ...
    async def seek(self, position: protocol.StartPosition) -> dict[str, int]: ...
    async def skip(self, name: str, to_offset: int | None) -> protocol.SkipReply: ...
    async def failure_policy(self, policy: FailurePolicy | None) -> protocol.PolicyReply: ...
    async def stats(self) -> protocol.SubscriptionStats: ...
    async def delete(self) -> None: ...
