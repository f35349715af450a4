"""The readers of one served subscription: a reader per partition (readers.PartitionReader)
reading from its cursor's read position, each read handed to the machine and what it
decides carried out; paused, resumed and woken as the machine says (its actions). Tracks
the largest record read, which bounds how many messages a poll takes.

The subscription's runtime owns one :class:`SubscriptionReaders`; every reader runs as a
task of the runtime's (spawned through its ``spawn``), so a stop or a failure of the
subscription ends them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from danube.dispatcher import tiers
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Action, MessagesAvailable
from danube.dispatcher.readers import PartitionReader, ReadLinks
from danube.frame import FRAME_HEADER_BYTES
from danube.meta import TopicName

Spawn = Callable[[Coroutine[Any, Any, None], str], None]
"""Starts a task (named) that its owner stops, and whose failure fails the subscription."""


class SubscriptionReaders:
    """The partition readers of one subscription, by short name. ``machine`` is its
    machine (asked once it is served), ``run_actions`` carries out what it decides."""

    def __init__(
        self,
        links: ReadLinks,
        *,
        machine: Callable[[], SubscriptionMachine],
        run_actions: Callable[[list[Action]], Awaitable[None]],
        spawn: Spawn,
    ) -> None:
        self.links = links
        self._machine = machine
        self._run_actions = run_actions
        self._spawn = spawn
        self._readers: dict[str, PartitionReader] = {}
        # The largest record read so far: a poll takes no more messages than fit one reply.
        self.record_bytes_max = 0

    def start(self, partition: TopicName, name: str) -> None:
        """Read ``partition`` (short name ``name``) from its cursor's read position on."""

        def position() -> int | None:
            return self._machine().cursor(name).read_position

        reader = PartitionReader(
            self.links, partition, name, position=position, deliver=self._deliver
        )
        self._readers[name] = reader
        self._spawn(reader.run(), f"reader-{partition}")

    def set_paused(self, name: str, paused: bool) -> None:
        """Honour PauseReading / ResumeReading for partition ``name``."""
        reader = self._readers.get(name)
        if reader is not None:
            reader.set_paused(paused)

    def wake(self, name: str) -> None:
        """Partition ``name`` reads now, from its cursor's (new) read position (ReadFrom)."""
        reader = self._readers.get(name)
        if reader is not None:
            reader.wake()

    async def _deliver(self, event: MessagesAvailable) -> None:
        """A reader's read into the machine; waiting polls look again; what the machine
        decided is carried out."""
        if event.messages:
            frames = tiers.frame_views([payload for _, payload in event.messages])
            size = max(map(len, frames)) - FRAME_HEADER_BYTES
            self.record_bytes_max = max(self.record_bytes_max, size)
        actions = self._machine().handle(event)
        self.links.notify()
        await self._run_actions(actions)
