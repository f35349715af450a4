"""Acks answered once stored: which cursor write holds an ack, and waiting for it.

A cursor's :attr:`~danube.dispatcher.cursor.PartitionCursor.flush_seq` counts the states
handed out for writing; an ack made now lands in write ``flush_seq + 1`` if the cursor is
dirty, else in ``flush_seq``. :class:`AckDurability` keeps the highest write stored per
partition and lets one committer write at a time, so acks that arrive while a write runs
share the next one (group commit). The writing itself is the runtime's (``flush``: the
machine's :class:`~danube.dispatcher.events.FlushCursor` actions, fenced on the owner key).

While the dispatcher has no node lease (etcd unreachable) an ack is answered once it counts
in memory: :meth:`AckDurability.hold` releases every waiting ack, and the cursor holding it is
written after the reclaim; what a crash loses meanwhile is delivered again (at-least-once).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Action
from danube.wire.dispatcher.errors import AckNotDurableError


class AckDurability:
    """The stored cursor writes of one subscription; ``flush`` carries out the machine's
    cursor writes (and calls :meth:`stored` for each one that landed)."""

    def __init__(self, flush: Callable[[list[Action]], Awaitable[None]]) -> None:
        self._flush = flush
        self._stored_seq: dict[str, int] = {}
        self._stored = asyncio.Event()  # replaced at every stored write
        self._commit_lock = asyncio.Lock()
        self.held = False
        """No node lease: acks do not wait for their cursor write (it is held)."""

    def hold(self, held: bool) -> None:
        """Start (or end) answering acks without waiting for their cursor write; waiting
        acks look again at once."""
        self.held = held
        stored_event, self._stored = self._stored, asyncio.Event()
        stored_event.set()

    def stored(self, writes: Iterable[tuple[str, int]]) -> None:
        """Writes ``(partition, seq)`` landed: wake the acks waiting for them."""
        for partition, seq in writes:
            self._stored_seq[partition] = max(self._stored_seq.get(partition, 0), seq)
        stored_event, self._stored = self._stored, asyncio.Event()
        stored_event.set()

    async def wait(
        self, machine: SubscriptionMachine, partitions: set[str], timeout_s: float, what: str
    ) -> None:
        """Return once the current state of the cursors of ``partitions`` is stored (writing
        it now if no write holds it yet); AckNotDurableError after ``timeout_s``."""
        targets = {}
        for name in partitions:
            cursor = machine.cursor(name)
            targets[name] = cursor.flush_seq + (1 if cursor.dirty else 0)
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                while True:
                    if self.held:
                        return
                    if all(self._stored_seq.get(n, 0) >= seq for n, seq in targets.items()):
                        return
                    if any(machine.cursor(n).flush_seq < seq for n, seq in targets.items()):
                        await self._commit(machine, targets)
                        continue
                    stored = self._stored  # a write is under way (or failed: the tick retries)
                    await stored.wait()
        except TimeoutError:
            raise AckNotDurableError(
                f"the cursor of {what} was not stored in time; ack again"
            ) from None

    async def _commit(self, machine: SubscriptionMachine, targets: dict[str, int]) -> None:
        async with self._commit_lock:
            # Acks handled while the previous committer wrote are in this state too.
            due = [n for n, seq in targets.items() if machine.cursor(n).flush_seq < seq]
            if due:
                await self._flush(machine.flush_dirty(due, time.monotonic()))
