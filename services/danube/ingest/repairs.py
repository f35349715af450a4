"""Repairing this replica's copy from an intact in-sync copy (docs/replication.md,
"Damaged copies").

A read that finds a bad frame in this node's copy (a reader's ``wal.fetch`` on the leader, a
follower's ``repl.fetch``, another replica's ``repl.read``) reports the offset here. One task
per replica then, for each damaged segment in turn: scans the segment afresh
(:meth:`Wal.find_damage`), reads the damaged range ``[bad, segment end)`` from an in-sync
replica that holds it intact (leader or follower, :func:`danube.ingest.copies.read_copy`),
and has the WAL rewrite the segment crash-safely (:meth:`Wal.repair_segment`). Afterwards
the segment is byte for byte the other copy's. A repair that cannot be done now (no intact
copy answers, the range is not below the high watermark yet) is tried again with capped,
jittered backoff for as long as the damage is known.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from danube.bus import Bus, BusError, TopicName
from danube.ingest import leadership, metrics
from danube.ingest.copies import read_copy
from danube.ingest.wal import (
    OsFileOps,
    RepairRefusedError,
    SegmentDamage,
    Wal,
    WalError,
    atomic_write,
)
from danube.meta import MetaStore
from danube.meta.backoff import backoff_s
from danube.tasks import TaskSet
from danube.wire.ingest import protocol
from danube.wire.sizes import body_limit

if TYPE_CHECKING:
    from danube.ingest.partition import Partition

log = logging.getLogger(__name__)

REPAIR_BYTES_MAX = 64 * 1024 * 1024
"""A damaged range is gathered in memory before the rewrite: one larger than this (a huge
segment damaged near its start) is not repaired; reads keep going around it (logged)."""
_RETRY_BASE_S = 0.2
_RETRY_CAP_S = 5.0
_HELD_POLL_S = 0.1
# A leader waits at most this long for its hand-over (a transfer takes at most
# ingest.transfer_timeout_s, 2 s by default) before it repairs while it leads.
_HELD_MAX_S = 5.0
DAMAGED_FILE = "damaged.json"
_VERSION = 1


async def in_sync_peers(
    store: MetaStore, name: TopicName, me: str, leading: Partition | None
) -> list[str]:
    """The other in-sync replicas of ``name`` a repair reads from, the leader first: as
    ``leading`` (this node's partition, when it leads) counts them, else as etcd holds them."""
    if leading is not None:
        return [n for n in leading.term.replicas if n in leading.isr and n != me]
    state = (await leadership.read(store, name)).state
    if state is None:
        return []
    ordered = [state.leader, *state.isr]
    return [n for n in dict.fromkeys(ordered) if n in state.isr and n != me]


class Repairer:
    """The damaged segments of one replica's copy and the task that repairs them."""

    def __init__(
        self,
        name: TopicName,
        bus: Bus,
        *,
        wal: Callable[[], Wal | None],
        committed_end: Callable[[], int],
        peers: Callable[[], Awaitable[list[str]]],
        on_change: Callable[[], None],
        guard: asyncio.Lock,
        held: Callable[[], bool] = lambda: False,
        directory: Path | None = None,
    ) -> None:
        """``wal``: the replica's WAL now (it is reopened by a truncation); ``committed_end``:
        the high watermark this replica knows; ``peers``: the other in-sync replicas, the
        leader first; ``on_change``: a damage was found or repaired (the replica reconsiders
        who should lead); ``guard``: held while the segment is rewritten (the replica's
        truncations hold it too); ``held``: whether to wait before repairing (a leader
        hands leadership over first); ``directory``: where the damaged offsets are kept
        (``damaged.json``) until repaired, so a restarted node knows its copy is damaged."""
        self.name = name
        self.bus = bus
        self._wal = wal
        self._committed_end = committed_end
        self._peers = peers
        self._on_change = on_change
        self._guard = guard
        self._held = held
        self._file = None if directory is None else directory / DAMAGED_FILE
        self._stored: frozenset[int] = frozenset()  # as damaged.json holds them
        self._pending: set[int] = set()  # offsets of bad frames reported, not yet repaired
        self._task: asyncio.Task[None] | None = None
        # A repair that fails is logged; the damage stays pending and the next report of it
        # starts another.
        self._tasks = TaskSet(f"repairs of {name}")

    @property
    def damaged(self) -> bool:
        """Whether this copy is known to hold a damaged range not repaired yet."""
        return bool(self._pending)

    def report(self, offset: int) -> None:
        """A read found a bad frame at ``offset`` of this copy: repair it (once)."""
        if offset in self._pending:
            return
        new = not self._pending
        self._pending.add(offset)
        log.warning("%s: this copy is damaged at offset %d; repairing it", self.name, offset)
        if self._task is None or self._task.done():
            self._task = self._tasks.spawn(self._run(), name=f"repair-{self.name}")
        if new:
            metrics.DAMAGED_COPIES.inc()
            self._on_change()

    async def stop(self) -> None:
        """Cancel the repair under way, if any (the replica closes)."""
        task, self._task = self._task, None
        await self._tasks.cancel(task)
        if self._pending:
            self._pending.clear()
            metrics.DAMAGED_COPIES.dec()

    @property
    def lowest(self) -> int | None:
        """The lowest damaged offset known, if any."""
        return min(self._pending) if self._pending else None

    async def load(self) -> None:
        """Take the damaged offsets an earlier run of this replica kept, and repair them."""
        if self._file is None:
            return
        offsets = await asyncio.to_thread(_load, self._file)
        self._stored = frozenset(offsets)
        for offset in sorted(offsets):
            self.report(offset)

    async def _store(self) -> None:
        """Keep the damaged offsets known now (nothing, once all are repaired)."""
        pending = frozenset(self._pending)
        if self._file is None or pending == self._stored:
            return
        await asyncio.to_thread(_save, self._file, sorted(pending))
        self._stored = pending

    async def _run(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        held_until = loop.time() + _HELD_MAX_S
        while self._pending:
            await self._store_quietly()  # kept first: a restart still knows of the damage
            if self._held() and loop.time() < held_until:
                await asyncio.sleep(_HELD_POLL_S)  # leadership is being handed over first
                continue
            offset = min(self._pending)
            try:
                done = await self._repair(offset)
            except (BusError, TimeoutError, OSError, WalError, protocol.BadRequestError) as exc:
                log.info("%s: repair at offset %d not done yet: %s", self.name, offset, exc)
                done = False
            if done:
                failures = 0
                self._pending.discard(offset)
                if not self._pending:
                    await self._store_quietly()
                    metrics.DAMAGED_COPIES.dec()
                    self._on_change()
                continue
            failures += 1
            await asyncio.sleep(backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S))

    async def _store_quietly(self) -> None:
        try:
            await self._store()
        except OSError as exc:  # kept or cleared at the next try
            log.warning("%s: could not write %s: %s", self.name, DAMAGED_FILE, exc)

    async def _repair(self, offset: int) -> bool:
        """Repair the segment holding ``offset``; whether the damage there is gone (repaired
        now, or not there any more: the segment was dropped, or was never damaged)."""
        wal = self._wal()
        if wal is None:
            return False
        damage = await wal.find_damage(offset)
        if damage is None:
            return True
        if damage.end_offset > self._committed_end():
            return False  # not known to be committed on the other copies yet
        for node in await self._peers():
            frames = await self._gather(node, damage)
            if frames is None:
                continue
            try:
                async with self._guard:
                    if self._wal() is not wal:
                        return False  # reopened by a truncation: look again
                    await wal.repair_segment(damage, frames)
            except RepairRefusedError as exc:
                log.warning("%s: %s's copy does not repair %s: %s", self.name, node, damage, exc)
                continue
            metrics.RANGES_REPAIRED.inc()
            metrics.REPAIRED_MESSAGES.inc(damage.end_offset - damage.bad_offset)
            log.warning(
                "%s: repaired offsets %d..%d of %s from %s's copy",
                self.name,
                damage.bad_offset,
                damage.end_offset - 1,
                damage.segment,
                node,
            )
            return True
        return False

    async def _gather(self, node: str, damage: SegmentDamage) -> bytes | None:
        """The whole frames of ``damage``'s range as ``node``'s copy holds them; None when
        that copy cannot give all of it (damaged too, unreachable, dropped)."""
        limit = max(body_limit(self.bus.max_payload_bytes), 4096)
        parts: list[bytes] = []
        size = 0
        offset = damage.bad_offset
        while offset < damage.end_offset:
            try:
                read = await read_copy(
                    self.bus, self.name, node, offset, damage.end_offset, max_bytes=limit // 2
                )
            except (BusError, TimeoutError, protocol.BadRequestError) as exc:
                log.info("%s: could not read %s's copy to repair: %s", self.name, node, exc)
                return None
            if not read.frames:
                if read.next_offset > offset and read.damaged is None and not read.below_start:
                    offset = read.next_offset  # a gap in the log: the segment ends before it
                    continue
                return None
            for frame in read.frames:
                parts.append(bytes(frame.data))
                size += frame.size_bytes
            if size > REPAIR_BYTES_MAX:
                log.error("%s: %s is too large to repair in memory", self.name, damage)
                return None
            offset = read.next_offset
        return b"".join(parts)


def _load(path: Path) -> list[int]:
    """The damaged offsets kept in ``path`` (none when it is missing or unreadable: the
    next read of a damaged range finds it again). Blocking."""
    try:
        body = json.loads(path.read_bytes())
        offsets = body["offsets"] if body.get("version") == _VERSION else []
        return [int(offset) for offset in offsets if int(offset) >= 0]
    except FileNotFoundError:
        return []
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("%s is unreadable (%s); ignoring it", path, exc)
        return []


def _save(path: Path, offsets: list[int]) -> None:
    """Keep ``offsets`` in ``path`` atomically and durably (removed when empty). Blocking."""
    if offsets:
        body = {"version": _VERSION, "offsets": offsets}
        atomic_write(path, json.dumps(body).encode() + b"\n")
        return
    try:
        path.unlink()
    except FileNotFoundError:
        return
    OsFileOps().fsync_dir(path.parent)
