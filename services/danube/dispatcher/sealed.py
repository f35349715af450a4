"""Delay snapshots, the pure side: what a subscription's delay index seals as it reads, and
what a new owner takes from the sealed snapshots or reads from the log again (after Pulsar's
bucket snapshots). The I/O is danube.dispatcher.delay_snapshots; the format
danube.dispatcher.snapshot.

**Sealing.** Per partition, a :class:`SealBuffer` holds the delayed messages the usual reader
filed since the last seal, by due bucket. Every seal interval it becomes a snapshot of
``[from_offset, to_offset)``, ``to_offset`` being the cursor's read position: every delayed
message read below it is filed, so the snapshot holds every one of that range. Once the
object is written, a :class:`DelaySnapshotRef` joins the partition's *chain*, stored with
its cursor (an object is referenced only after it is whole). A write that fails leaves a
hole in the chain; a full buffer (``SEAL_BUFFER_BYTES_MAX``) is dropped, another hole: a new
owner reads holes from the log, as it did every range before.

**Resuming** (:func:`plan_resume`). The stored cursor says the delayed messages not acked
lie in ``[delay_from, next_offset)``, each due at or after ``delay_due_ms``. Snapshots of the
chain overlapping that range are loaded (their records filtered to it and to the due bound,
exactly what a read of the log again would file); the rest of it is read from the log: the
holes, and the tail past the last seal (about one seal interval of the log).

**Garbage.** A snapshot whose range is wholly below ``delay_from`` (all acked), or whose
every record is due before the due bound (all delivered), is dropped from the chain and its
object deleted; the chain holds at most ``DELAY_SNAPSHOTS_MAX`` (past it a seal is not
referenced: a hole).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from danube.dispatcher.snapshot import RECORD, BucketEntry, encode_snapshot
from danube.meta.records import DELAY_SNAPSHOTS_MAX, DelaySnapshotRef

__all__ = [
    "DELAY_SNAPSHOTS_MAX",
    "SEAL_BUFFER_BYTES_MAX",
    "Chains",
    "Part",
    "ResumePlan",
    "SealBuffer",
    "Sealed",
    "garbage",
    "plan_resume",
]

# Bytes a partition's seal buffer holds at most (about 1 s of a fast partition's delayed
# messages): past it they are dropped from the buffer (a hole: read from the log).
SEAL_BUFFER_BYTES_MAX = 32 << 20


@dataclass(frozen=True, slots=True)
class Sealed:
    """A seal ready to be written: its range and the snapshot's bytes."""

    partition: str
    from_offset: int
    to_offset: int
    due_max_ms: int
    head_bytes: int
    data: bytes
    slot: int = -1  # the partition's slot in the index when sealed (a seek changes it)


class SealBuffer:
    """The delayed messages of one partition filed since ``from_offset``, by due bucket."""

    def __init__(self, from_offset: int) -> None:
        self._buckets: dict[int, bytearray] = {}
        self._counts: dict[int, int] = {}
        self.restart(from_offset)

    def restart(self, from_offset: int) -> None:
        """Drop what is held: hold from ``from_offset`` on."""
        self.from_offset = from_offset
        self._buckets.clear()
        self._counts.clear()
        self._due_min_ms = 2**63 - 1
        self._due_max_ms = 0
        self._offset_max = -1
        self.size_bytes = 0

    def add(self, bucket: int, due_ms: int, offset: int, frame: bytes | memoryview) -> None:
        """Hold the message at ``offset`` (due at ``due_ms``, in ``bucket``) for the next seal."""
        data = self._buckets.get(bucket)
        if data is None:
            data = self._buckets[bucket] = bytearray()
            self._counts[bucket] = 0
        data += RECORD.pack(due_ms, 0, offset, len(frame))
        data += frame
        self._counts[bucket] += 1
        self._due_min_ms = min(self._due_min_ms, due_ms)
        self._due_max_ms = max(self._due_max_ms, due_ms)
        self._offset_max = max(self._offset_max, offset)
        self.size_bytes += RECORD.size + len(frame)

    @property
    def empty(self) -> bool:
        """Whether nothing was filed since ``from_offset``."""
        return not self._buckets

    def seal(self, partition: str, to_offset: int) -> Sealed:
        """The snapshot of ``[from_offset, to_offset)``; the buffer starts afresh there. A
        ``to_offset`` at or below a message held is raised past it (the messages were filed
        in offset order, so every one below it is held): a snapshot never holds a message
        outside its range, which a reader would drop."""
        to_offset = max(to_offset, self._offset_max + 1)
        data = encode_snapshot(
            self.from_offset,
            to_offset,
            self._buckets,
            self._counts,
            (self._due_min_ms, self._due_max_ms),
        )
        head_bytes = len(data) - self.size_bytes
        sealed = Sealed(partition, self.from_offset, to_offset, self._due_max_ms, head_bytes, data)
        self.restart(to_offset)
        return sealed


@dataclass(slots=True)
class Part:
    """One due bucket of a snapshot to load for a partition, and what to keep of it: the
    records in ``[from_offset, to_offset)`` due at or after ``due_min_ms``."""

    partition: str
    slot: int  # the partition's slot when registered (a seek drops what it read)
    key: str  # the snapshot's object key
    entry: BucketEntry
    from_offset: int
    to_offset: int
    due_min_ms: int
    requested: bool = False
    data: bytes | None = None
    dropped: bool = False  # its snapshot failed: its range is read from the log instead


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """For one partition: the snapshots to load (ranges trimmed to what they give), the
    ranges to read from the log again, the snapshots no longer needed."""

    load: list[DelaySnapshotRef] = field(default_factory=list)
    reread: list[tuple[int, int]] = field(default_factory=list)
    garbage: list[DelaySnapshotRef] = field(default_factory=list)


