"""Idempotent producers without a server: the states a log gives (runs, epochs, expiry,
snapshots) and the leader's admission (fresh, stored, in flight, gaps, fencing), with a
property test that a producer resending at random stores every sequence exactly once; and
the message ids of a topic's window."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.frame import Record, encode_record
from danube.ingest.message_ids import MessageIds, plan_ids
from danube.ingest.producers import ProducerStates
from danube.ingest.sequencing import (
    Admission,
    Fresh,
    InFlight,
    OutOfOrderSequenceError,
    ProducerFencedError,
    SequenceGapError,
    Stored,
    sequenced_batch,
)
from danube.wire.ingest import protocol

pytestmark = pytest.mark.unit


def rec(producer: str, sequence: int | None, epoch: int = 0, payload: bytes = b"x") -> bytes:
    return encode_record(
        Record(
            payload=payload,
            publish_time_ms=1,
            producer=producer,
            sequence=sequence,
            producer_epoch=epoch if sequence is not None else 0,
        )
    )


def batch(producer: str, first: int, count: int, epoch: int = 0) -> list[bytes]:
    return [rec(producer, first + i, epoch) for i in range(count)]


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


# --- the batch of a request -------------------------------------------------------------


def test_a_request_is_unsequenced_or_one_producers_consecutive_sequences() -> None:
    assert sequenced_batch([rec("p", None), rec("q", None)]) is None
    found = sequenced_batch(batch("p", 7, 3, epoch=2))
    assert found is not None
    assert (found.producer, found.epoch, found.first_sequence, found.count) == (b"p", 2, 7, 3)
    for records in (
        [rec("p", 1), rec("p", None)],
        [rec("p", None), rec("p", 1)],
        [rec("p", 1), rec("q", 2)],
        [rec("p", 1, epoch=1), rec("p", 2, epoch=2)],
        [rec("p", 1), rec("p", 3)],
        [rec("p", 2), rec("p", 1)],
    ):
        with pytest.raises(OutOfOrderSequenceError):
            sequenced_batch(records)


# --- the states a log gives ----------------------------------------------------------------


def test_consecutive_batches_merge_into_one_run_and_others_between_split_them() -> None:
    states = ProducerStates()
    states.apply(0, batch("p", 0, 3))
    states.apply(3, batch("p", 3, 2))  # goes on in sequence and offset: one run
    states.apply(5, [rec("q", 0), rec("other", None)])
    states.apply(7, batch("p", 5, 2))  # after others: a run of its own
    p = states.get(b"p")
    assert p is not None
    assert [(r.first_sequence, r.first_offset, r.count) for r in p.runs] == [(0, 0, 5), (5, 7, 2)]
    assert p.next_sequence == 7
    assert p.offset_of(1, 3) == 1
    assert p.offset_of(5, 2) == 7
    assert p.offset_of(4, 2) is None  # straddles two runs: not one stored batch
    assert states.end_offset == 9


def test_only_the_last_runs_are_kept_and_a_new_epoch_starts_over() -> None:
    states = ProducerStates(runs_max=2)
    for index in range(4):  # four runs, each split from the next by another producer
        states.apply(2 * index, [rec("p", index), rec("q", index)])
    p = states.get(b"p")
    assert p is not None
    assert [r.first_sequence for r in p.runs] == [2, 3]
    states.apply(8, [rec("p", 100, epoch=1)])
    p = states.get(b"p")
    assert p is not None
    assert p.epoch == 1
    assert [r.first_sequence for r in p.runs] == [100]
    states.apply(9, [rec("p", 4, epoch=0)])  # an older epoch's record answers for nothing
    assert p.epoch == 1
    assert p.next_sequence == 101


def test_idle_states_expire_and_the_least_recently_used_go_past_the_cap() -> None:
    clock = Clock()
    states = ProducerStates(idle_s=10, producers_max=2, clock=clock)
    states.apply(0, [rec("a", 0)])
    clock.now_s = 5
    states.apply(1, [rec("b", 0)])
    clock.now_s = 11
    assert states.expire() == 1  # a: idle 11 s
    assert states.get(b"a") is None
    assert states.get(b"b") is not None
    states.apply(2, [rec("c", 0)])
    states.apply(3, [rec("d", 0)])
    assert len(states) == 2
    assert states.evicted == 1
    assert states.get(b"b") is None  # the least recently used


@settings(max_examples=50)
@given(st.lists(st.tuples(st.sampled_from("pqr"), st.integers(1, 4), st.booleans()), max_size=30))
def test_states_from_one_pass_from_many_and_from_a_snapshot_agree(
    steps: list[tuple[str, int, bool]],
) -> None:
    log: list[bytes] = []
    next_sequence = {"p": 0, "q": 0, "r": 0}
    for producer, count, plain in steps:
        if plain:
            log += [rec(producer, None)] * count
        else:
            log += batch(producer, next_sequence[producer], count)
            next_sequence[producer] += count
    whole = ProducerStates()
    if log:
        whole.apply(0, log)
    piecewise = ProducerStates()
    for offset, record in enumerate(log):
        piecewise.apply(offset, [record])
    restored = ProducerStates()
    restored.restore(whole.encode())
    for states in (piecewise, restored):
        assert states.encode() == whole.encode()
    for producer, expected in next_sequence.items():
        state = whole.get(producer.encode())
        assert (state.next_sequence if state else 0) == expected


def test_a_snapshot_with_a_run_past_its_end_is_refused() -> None:
    with pytest.raises(ValueError, match="out of range"):
        ProducerStates().restore(b'{"end_offset": 3, "producers": [["p", 0, [[0, 2, 5]]]]}')


# --- the leader's admission --------------------------------------------------------------


class Log:
    """A WAL for the admission: appends take offsets at once; ``durable`` settles them."""

    def __init__(self, states: ProducerStates) -> None:
        self.states = states
        self.records: list[bytes] = []
        self.unsettled: list[tuple[int, list[bytes], asyncio.Future[None]]] = []

    def append(self, records: list[bytes]) -> tuple[int, asyncio.Future[None]]:
        first = len(self.records)
        self.records += records
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.unsettled.append((first, records, future))
        return first, future

    def durable(self) -> None:
        for first, records, future in self.unsettled:
            future.set_result(None)
            self.states.apply(first, records)  # as the WAL: futures first, then listeners
        self.unsettled.clear()


def produce(admission: Admission, log: Log, records: list[bytes]) -> Fresh | Stored | InFlight:
    found = sequenced_batch(records)
    assert found is not None
    verdict = admission.admit(found)
    if isinstance(verdict, Fresh):
        first, future = log.append(records)
        admission.queued(verdict.pending, first, future)
    return verdict


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_resend_is_in_flight_then_stored_and_never_appended_again() -> None:
    states = ProducerStates()
    admission, log = Admission(states), Log(states)
    assert isinstance(produce(admission, log, batch("p", 0, 3)), Fresh)
    resent = produce(admission, log, batch("p", 1, 2))  # a tail of it, still being written
    assert isinstance(resent, InFlight)
    assert resent.skip == 1
    log.durable()
    await settle()
    assert await resent.pending.durable == 0
    assert admission.pending_batches == 0
    stored = produce(admission, log, batch("p", 0, 3))
    assert stored == Stored(0)
    assert len(log.records) == 3
    assert isinstance(produce(admission, log, batch("p", 3, 1)), Fresh)


async def test_gaps_go_backs_and_old_epochs_are_refused() -> None:
    states = ProducerStates(runs_max=2)
    admission, log = Admission(states), Log(states)
    for index in range(3):  # three runs of p, split by q: the first is forgotten
        produce(admission, log, batch("p", 2 * index, 2))
        produce(admission, log, batch(f"q{index}", 0, 1))
        log.durable()
    await settle()
    with pytest.raises(OutOfOrderSequenceError, match="next sequence is 6 \\(a gap"):
        produce(admission, log, batch("p", 7, 1))
    with pytest.raises(OutOfOrderSequenceError, match="go back"):
        produce(admission, log, batch("p", 0, 2))  # older than the runs remembered
    with pytest.raises(OutOfOrderSequenceError, match="go back"):
        produce(admission, log, batch("p", 3, 2))  # straddles two runs
    assert produce(admission, log, batch("p", 4, 2)) == Stored(6)
    assert isinstance(produce(admission, log, batch("p", 50, 1, epoch=1)), Fresh)
    with pytest.raises(ProducerFencedError):
        produce(admission, log, batch("p", 6, 1, epoch=0))


async def test_a_failed_append_and_a_fenced_leader_let_go_of_their_pending_batches() -> None:
    states = ProducerStates()
    admission, log = Admission(states), Log(states)
    first = sequenced_batch(batch("p", 0, 1))
    assert first is not None
    verdict = admission.admit(first)
    assert isinstance(verdict, Fresh)
    admission.failed(verdict.pending, OSError("disk"))
    assert admission.pending_batches == 0
    assert isinstance(produce(admission, log, batch("p", 0, 1)), Fresh)  # sent again: fresh
    resent = produce(admission, log, batch("p", 0, 1))
    assert isinstance(resent, InFlight)
    admission.clear(RuntimeError("not the leader any more"))
    with pytest.raises(RuntimeError):
        await resent.pending.durable


def where(states: ProducerStates, name: bytes) -> tuple[int, int | None] | None:
    """A producer's epoch and next sequence as the states hold them (None: unknown)."""
    state = states.get(name)
    return None if state is None else (state.epoch, state.next_sequence)


