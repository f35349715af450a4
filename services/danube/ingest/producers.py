"""Idempotent producers as one copy of a partition's log knows them (docs/client.md, "Exactly
once into the log"; docs/replication.md, "Idempotent producers").

A sequenced record (format version 2) names its producer, the producer's epoch and its
sequence. For every producer name in the log this keeps the newest epoch and the last
``runs_max`` **runs**: sequences ``s .. s+n-1`` stored at offsets ``o .. o+n-1``. A batch is
stored at consecutive offsets, so a resend of any stored batch lies inside one run and its
offsets are found again; two batches of one producer with nothing between them merge into
one run, so a producer alone on its partition needs one run however much it sends.

The states are derived from the log alone: every replica applies what it makes durable
(:meth:`ProducerStates.apply`, a durable listener of its WAL, leader or follower), and a
replica that opens or truncates its log rebuilds them from a snapshot and the frames after it
(danube.ingest.producer_snapshots). So a new leader answers a resend of the last batch its
predecessor stored as the predecessor would have.

Memory is bounded: a state idle for ``idle_s`` goes (``expire``), and past ``producers_max``
the least recently used goes first. A resend after its producer's state went is stored again:
the window of exactly-once is the idle time (documented).

No I/O here: the leader's admission (danube.ingest.sequencing) and the snapshots use this.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import orjson

from danube.frame.record import SequenceRun, is_record_of, sequence_runs

RUNS_MAX_DEFAULT = 5  # as Kafka keeps the last 5 batches of an idempotent producer


@dataclass(slots=True)
class Run:
    """Sequences ``first_sequence ..`` stored at offsets ``first_offset ..``, ``count`` of
    them, one for one."""

    first_sequence: int
    first_offset: int
    count: int

    @property
    def end_sequence(self) -> int:
        return self.first_sequence + self.count

    def offset_of(self, sequence: int, count: int) -> int | None:
        """The offset of ``sequence`` when ``sequence .. sequence+count-1`` all lie here."""
        if self.first_sequence <= sequence and sequence + count <= self.end_sequence:
            return self.first_offset + (sequence - self.first_sequence)
        return None


class ProducerState:
    """One producer's newest epoch and its last runs in this log."""

    __slots__ = ("epoch", "runs", "runs_max", "touched_s")

    def __init__(self, epoch: int, runs_max: int, touched_s: float) -> None:
        self.epoch = epoch
        # A list, not a deque: a deque's blocks cost ten times a one-run list, and most
        # producers hold one run.
        self.runs: list[Run] = []
        self.runs_max = runs_max
        self.touched_s = touched_s

    @property
    def next_sequence(self) -> int | None:
        """The sequence this producer's next record must carry (None: no run yet)."""
        return self.runs[-1].end_sequence if self.runs else None

    def offset_of(self, sequence: int, count: int) -> int | None:
        """Where ``sequence .. sequence+count-1`` were stored, if inside one remembered run."""
        for run in reversed(self.runs):
            offset = run.offset_of(sequence, count)
            if offset is not None:
                return offset
        return None

    def add(self, sequence: int, offset: int, count: int) -> None:
        """Record sequences ``sequence ..`` stored at ``offset ..``, ``count`` of them
        (merged into the last run if they go on from it in both)."""
        runs = self.runs
        if runs:
            last = runs[-1]
            if sequence == last.end_sequence and offset == last.first_offset + last.count:
                last.count += count
                return
        runs.append(Run(sequence, offset, count))
        if len(runs) > self.runs_max:
            del runs[0]


