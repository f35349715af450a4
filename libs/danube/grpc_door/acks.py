"""Acks of one consumer, coalesced: Danube's clients send one ``Ack`` call per message, and
one dispatcher request per ack would cap a consumer at the bus's round-trip rate. Acks that
arrive within ``linger_s`` of each other (or ``max_refs`` of them) go to the dispatcher in
one request; every call is answered when that request is (the cursor holding it is stored),
so an answered ``Ack`` keeps the HTTP API's guarantee."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from danube.tasks import TaskSet

Ref = tuple[str, int]  # (partition segment, offset), as the dispatcher takes them
Send = Callable[[Sequence[Ref]], Awaitable[None]]

ACK_LINGER_S = 0.002
ACK_MAX_REFS = 1000


class AckBatcher:
    """Coalesces acks into requests made with ``send``."""

    def __init__(self, send: Send, *, linger_s: float = ACK_LINGER_S, max_refs: int = ACK_MAX_REFS):
        self._send = send
        self._linger_s = linger_s
        self._max_refs = max_refs
        self._pending: list[tuple[Ref, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        # Each request's outcome goes to its acks' callers (_deliver): anything else that
        # escapes is logged. One ends with its request (the dispatcher client's deadline).
        self._tasks = TaskSet("ack requests")

    async def ack(self, ref: Ref) -> None:
        """Ack ``ref``; returns when the request carrying it was answered (or raises its
        error)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((ref, future))
        if len(self._pending) >= self._max_refs:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._linger_s, self._flush)
        await asyncio.shield(future)  # a caller gone does not fail the others' request

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            self._tasks.spawn(self._deliver(batch), name="ack request", on_failure="log")

    async def _deliver(self, batch: list[tuple[Ref, asyncio.Future[None]]]) -> None:
        try:
            await self._send([ref for ref, _ in batch])
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, future in batch:
            if not future.done():
                future.set_result(None)