async def test_an_announced_batch_counts_only_where_it_was_stored() -> None:
    # The leader announces each batch it queues; the states take it whole only if the
    # records stored at its offset are that batch (a leader that stopped before its batch
    # was durable: another leader stored other records at those offsets).
    states = ProducerStates()
    announced = sequenced_batch(batch("p", 0, 3))
    assert announced is not None
    states.expect(0, announced.run)
    states.apply(0, batch("q", 0, 3))  # another producer's records there instead
    assert (where(states, b"p"), where(states, b"q")) == (None, (0, 3))
    states.expect(3, announced.run)
    states.apply(3, batch("p", 7, 3, epoch=1))  # the same producer, other records
    assert where(states, b"p") == (1, 10)
    # The leader's own batch, once durable, is taken whole as it was stored; a leader
    # that stops forgets what it announced and has not stored.
    admission, log = Admission(states), Log(states)
    assert isinstance(produce(admission, log, batch("r", 0, 4)), Fresh)
    log.durable()
    await settle()
    assert where(states, b"r") == (0, 4)
    assert produce(admission, log, batch("r", 0, 4)) == Stored(0)  # its log's offsets
    assert isinstance(produce(admission, log, batch("r", 4, 1)), Fresh)  # announced at 4
    admission.clear(RuntimeError("not the leader any more"))
    states.apply(4, batch("s", 0, 1))  # what another leader stored there
    assert (where(states, b"r"), where(states, b"s")) == ((0, 4), (0, 1))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("pq"), st.integers(1, 3), st.integers(0, 4), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
