"""A partition copy's idempotent producers' states kept in step with its log
(:class:`ProducerTracking`), and their snapshots, so that a copy that opens (a restart) or
truncates its log rebuilds them reading a bounded amount of it.

A snapshot is ``producers-<end offset:020>.snap`` in the partition's directory::

    [u32 crc32c of the body][body: ProducerStates.encode(), JSON]

written whole or not at all (temp file, fdatasync, rename, directory fsync). It holds the
states of every record below its end offset. The newest ``SNAPSHOTS_KEPT`` stay: a
truncation below the newest (an uncommitted tail cut after a leader change) still finds an
older one. At open, the newest snapshot at or below the log's end is restored (those past it
are deleted: they describe records that were cut) and the frames from its end (or from the
log's start, when retention dropped what lay between) are applied again; a snapshot that
fails its CRC or does not parse is skipped (logged) for the next older one, and with none
the whole log is read.
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
import time
from collections.abc import Sequence
from pathlib import Path

from crc32c import crc32c

from danube.frame import FRAME_HEADER_BYTES
from danube.ingest import metrics
from danube.ingest.producers import ProducerStates
from danube.ingest.wal import Durability, Wal, WalError
from danube.ingest.wal.checkpoint import atomic_write

log = logging.getLogger(__name__)

SNAPSHOT_EVERY_RECORDS = 100_000
"""A replica writes a snapshot once this many records were applied since the last one (and
at a clean close): a rebuild reads at most about this many records past its snapshot."""
SNAPSHOTS_KEPT = 2
_NAME = re.compile(r"producers-(\d{20})\.snap")
_CRC = struct.Struct("<I")
_SCAN_BYTES = 4 * 1024 * 1024  # one read of the rebuild


def _path(directory: Path, end_offset: int) -> Path:
    return directory / f"producers-{end_offset:020d}.snap"


def _listed(directory: Path) -> list[tuple[int, Path]]:
    """The snapshots in ``directory``, newest (highest end offset) first."""
    found: list[tuple[int, Path]] = []
    try:
        names = [entry.name for entry in directory.iterdir()]
    except FileNotFoundError:
        return []
    for name in names:
        match = _NAME.fullmatch(name)
        if match:
            found.append((int(match.group(1)), directory / name))
    return sorted(found, reverse=True)


def write(directory: Path, end_offset: int, body: bytes) -> None:
    """Write a snapshot (``body``: ``ProducerStates.encode()`` of the states at
    ``end_offset``; blocking: run in a thread) and drop all but the newest kept."""
    atomic_write(_path(directory, end_offset), _CRC.pack(crc32c(body)) + body)
    for _, path in _listed(directory)[SNAPSHOTS_KEPT:]:
        path.unlink(missing_ok=True)


def remove_all(directory: Path) -> None:
    """Drop every snapshot (the log starts over)."""
    for _, path in _listed(directory):
        path.unlink(missing_ok=True)


def _restore(directory: Path, states: ProducerStates, *, log_end: int) -> int | None:
    """Restore the newest usable snapshot at or below ``log_end``; its end offset."""
    for end_offset, path in _listed(directory):
        if end_offset > log_end:
            # The log was cut below it (a truncation, a damaged tail): it describes records
            # that are gone, and the offsets will hold others; never to be used again.
            path.unlink(missing_ok=True)
            continue
        try:
            data = path.read_bytes()
            (crc,) = _CRC.unpack_from(data)
            body = data[_CRC.size :]
            if crc32c(body) != crc:
                raise ValueError("crc mismatch")
            states.restore(body)
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.warning("producer snapshot %s skipped: %s", path, exc)
            continue
        return end_offset
    return None


async def rebuild(directory: Path | None, wal: Wal, states: ProducerStates) -> int | None:
    """Make ``states`` those of ``wal``'s records: restore a snapshot (none in memory mode)
    and apply the frames after it. The end offset of the snapshot restored (None: none)."""
    started_s = time.perf_counter()
    restored = None
    if directory is not None:
        restored = await asyncio.to_thread(_restore, directory, states, log_end=wal.next_offset)
    if restored is None:
        states.reset()
    offset = max(restored or 0, wal.start_offset)
    end = wal.durable_next
    read = 0
    while offset < end:
        try:
            result = await wal.fetch(offset, max_bytes=_SCAN_BYTES, max_count=100_000)
        except WalError as exc:
            # A damaged range (repaired from another copy later): the states miss what it
            # held; a resend of it may be stored again. Logged; the rest still counts.
            log.warning("%s: producer states rebuilt up to %d only: %s", directory, offset, exc)
            break
        if not result.frames:
            break
        for first, payloads in _runs(result.frames):
            states.apply(first, payloads)
        read += len(result.frames)
        offset = result.next_offset
    states.end_offset = max(states.end_offset, end)
    elapsed_s = time.perf_counter() - started_s
    metrics.PRODUCER_STATE_REBUILD_SECONDS.observe(elapsed_s)
    if read or restored is not None:
        log.info(
            "%s: %d producer states rebuilt (snapshot at %s, %d records read) in %.3fs",
            directory,
            len(states),
            restored,
            read,
            elapsed_s,
        )
    return restored


def _runs(frames: Sequence[tuple[int, bytes | memoryview]]) -> list[tuple[int, list[bytes]]]:
    """Fetched frames as runs of consecutive offsets with their records."""
    runs: list[tuple[int, list[bytes]]] = []
    for offset, frame in frames:
        record = bytes(memoryview(frame)[FRAME_HEADER_BYTES:])
        if runs and runs[-1][0] + len(runs[-1][1]) == offset:
            runs[-1][1].append(record)
        else:
            runs.append((offset, [record]))
    return runs


class ProducerTracking:
    """One replica's producers' states over the lives of its WAL: rebuilt when a WAL opens
    (after a restart or a truncation), fed by its durable listener, snapshotted when due
    and at a clean close, their idle ones expired; the node's gauge kept."""

    def __init__(self, directory: Path, states: ProducerStates) -> None:
        self.directory = directory
        self.states = states
        self._counted = 0  # what this replica added to the node's gauge
        self._snapshotting = False
        self._snapshot_end: int | None = None  # of the newest snapshot on disk

    async def _before_drop(self, wal: Wal, new_start: int) -> None:
        """The records below ``new_start`` leave the WAL (retention): a rebuild could no
        longer read them, so the newest snapshot must cover them, or a resend of a batch
        they held would be stored again after a restart. A snapshot that cannot be written
        (a full disk, typically) does not stop the drop: freeing the space comes first; the
        loss is only that a restart before the next snapshot deduplicates less (logged)."""
        if self._snapshot_end is not None and self._snapshot_end >= new_start:
            return
        if not await self.snapshot(wal):
            log.warning(
                "%s: no producer snapshot covers offsets below %d as they are dropped: a "
                "restart before the next one may store a resend of them again",
                self.directory,
                new_start,
            )

    async def opened(self, wal: Wal) -> None:
        """``wal`` was just opened (nothing appended yet): rebuild, then follow it."""
        memory = wal.options.durability is Durability.MEMORY
        self._snapshot_end = await rebuild(None if memory else self.directory, wal, self.states)
        wal.add_durable_listener(lambda run: self.states.apply(run.first, run.payloads))
        wal.add_drop_guard(lambda new_start: self._before_drop(wal, new_start))
        self._count()

    async def upkeep(self, wal: Wal | None) -> None:
        """Expire idle states; snapshot once enough was applied since the last one."""
        expired = self.states.expire()
        if expired:
            metrics.PRODUCER_STATES_EXPIRED.labels("idle").inc(expired)
        if self.states.evicted:
            metrics.PRODUCER_STATES_EXPIRED.labels("evicted").inc(self.states.evicted)
            self.states.evicted = 0
        self._count()
        if self.states.applied_since_snapshot >= SNAPSHOT_EVERY_RECORDS:
            await self.snapshot(wal)

    async def snapshot(self, wal: Wal | None) -> bool:
        """Write a snapshot now (not in memory mode; one at a time); whether one was."""
        if wal is None or wal.options.durability is Durability.MEMORY:
            return True  # nothing survives a restart: nothing to cover
        if self._snapshotting:
            return False
        self._snapshotting = True
        try:
            self.states.applied_since_snapshot = 0
            # Encoded here, in the loop: the states change with every durable batch.
            end_offset = self.states.end_offset
            body = self.states.encode()
            await asyncio.to_thread(write, self.directory, end_offset, body)
            self._snapshot_end = end_offset
            return True
        except OSError as exc:  # the next upkeep tries again; a rebuild reads more meanwhile
            log.warning("%s: producer snapshot failed: %s", self.directory, exc)
            return False
        finally:
            self._snapshotting = False

    def started_over(self) -> None:
        """The log starts over, empty (an operator's unclean move): forget everything."""
        self.states.reset()
        remove_all(self.directory)

    def closed(self) -> None:
        """The replica is gone: its states leave the node's gauge."""
        metrics.PRODUCER_STATES.dec(self._counted)
        self._counted = 0

    def _count(self) -> None:
        held = len(self.states)
        metrics.PRODUCER_STATES.inc(held - self._counted)
        self._counted = held