def plan_resume(
    delay_from: int | None,
    next_offset: int,
    due_min_ms: int | None,
    chain: tuple[DelaySnapshotRef, ...] | list[DelaySnapshotRef],
) -> ResumePlan:
    """Where the delayed messages in ``[delay_from, next_offset)`` due at or after
    ``due_min_ms`` come from: ``chain``'s snapshots where they cover it, the log elsewhere."""
    plan = ResumePlan()
    if delay_from is None or delay_from >= next_offset:
        plan.garbage.extend(chain)
        return plan
    bound = 0 if due_min_ms is None else due_min_ms
    covered = delay_from
    for ref in sorted(chain, key=lambda r: r.from_offset):
        start, end = max(ref.from_offset, covered), min(ref.to_offset, next_offset)
        if start >= end or ref.due_max_ms < bound:
            plan.garbage.append(ref)
            if start < end:  # it holds nothing due at the bound: its range needs no read
                if start > covered:
                    plan.reread.append((covered, start))
                covered = end
            continue
        if start > covered:
            plan.reread.append((covered, start))
        plan.load.append(ref.model_copy(update={"from_offset": start, "to_offset": end}))
        covered = end
    if covered < next_offset:
        plan.reread.append((covered, next_offset))
    return plan


def garbage(
    chain: list[DelaySnapshotRef], delay_from: int | None, due_floor_ms: int | None
) -> list[DelaySnapshotRef]:
    """The snapshots of ``chain`` holding nothing still delayed: wholly below
    ``delay_from`` (None: nothing delayed is left), or every record due before
    ``due_floor_ms`` (each of those was delivered)."""
    if delay_from is None:
        return list(chain)
    floor = 0 if due_floor_ms is None else due_floor_ms
    return [ref for ref in chain if ref.to_offset <= delay_from or ref.due_max_ms < floor]


class Chains:
    """Per partition of one subscription: the buffer of its next seal and the chain of its
    snapshots written; and the snapshots out of a chain whose objects are to be deleted."""

    def __init__(self) -> None:
        self._seals: dict[str, SealBuffer] = {}
        self._chains: dict[str, list[DelaySnapshotRef]] = {}
        self.dropped: list[DelaySnapshotRef] = []

    def start(self, partition: str, from_offset: int) -> None:
        """Seal what is filed in ``partition`` from ``from_offset`` on."""
        self._seals[partition] = SealBuffer(from_offset)

    def add(self, partition: str, bucket: int, due_ms: int, offset: int, frame: memoryview) -> None:
        """The usual reader filed this message (offsets in increasing order)."""
        buffer = self._seals.get(partition)
        if buffer is None:  # after a seek: from this message on
            buffer = self._seals[partition] = SealBuffer(offset)
        elif buffer.size_bytes > SEAL_BUFFER_BYTES_MAX:
            buffer.restart(offset)  # not written in time: a hole, read from the log
        buffer.add(bucket, due_ms, offset, frame)

    def seal(self, partition: str, to_offset: int, slot: int) -> Sealed | None:
        """The next snapshot of ``partition`` up to ``to_offset``, tagged with the
        partition's ``slot``; None when there is nothing to write."""
        buffer = self._seals.get(partition)
        if buffer is None or to_offset <= buffer.from_offset:
            return None
        if not buffer.empty:
            sealed = buffer.seal(partition, to_offset)
            return Sealed(
                partition,
                sealed.from_offset,
                sealed.to_offset,
                sealed.due_max_ms,
                sealed.head_bytes,
                sealed.data,
                slot,
            )
        chain = self._chains.get(partition)
        if chain and chain[-1].to_offset == buffer.from_offset:
            # Nothing delayed was read since: the last snapshot covers this range as well.
            chain[-1] = chain[-1].model_copy(update={"to_offset": to_offset})
        buffer.restart(to_offset)
        return None

    def written(self, partition: str, ref: DelaySnapshotRef) -> bool:
        """``ref`` is written whole: it joins the chain (False when the chain is full)."""
        chain = self._chains.setdefault(partition, [])
        if len(chain) >= DELAY_SNAPSHOTS_MAX:
            return False
        chain.append(ref)
        return True

    def chain(self, partition: str) -> tuple[DelaySnapshotRef, ...]:
        """``partition``'s snapshots, in offset order."""
        return tuple(self._chains.get(partition, ()))

    def keep(self, partition: str, ref: DelaySnapshotRef) -> None:
        """A snapshot of a former owner, being loaded, stays in the chain."""
        self._chains.setdefault(partition, []).append(ref)

    def remove(self, partition: str, key: str) -> None:
        """The snapshot ``key`` failed its check: out of the chain (its range: the log)."""
        self._chains[partition] = [r for r in self._chains.get(partition, []) if r.key != key]

    def drop(self, partition: str) -> None:
        """A seek of ``partition``: its buffer and chain go (the objects to delete)."""
        self._seals.pop(partition, None)
        self.dropped.extend(self._chains.pop(partition, ()))

    def collect(
        self, delay_from: Callable[[str], int | None], due_floor_ms: int | None
    ) -> list[DelaySnapshotRef]:
        """The snapshots holding nothing delayed any more (:func:`garbage`; ``delay_from``
        of a partition) out of their chains, and those dropped since the last call."""
        dead, self.dropped = self.dropped, []
        for partition, chain in self._chains.items():
            found = garbage(chain, delay_from(partition), due_floor_ms)
            if found:
                dead.extend(found)
                self._chains[partition] = [ref for ref in chain if ref not in found]
        return dead

    def clear(self) -> None:
        """Drop every buffer (the subscription stops here; the chains are stored)."""
        self._seals.clear()