async def test_producers_that_resend_at_random_store_each_sequence_exactly_once(
    steps: list[tuple[str, int, int, bool]],
) -> None:
    """Each step sends a producer's next batch, or resends one of its last batches (its
    answer lost), with writes settling at random: the log holds every sequence once, and a
    resend is answered with the offsets the batch was stored at."""
    states = ProducerStates()
    admission, log = Admission(states), Log(states)
    sent: dict[str, list[tuple[int, int, int | None]]] = {"p": [], "q": []}  # first, count, offset
    waiting: list[tuple[InFlight, int]] = []
    for producer, count, back, durable in steps:
        mine = sent[producer]
        if back and len(mine) >= back:
            first, size, offset = mine[-back]
            verdict = produce(admission, log, batch(producer, first, size))
            if isinstance(verdict, Stored):
                assert offset is None or verdict.first_offset == offset
            else:
                assert isinstance(verdict, InFlight)
                waiting.append((verdict, first))
        else:
            first = mine[-1][0] + mine[-1][1] if mine else 0
            verdict = produce(admission, log, batch(producer, first, count))
            assert isinstance(verdict, Fresh)
            mine.append((first, count, len(log.records) - count))
        if durable:
            log.durable()
            await settle()
    log.durable()
    await settle()
    for verdict, first in waiting:
        stored = await verdict.pending.durable + verdict.skip
        found = sequenced_batch([log.records[stored]])
        assert found is not None
        assert found.first_sequence == first  # the resend's offset holds its first record
    for producer, batches in sent.items():
        stored_sequences = [
            found.first_sequence
            for record in log.records
            if (found := sequenced_batch([record])) is not None
            and found.producer == producer.encode()
        ]
        total = sum(count for _, count, _ in batches)
        assert stored_sequences == list(range(total))


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.sampled_from(["p", "q", None]), st.integers(1, 4), st.booleans()),
        min_size=1,
        max_size=20,
    ),
    st.integers(1, 6),
)
def test_the_leaders_announced_batches_give_the_states_reading_every_record_gives(
    appends: list[tuple[str | None, int, bool]], group: int
) -> None:
    """The fast path (the leader announces its batches: taken whole) against its slow twin
    (every record read), over durable runs that join several appends, as group commit does."""
    announced, read = ProducerStates(), ProducerStates()
    log: list[bytes] = []
    next_sequence = {"p": 0, "q": 0}
    for producer, count, announce in appends:
        first = len(log)
        if producer is None:
            log += [rec("plain", None)] * count
            continue
        records = batch(producer, next_sequence[producer], count)
        next_sequence[producer] += count
        log += records
        found = sequenced_batch(records)
        assert found is not None
        if announce:
            announced.expect(first, found.run)
    for start in range(0, len(log), group):  # durable runs of `group` records
        announced.apply(start, log[start : start + group])
        read.apply(start, log[start : start + group])
    assert announced.encode() == read.encode()


