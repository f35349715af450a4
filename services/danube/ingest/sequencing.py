"""The leader's admission of idempotent producers' records (docs/client.md, "Exactly once
into the log").

A produce request is either unsequenced (format version 1 records: appended as they come) or
one **sequenced batch**: every record of one producer and epoch, sequences consecutive. The
leader decides, before anything is appended, what the batch is:

- **fresh**: its first sequence is the one the producer's next record must carry (or the
  producer, or this epoch of it, is new here: any start): it is appended, and stays
  *pending* until the WAL has it durable (then the producer's state, derived from the log
  by danube.ingest.producers, holds it);
- **stored**: it lies inside a run the state remembers: answered with those offsets once
  they are committed, nothing appended (``duplicate``);
- **in flight**: it lies inside a pending batch (a resend while the first attempt is still
  being written): answered with that batch's offsets once it is durable and committed;
- past the next sequence (a gap): batches sent together may arrive in any order, so the
  leader holds it until the missing one is admitted, for at most ``SEQUENCE_GAP_WAIT_S``,
  then looks again (:meth:`Admission.gap_closed`); a gap that stays is refused
  (``out_of_order_sequence``), as is a resend that goes back into what was stored in other
  cuts; an epoch older than the newest seen for the producer name is ``producer_fenced``.

Pending batches live on the leader only: they hold their WAL append's durable future, which
the writer resolves whether or not the producer that sent the batch still waits (the bus
cancels a handler at the caller's deadline; the append goes on). Everything here is
decided without waiting; the leader (danube.ingest.partition) does the waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from danube.errors import DanubeError, ErrorKind
from danube.frame.record import SequenceRun, sequence_runs
from danube.ingest.producers import ProducerStates
from danube.wire.ingest import protocol

SEQUENCE_GAP_WAIT_S = 1.0
"""How long a batch that arrived before an earlier one of its producer waits for it."""


class OutOfOrderSequenceError(DanubeError):
    """A sequenced batch that is neither the next one nor a resend this leader remembers,
    or a request whose sequences are not one producer's consecutive ones."""

    code = protocol.OUT_OF_ORDER_SEQUENCE
    kind = ErrorKind.CONFLICT


class SequenceGapError(OutOfOrderSequenceError):
    """A batch past the producer's next sequence: an earlier one is missing (lost, or still
    on its way: batches in flight together may arrive in any order)."""


class ProducerFencedError(DanubeError):
    """A producer whose epoch is older than one this partition has seen for its name."""

    code = protocol.PRODUCER_FENCED
    kind = ErrorKind.CONFLICT


@dataclass(frozen=True, slots=True)
class SequencedBatch:
    """The records of one produce request, all from ``producer`` at ``epoch``, sequences
    ``first_sequence .. first_sequence+count-1``."""

    producer: bytes
    epoch: int
    first_sequence: int
    count: int
    run: SequenceRun  # the same, as the producers' states take it

    @property
    def end_sequence(self) -> int:
        return self.first_sequence + self.count

    def describe(self) -> str:
        name = self.producer.decode("utf-8", "replace")
        last = self.end_sequence - 1
        return f"producer {name!r} epoch {self.epoch} sequences {self.first_sequence}..{last}"


def sequenced_batch(
    records: Sequence[bytes | memoryview], runs: list[SequenceRun] | None = None
) -> SequencedBatch | None:
    """The batch ``records`` are, None when none is sequenced; OutOfOrderSequenceError when
    they mix sequenced and unsequenced records, producers or epochs, or their sequences do
    not follow one another. ``runs``: their ``sequence_runs``, when read already."""
    if runs is None:
        runs = sequence_runs(records)
    if not runs:
        return None
    run = runs[0]
    if len(runs) == 1 and run.length == len(records):
        return SequencedBatch(run.producer, run.producer_epoch, run.first_sequence, run.length, run)
    if sum(r.length for r in runs) < len(records):
        raise OutOfOrderSequenceError("a request mixes sequenced and unsequenced records")
    second = runs[1]
    raise OutOfOrderSequenceError(
        f"record {second.first_index} ({second.producer!r} epoch {second.producer_epoch} "
        f"sequence {second.first_sequence}) does not go on from record 0 ({run.producer!r} "
        f"epoch {run.producer_epoch} sequence {run.first_sequence}): one request carries "
        "one producer's consecutive sequences"
    )


@dataclass(slots=True, eq=False)
class Pending:
    """A fresh batch between its admission and its durability on this leader."""

    batch: SequencedBatch
    # The first offset once the WAL took the offsets (None before: waiting for room).
    first_offset: int | None = None
    # Done with the first offset once the append is durable here, or with its failure.
    durable: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(frozen=True, slots=True)
class Fresh:
    pending: Pending


@dataclass(frozen=True, slots=True)
class Stored:
    first_offset: int