class ProducerStates:
    """Every producer of one partition copy, keyed by the producer name's UTF-8 bytes."""

    def __init__(
        self,
        *,
        runs_max: int = RUNS_MAX_DEFAULT,
        idle_s: float = 3600.0,
        producers_max: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runs_max = runs_max
        self.idle_s = idle_s
        self.producers_max = producers_max
        self._clock = clock
        self._states: OrderedDict[bytes, ProducerState] = OrderedDict()  # least recent first
        self.end_offset = 0  # every record below was applied (or was there before the log)
        self.applied_since_snapshot = 0
        self.evicted = 0  # states dropped at producers_max before their idle time
        # The leader's batches queued, not yet durable, by first offset (see expect).
        self._expected: dict[int, SequenceRun] = {}

    def __len__(self) -> int:
        return len(self._states)

    def get(self, name: bytes) -> ProducerState | None:
        return self._states.get(name)

    def items(self) -> Iterator[tuple[bytes, ProducerState]]:
        return iter(self._states.items())

    def apply(self, first_offset: int, payloads: Sequence[bytes | memoryview]) -> None:
        """Records ``payloads`` were stored at ``first_offset ..``: take in the sequenced
        ones (a WAL durable listener: called once per durable run, in offset order). The
        leader's own batches, announced by :meth:`expect`, are taken whole; anything else is
        read record by record."""
        now_s = self._clock()
        count = len(payloads)
        expected = self._expected
        index = 0
        while index < count:
            known = expected.pop(first_offset + index, None) if expected else None
            if known is not None and _holds(payloads, index, known):
                self._add(known, first_offset + index, now_s)
                index += known.length
                continue
            # (An append is durable whole; one cut short here is read record by record.)
            stop = index + 1
            if expected:  # read up to the next batch the leader announced
                while stop < count and first_offset + stop not in expected:
                    stop += 1
            else:
                stop = count
            part = payloads if (index, stop) == (0, count) else payloads[index:stop]
            for run in sequence_runs(part):
                self._add(run, first_offset + index + run.first_index, now_s)
            index = stop
        self.end_offset = max(self.end_offset, first_offset + count)
        self.applied_since_snapshot += count
        if len(self._states) > self.producers_max:
            self._evict()

    def expect(self, first_offset: int, run: SequenceRun) -> None:
        """The leader queued ``run`` (a checked batch) at ``first_offset``: when it is
        durable, :meth:`apply` takes it whole instead of reading its records again."""
        self._expected[first_offset] = run

    def unexpect(self, first_offset: int, run: SequenceRun) -> None:
        """``run`` will not be stored at ``first_offset`` after all (its write failed)."""
        if self._expected.get(first_offset) is run:
            del self._expected[first_offset]

    def unexpect_all(self) -> None:
        """No batch announced is coming any more (the leader stopped)."""
        self._expected.clear()

    def _add(self, run: SequenceRun, offset: int, now_s: float) -> None:
        state = self._state_for(run.producer, run.producer_epoch, now_s)
        if run.producer_epoch == state.epoch:  # an older epoch's records answer for nothing
            state.add(run.first_sequence, offset, run.length)

    def _state_for(self, name: bytes, epoch: int, now_s: float) -> ProducerState:
        state = self._states.get(name)
        if state is None or epoch > state.epoch:  # a new producer, or its new incarnation
            state = ProducerState(epoch, self.runs_max, now_s)
            self._states[name] = state
        state.touched_s = now_s
        self._states.move_to_end(name)
        return state

    def expire(self) -> int:
        """Drop the states idle for ``idle_s``; how many went."""
        deadline_s = self._clock() - self.idle_s
        gone = 0
        while self._states:
            name, state = next(iter(self._states.items()))
            if state.touched_s > deadline_s:
                break
            del self._states[name]
            gone += 1
        return gone

    def _evict(self) -> None:
        while len(self._states) > self.producers_max:
            self._states.popitem(last=False)
            self.evicted += 1

    # --- snapshots ---------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every state (a log read again from its start)."""
        self._states.clear()
        self._expected.clear()
        self.end_offset = 0
        self.applied_since_snapshot = 0

    def encode(self) -> bytes:
        """The states as a snapshot body (JSON): what :meth:`decode` reads back."""
        return orjson.dumps(
            {
                "end_offset": self.end_offset,
                "producers": [
                    [
                        name.decode("utf-8"),
                        state.epoch,
                        [[r.first_sequence, r.first_offset, r.count] for r in state.runs],
                    ]
                    for name, state in self._states.items()
                ],
            }
        )

    def restore(self, body: bytes) -> None:
        """Replace the states with a snapshot's (``body`` from :meth:`encode`); raises
        ValueError (or a subclass) for a body that is not one."""
        data = orjson.loads(body)
        end_offset = int(data["end_offset"])
        now_s = self._clock()
        states: OrderedDict[bytes, ProducerState] = OrderedDict()
        for name, epoch, runs in data["producers"]:
            state = ProducerState(int(epoch), self.runs_max, now_s)
            for first_sequence, first_offset, count in runs:
                if count < 1 or first_offset + count > end_offset:
                    raise ValueError(f"run {first_sequence}/{first_offset}/{count} out of range")
                state.runs.append(Run(int(first_sequence), int(first_offset), int(count)))
            del state.runs[: -self.runs_max]  # a snapshot of a larger window keeps its newest
            states[str(name).encode("utf-8")] = state
        self._states = states
        self._expected.clear()
        self.end_offset = end_offset
        self.applied_since_snapshot = 0


def _holds(payloads: Sequence[bytes | memoryview], index: int, run: SequenceRun) -> bool:
    """Whether ``payloads[index:]`` begins with ``run``'s records (its first and its last
    checked): what the leader announced is what was stored (a batch announced by a leader
    that stopped since never takes the place of what another leader stored there)."""
    last = run.length - 1
    if index + last >= len(payloads):
        return False
    name, epoch, first = run.producer, run.producer_epoch, run.first_sequence
    return is_record_of(payloads[index], name, epoch, first) and (
        not last or is_record_of(payloads[index + last], name, epoch, first + last)
    )