# --- message ids ---------------------------------------------------------------------------


async def test_message_ids_expire_are_capped_and_pending_ones_settle() -> None:
    clock = Clock()
    ids = MessageIds(ids_max=2, clock=clock)
    ids.add("a", 0)
    clock.now_s = 5
    ids.add("b", 1)
    ids.expire(window_s=4)
    assert ids.find("a") is None
    assert ids.find("b") == 1
    ids.add("c", 2)
    ids.add("d", 3)  # past ids_max: the oldest goes
    assert ids.find("b") is None
    assert ids.evicted == 1
    pending = ids.pend([("e", 0), ("f", 1)])
    waiting = ids.find("f")
    assert isinstance(waiting, asyncio.Future)
    durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    pending.queued(10, durable)
    durable.set_result(None)
    assert await waiting == 11
    assert ids.find("e") == 10
    failing = ids.pend([("g", 0)])
    refused = ids.find("g")
    failing.failed(OSError("disk full"))
    assert ids.find("g") is None
    assert isinstance(refused, asyncio.Future)
    with pytest.raises(OSError, match="disk full"):
        await refused


async def test_a_batch_that_arrives_before_an_earlier_one_waits_for_it() -> None:
    """Batches in flight together may reach the leader in any order: the later one waits
    until the earlier is admitted (then it goes on from it), or refuses when it never comes."""
    states = ProducerStates()
    admission, log = Admission(states), Log(states)
    early = sequenced_batch(batch("p", 3, 2))
    assert early is not None
    produce(admission, log, batch("p", 0, 1))  # opens p's stream (before it, any start goes)
    with pytest.raises(SequenceGapError):
        admission.admit(early)
    waiting = asyncio.create_task(admission.gap_closed(b"p", timeout_s=5))
    await asyncio.sleep(0)
    assert not waiting.done()
    produce(admission, log, batch("p", 1, 2))  # the missing one
    await asyncio.wait_for(waiting, 1)
    assert isinstance(admission.admit(early), Fresh)
    late = sequenced_batch(batch("p", 9, 1))
    assert late is not None
    started = asyncio.get_running_loop().time()
    await admission.gap_closed(b"p", timeout_s=0.05)  # nothing comes: the wait ends
    assert asyncio.get_running_loop().time() - started >= 0.04
    with pytest.raises(SequenceGapError, match="next sequence is 5"):
        admission.admit(late)


def test_a_produce_with_message_ids_appends_the_new_and_points_repeats_at_their_first() -> None:
    known = MessageIds()
    known.add("stored", 7)
    records = [b"r0", b"r1", b"r2", b"r3", b"r4"]
    plan = plan_ids(records, ["a", None, "a", "stored", "b"], known)
    assert plan.fresh == [b"r0", b"r1", b"r4"]  # "a" once, the record without an id, "b"
    assert plan.fresh_ids == [("a", 0), ("b", 2)]
    # Appended from offset 20: r0 at 20, r1 at 21, r4 at 22; the repeat of "a" answers 20
    # and the stored one 7, both marked.
    mark = protocol.DUPLICATE_MARK
    assert plan.listed(20, [7]) == [20, 21, 20 | mark, 7 | mark, 22]