@dataclass(frozen=True, slots=True)
class InFlight:
    pending: Pending
    skip: int  # the resend starts this many records into the pending batch


Verdict = Fresh | Stored | InFlight


class Admission:
    """The leader's decision for each sequenced batch (see the module docstring), over the
    producers' states of its log and the batches it has pending."""

    def __init__(self, states: ProducerStates) -> None:
        self.states = states
        self._pending: dict[bytes, deque[Pending]] = {}
        # Set when a producer's next batch is admitted: what its batches past a gap wait for.
        self._moved: dict[bytes, asyncio.Event] = {}

    async def gap_closed(self, producer: bytes, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until ``producer`` has another batch admitted: the
        one missing before a batch that arrived early may be it."""
        moved = self._moved.get(producer)
        if moved is None:
            moved = self._moved[producer] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await moved.wait()

    @property
    def pending_batches(self) -> int:
        return sum(map(len, self._pending.values()))

    def admit(self, batch: SequencedBatch) -> Verdict:
        """Decide ``batch``; a fresh one is pending from now on: the caller passes it to
        :meth:`queued` when the WAL takes its offsets, or to :meth:`failed`."""
        name, epoch, first = batch.producer, batch.epoch, batch.first_sequence
        pending = self._pending.get(name)
        state = self.states.get(name)
        newest = max(
            state.epoch if state is not None else -1,
            pending[-1].batch.epoch if pending else -1,
        )
        if epoch < newest:
            raise ProducerFencedError(
                f"{batch.describe()}: epoch {newest} of this producer has written here since "
                "(a newer instance of the producer took over)"
            )
        expected: int | None = None
        if pending and pending[-1].batch.epoch == epoch:
            for entry in pending:
                inside = entry.batch
                if (
                    inside.epoch == epoch
                    and inside.first_sequence <= first
                    and batch.end_sequence <= inside.end_sequence
                ):
                    return InFlight(entry, first - inside.first_sequence)
            expected = pending[-1].batch.end_sequence
        elif state is not None and state.epoch == epoch:
            expected = state.next_sequence
        if expected is None or first == expected:
            entry = Pending(batch)
            self._pending.setdefault(name, deque()).append(entry)
            moved = self._moved.pop(name, None)
            if moved is not None:
                moved.set()  # batches of this producer waiting past a gap look again
            return Fresh(entry)
        if first > expected:
            raise SequenceGapError(
                f"{batch.describe()}: the next sequence is {expected} (a gap: an earlier "
                "batch is missing)"
            )
        if state is not None and state.epoch == epoch:
            offset = state.offset_of(first, batch.count)
            if offset is not None:
                return Stored(offset)
        raise OutOfOrderSequenceError(
            f"{batch.describe()}: the next sequence is {expected}; these go back into what "
            f"was stored, and are not one batch this partition remembers (its last "
            f"{self.states.runs_max} runs)"
        )

    def queued(
        self, entry: Pending, first_offset: int, durable: asyncio.Future[None] | None
    ) -> None:
        """The WAL took ``entry``'s offsets; ``durable`` (None: durable already) settles it.
        The batch is announced to the producers' states (before the WAL's durable listener
        runs for it): they take it whole rather than reading its records again."""
        entry.first_offset = first_offset
        self.states.expect(first_offset, entry.batch.run)
        if durable is None:
            self._settle(entry, None)
        else:
            durable.add_done_callback(lambda done: self._settle(entry, done))

    def failed(self, entry: Pending, exc: BaseException) -> None:
        """``entry`` was never queued (its append failed first)."""
        if entry.first_offset is None and not entry.durable.done():
            entry.durable.set_exception(exc)
            entry.durable.exception()  # read: a resend may never come to read it
        self._forget(entry)

    def clear(self, exc: BaseException) -> None:
        """This leader stops: every pending batch fails with ``exc`` (a resend waiting on
        one is answered with it and goes to the next leader)."""
        for entries in self._pending.values():
            for entry in entries:
                if not entry.durable.done():
                    entry.durable.set_exception(exc)
                    entry.durable.exception()
        self._pending.clear()
        self.states.unexpect_all()

    def _settle(self, entry: Pending, done: asyncio.Future[None] | None) -> None:
        if not entry.durable.done():
            if done is None or (not done.cancelled() and done.exception() is None):
                assert entry.first_offset is not None
                entry.durable.set_result(entry.first_offset)
            else:
                error = done.exception() if not done.cancelled() else asyncio.CancelledError()
                assert error is not None
                assert entry.first_offset is not None
                self.states.unexpect(entry.first_offset, entry.batch.run)
                entry.durable.set_exception(error)
                entry.durable.exception()
        self._forget(entry)

    def _forget(self, entry: Pending) -> None:
        entries = self._pending.get(entry.batch.producer)
        if entries is None:
            return
        try:
            entries.remove(entry)
        except ValueError:
            return
        if not entries:
            del self._pending[entry.batch.producer]
