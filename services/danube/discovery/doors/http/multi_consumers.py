"""The consumers one many-topics stream (:mod:`danube.discovery.doors.http.multi_session`)
holds at the dispatchers, one per joined topic: attached a few at once, and all detached when
the stream ends, including those whose attach the end cut short (the dispatcher may attach
them all the same, and an exclusive subscription would then stay taken for
``dispatcher.consumer_session_timeout_s``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Literal

from danube.aio import awaited_task
from danube.errors import DanubeError
from danube.meta import TopicName
from danube.wire.dispatcher.client import DispatcherClient

# Attaches (and detaches) under way at once for one stream: a pattern matching hundreds of
# topics opens in a few round trips, without a burst of hundreds of bus requests.
ATTACH_CONCURRENCY = 16
# Detaching every consumer when the stream ends, at most this long in all (those not
# detached by then expire after dispatcher.consumer_session_timeout_s).
DETACH_TIMEOUT_S = 5.0


class StreamConsumers:
    """The consumers named ``name`` (of ``type``) of one stream on subscription ``sub``."""

    def __init__(self, dispatcher: DispatcherClient, sub: str, name: str, type: str) -> None:
        self._dispatcher = dispatcher
        self._sub = sub
        self._name = name
        self._type = type
        self._gate = asyncio.Semaphore(ATTACH_CONCURRENCY)
        # Attaches cut short by the stream's end, still in flight (detach_all's to finish).
        self._attaching: list[tuple[TopicName, asyncio.Task[str]]] = []

    async def attach(self, topic: TopicName, start: Literal["latest", "earliest"]) -> str:
        """Attach a consumer to ``topic``; its id. One whose caller is cancelled (the stream
        ends) goes on, and :meth:`detach_all` detaches it once it answers."""
        async with self._gate:
            call = awaited_task(
                self._dispatcher.attach(topic, self._sub, self._name, type=self._type, start=start),
                name=f"attach {topic}",
            )
            try:
                return await asyncio.shield(call)
            except asyncio.CancelledError:
                self._attaching.append((topic, call))
                raise

    async def detach_all(self, joined: Sequence[tuple[TopicName, str]]) -> None:
        """Detach the ``(topic, consumer id)`` of ``joined``, and those of attaches still in
        flight once they answer (at most DETACH_TIMEOUT_S in all): their unacked messages go
        to the other consumers at once."""
        attaching, self._attaching = self._attaching, []

        async def detach(topic: TopicName, consumer_id: str) -> None:
            async with self._gate:
                with contextlib.suppress(DanubeError, TimeoutError):
                    await self._dispatcher.detach(topic, self._sub, consumer_id)

        async def detach_when_attached(topic: TopicName, call: asyncio.Task[str]) -> None:
            try:
                consumer_id = await call
            except (DanubeError, TimeoutError):
                return  # not attached: nothing to detach
            await detach(topic, consumer_id)

        try:
            async with asyncio.timeout(DETACH_TIMEOUT_S):
                await asyncio.gather(
                    *(detach(topic, consumer_id) for topic, consumer_id in joined),
                    *(detach_when_attached(topic, call) for topic, call in attaching),
                )
        except TimeoutError:
            for _, call in attaching:
                call.cancel()
