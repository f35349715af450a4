"""The delayed messages of one served subscription at run time (shared, key-shared: the
machine's danube.dispatcher.delayed): where they spill past the memory bound, their delay
snapshots sealed and loaded while it is served (with object storage:
danube.dispatcher.delay_snapshots), and the partitions read again for them after a resume
(danube.dispatcher.readers.DelayRescanReader).

The subscription's runtime owns one :class:`DelayServing`; every task it starts is the
runtime's (it spawns them through the runtime's ``spawn``), so a stop or a failure of the
subscription ends them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from danube.config import DispatcherConfig
from danube.dispatcher.cursor import CursorState
from danube.dispatcher.delay_snapshots import (
    DelaySnapshots,
    load_loop,
    seal_loop,
    snapshot_prefix,
)
from danube.dispatcher.delayed import DelayedMessages, FileSpill
from danube.dispatcher.delaying import resume_plan
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import MessagesAvailable
from danube.dispatcher.readers import DelayRescanReader, ReadLinks
from danube.dispatcher.reading import Spawn
from danube.dispatcher.snapshot import SnapshotHead
from danube.meta import TopicName
from danube.storage import ObjectStore

log = logging.getLogger(__name__)

SEAL_LAST_TIMEOUT_S = 5.0  # a stop waits this long at most for its last delay snapshots


class DelayServing:
    """The delayed messages of subscription ``sub`` of ``topic``. ``partitions`` is the
    runtime's own map of the partitions read (it grows with the topic); ``machine`` its
    machine (None before the first attach); ``claim_revision`` the etcd revision of its
    claim (None without one); ``links`` what its rescan readers read with. ``objects`` is
    where delay snapshots go (None: a takeover reads the delayed messages from the log)."""

    def __init__(
        self,
        config: DispatcherConfig,
        objects: ObjectStore | None,
        topic: TopicName,
        sub: str,
        partitions: Mapping[str, TopicName],
        *,
        machine: Callable[[], SubscriptionMachine | None],
        claim_revision: Callable[[], int | None],
        links: ReadLinks,
        spawn: Spawn,
    ) -> None:
        self._config = config
        self._objects = objects
        self._topic = topic
        self._sub = sub
        self._partitions = partitions
        self._machine_or_none = machine
        self._claim_revision = claim_revision
        self._links = links
        self._spawn = spawn
        self._snapshots: DelaySnapshots | None = None
        self._rescanning: set[str] = set()  # partitions with a rescan reader running

    def _machine(self) -> SubscriptionMachine:
        machine = self._machine_or_none()
        assert machine is not None, "delayed messages are served once the machine is"
        return machine

    def new_messages(self) -> DelayedMessages:
        """The delayed messages of a machine that delays: bounded in memory, spilled to a
        directory of their own (made on the first spill, removed when they are dropped)."""
        root = Path(self._config.delayed_spill_dir or tempfile.gettempdir())
        spill_dir = root / f"danube-delayed-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        return DelayedMessages(
            FileSpill(spill_dir), memory_bytes_max=self._config.delayed_memory_bytes_max
        )

    async def resume(
        self, stored: dict[TopicName, CursorState], partitions: Mapping[str, TopicName]
    ) -> None:
        """Resume the delayed messages the ``stored`` cursors name (their snapshots' heads
        read: :meth:`_snapshot_heads`), and seal ``partitions`` from their read positions
        on."""
        heads = await self._snapshot_heads(stored)
        self._machine().resume_delayed({p.topic: state for p, state in stored.items()}, heads)
        self._start_sealing(partitions)

    async def _snapshot_heads(
        self, stored: dict[TopicName, CursorState]
    ) -> dict[str, SnapshotHead]:
        """The heads of the delay snapshots ``stored`` names (none without object storage:
        their ranges are read from the log), sealing on from now when there is storage."""
        delayed, revision = self._machine().delayed, self._claim_revision()
        if self._objects is None or delayed is None or revision is None:
            return {}
        if self._snapshots is None:
            prefix = snapshot_prefix(self._topic, self._sub)
            self._snapshots = DelaySnapshots(self._objects, prefix, revision)
        delayed.sealing = True
        refs = []
        for partition, state in stored.items():
            plan = resume_plan(state)
            refs.extend(plan.load)
            if plan.load or plan.reread:
                log.info(
                    "%s/%s resumes the delayed messages of %s: %d snapshots to load up to %s, "
                    "read again from the log: %s",
                    self._topic,
                    self._sub,
                    partition,
                    len(plan.load),
                    plan.load[-1].to_offset if plan.load else None,
                    plan.reread,
                )
        return await self._snapshots.heads(refs) if refs else {}

    def _start_sealing(self, partitions: Mapping[str, TopicName]) -> None:
        machine = self._machine()
        delayed = machine.delayed
        if delayed is not None:
            for name in partitions:
                delayed.start_sealing(name, machine.cursor(name).read_position)

    def spawn_loops(self) -> None:
        """Seal and load delay snapshots while serving (danube.dispatcher.delay_snapshots)."""
        machine, snapshots = self._machine(), self._snapshots
        delayed = machine.delayed
        if snapshots is None or delayed is None:
            return
        where = f"{self._topic}-{self._sub}"

        def positions() -> dict[str, int]:
            return {name: machine.cursor(name).read_position for name in self._partitions}

        def touch(name: str) -> None:
            machine.cursor(name).touch()

        interval_s = self._config.delayed_seal_interval_s
        self._spawn(seal_loop(snapshots, delayed, positions, touch, interval_s), f"seal-{where}")
        self._spawn(load_loop(snapshots, delayed, self._loaded), f"load-{where}")

    async def seal_last(self) -> None:
        """Seal what was read since the last seal (a clean stop): the final cursor write
        names it, and the next owner reads nothing from the log again."""
        machine, snapshots = self._machine_or_none(), self._snapshots
        if machine is None or machine.delayed is None or snapshots is None:
            return
        positions = {name: machine.cursor(name).read_position for name in self._partitions}
        try:
            async with asyncio.timeout(SEAL_LAST_TIMEOUT_S):
                await snapshots.seal_once(machine.delayed, positions)
        except Exception as exc:  # the next owner reads the range from the log
            log.warning("last seal of %s/%s failed: %s", self._topic, self._sub, exc)

    def drop(self) -> None:
        """Forget the delayed messages held here (their spill files included): the next
        owner reads them again from the log."""
        machine = self._machine_or_none()
        if machine is not None and machine.delayed is not None:
            machine.delayed.clear()

    def rescan(self, partitions: Mapping[str, TopicName]) -> None:
        """A reader of its own for each of ``partitions`` whose delayed messages are to be
        read again (danube.dispatcher.delayed): it ends when that is done."""
        machine = self._machine()
        for name, partition in partitions.items():
            if name not in self._rescanning and machine.rescan_position(name) is not None:
                self._rescanning.add(name)
                self._spawn(self._read_again(partition, name), f"rescan-{partition}")

    async def _read_again(self, partition: TopicName, name: str) -> None:
        def position() -> int | None:
            machine = self._machine_or_none()
            return None if machine is None else machine.rescan_position(name)

        async def reread(event: MessagesAvailable) -> None:
            self._machine().reread(event)
            self._links.notify()

        reader = DelayRescanReader(self._links, partition, name, position=position, deliver=reread)
        try:
            await reader.run()
        finally:
            self._rescanning.discard(name)

    def _loaded(self) -> None:
        """Snapshot parts were loaded: a rescan of a failed one may be wanted, and waiting
        polls may find their bucket's messages due now."""
        self.rescan(self._partitions)
        self._links.notify()
