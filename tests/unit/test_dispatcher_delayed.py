"""Delayed delivery without servers: the producer's side (the HTTP fields and the SDK's
helpers, their refusals); in the dispatcher, when a record is due, the packed index (in due
order, never early, memory bounded by spilling to files), and a shared or key-shared
machine that holds delayed messages out of its cursor's way, hands them out at their time,
and after a restart from its stored cursors delivers exactly those not acked."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from danube.client.delay import deliver_after, deliver_at
from danube.client.errors import InvalidMessageError
from danube.discovery.doors.bodies.produce import ProduceRequest
from danube.discovery.doors.http.produce_body import parse_produce
from danube.dispatcher.cursor import CursorState, PartitionCursor
from danube.dispatcher.delayed import (
    BUCKET_MS,
    LOAD_AHEAD_MS,
    LOAD_SLICE,
    DelayedMessages,
    FileSpill,
    MemorySpill,
)
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.due_time import due_of
from danube.dispatcher.events import (
    Ack,
    ConsumerAttached,
    Deliver,
    FlushCursor,
    MessagesAvailable,
    Poll,
    Tick,
)
from danube.dispatcher.keyed import KeySharedMachine, record_key
from danube.dispatcher.redelivery import DeliverySettings
from danube.frame import RawFrame, Record, encode_frame, encode_record
from danube.wire.delay import (
    DELAY_MS_MAX,
    DELIVER_AFTER_ATTRIBUTE,
    DELIVER_AT_ATTRIBUTE,
    DelayError,
    delay_attributes,
)

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000  # a publish time, Unix ms


def frame(offset: int, due_ms: int | None = None, *, key: str | None = None) -> RawFrame:
    attributes = {} if due_ms is None else {DELIVER_AT_ATTRIBUTE: str(due_ms)}
    record = encode_record(
        Record(payload=b"x", publish_time_ms=T0, producer="p", key=key, attributes=attributes)
    )
    return RawFrame(offset, memoryview(encode_frame(offset, record)))


def test_a_record_is_due_at_its_time_or_after_its_publish_time() -> None:
    def due(attributes: dict[str, str]) -> int | None:
        record = encode_record(
            Record(payload=b"x", publish_time_ms=T0, producer="p", attributes=attributes)
        )
        return due_of(RawFrame(0, memoryview(encode_frame(0, record))))

    assert due({}) is None
    assert due({"a": "b"}) is None
    assert due({DELIVER_AT_ATTRIBUTE: str(T0 + 5)}) == T0 + 5
    assert due({DELIVER_AFTER_ATTRIBUTE: "250"}) == T0 + 250
    both = {DELIVER_AT_ATTRIBUTE: str(T0 + 7), DELIVER_AFTER_ATTRIBUTE: "250"}
    assert due(both) == T0 + 7  # the absolute time wins
    for bad in ("-1", "1.5", "soon", ""):
        assert due({DELIVER_AFTER_ATTRIBUTE: bad}) is None, bad  # delivered at once
    assert due({DELIVER_AFTER_ATTRIBUTE: str(DELAY_MS_MAX * 3)}) == T0 + DELAY_MS_MAX  # capped


def test_delay_attributes_refuse_what_is_wrong() -> None:
    now = T0
    assert delay_attributes(now_ms=now) == {}
    assert delay_attributes(deliver_after_ms=0, now_ms=now) == {DELIVER_AFTER_ATTRIBUTE: "0"}
    assert delay_attributes(deliver_at_ms=now + 5, now_ms=now) == {
        DELIVER_AT_ATTRIBUTE: str(now + 5)
    }
    refused = [
        {"deliver_after_ms": -1},
        {"deliver_at_ms": -1},
        {"deliver_after_ms": DELAY_MS_MAX + 1},
        {"deliver_at_ms": now + DELAY_MS_MAX + 1},
        {"deliver_at_ms": now, "deliver_after_ms": 1},
    ]
    for asked in refused:
        with pytest.raises(DelayError):
            delay_attributes(now_ms=now, **asked)


def test_the_index_gives_every_message_once_never_early_within_its_memory_bound() -> None:
    rng = random.Random(7)
    spill = MemorySpill()
    index = DelayedMessages(spill, memory_bytes_max=64 * 1024)
    dues: dict[int, int] = {}
    for offset in range(20_000):
        due = T0 + rng.randrange(1_000, 120_000)
        dues[offset] = due
        index.file("p0", offset, due, frame(offset, due))
        # The farthest buckets go to the spill: the two nearest stay (they are read next).
        assert index.memory_bytes <= 64 * 1024 + 2 * 250 * BUCKET_MS
    assert spill.buckets, "nothing was spilled"
    assert index.filed == index.held == 20_000
    seen: dict[int, int] = {}
    now = T0
    while index.filed:
        now += 37
        for got in index.take_due(now, 500):
            assert got.due_ms <= now, "handed out early"
            assert got.due_ms > now - 37, "not handed out as soon as due"
            assert got.offset not in seen, "handed out twice"
            assert bytes(got.frame.data) == bytes(frame(got.offset, dues[got.offset]).data)
            seen[got.offset] = got.due_ms
    assert seen == dues
    assert not spill.buckets  # every bucket spilled was taken back


def machine(kind: str = "shared", cursor: PartitionCursor | None = None) -> SubscriptionMachine:
    cursors = {"p0": cursor or PartitionCursor(0)}
    if kind == "key_shared":
        return KeySharedMachine(cursors, key_of=record_key)
    return SubscriptionMachine(kind, cursors)  # type: ignore[arg-type]


def delivered(actions: Sequence[object]) -> list[int]:
    return [o for a in actions if isinstance(a, Deliver) for o in a.offsets]


def stored(actions: Sequence[object]) -> CursorState:
    (state,) = [a.state for a in actions if isinstance(a, FlushCursor)]
    return state


def test_a_bucket_is_moved_near_in_slices_before_it_falls_due_and_late_filings_join() -> None:
    """A second's worth of messages is moved into the near list LOAD_AHEAD_MS before its
    time, LOAD_SLICE records a step (no step holds the loop for a whole bucket); messages
    filed meanwhile, into that second too, still come once, in time, never early."""
    rng = random.Random(11)
    index = DelayedMessages(MemorySpill())
    start = T0 + 5 * BUCKET_MS
    dues = {offset: start + rng.randrange(BUCKET_MS) for offset in range(3 * LOAD_SLICE + 7)}
    for offset, due in dues.items():
        index.file("p0", offset, due, frame(offset, due))
    assert index.next_due_ms() == start - LOAD_AHEAD_MS
    now, seen, offset = start - LOAD_AHEAD_MS, dict[int, int](), len(dues)
    near_before = 0
    while index.filed:
        if now < start + BUCKET_MS:  # late filings: into the second being moved, then soon
            due = start + rng.randrange(BUCKET_MS) if now < start else now + rng.randrange(1, 400)
            dues[offset] = due
            index.file("p0", offset, due, frame(offset, due))
            offset += 1
        got = index.take_due(now, 10_000)
        if now < start:  # ahead of the second: a slice a step, nothing handed out
            assert got == []
            assert len(index._near) - near_before <= LOAD_SLICE + 1
        for message in got:
            assert message.due_ms <= now, "handed out early"
            assert message.due_ms > now - 5, "not handed out as soon as due"
            assert message.offset not in seen, "handed out twice"
            seen[message.offset] = message.due_ms
            index.done(message.partition, message.offset)
        near_before = len(index._near)
        next_ms = index.next_due_ms()
        assert next_ms is not None or not index.filed
        now += 5
    assert seen == dues
    assert index.held == 0


@pytest.mark.parametrize("kind", ["shared", "key_shared"])
def test_delayed_messages_wait_without_holding_the_cursor_back(kind: str) -> None:
    m = machine(kind)
    m.handle(ConsumerAttached("c1", "one"))
    # 0, 2, 4 are due at T0 + 1000, 3000, 2000; 1, 3 are not delayed.
    dues = {0: T0 + 1000, 2: T0 + 3000, 4: T0 + 2000}
    key = "k" if kind == "key_shared" else None
    reads = [(o, frame(o, dues.get(o), key=key)) for o in range(5)]
    m.handle(MessagesAvailable("p0", reads, 0, 5))
    assert delivered(m.handle(Poll("c1", 100, 1.0, T0))) == [1, 3]
    m.handle(Ack("c1", [("p0", 1), ("p0", 3)]))
    # Every offset is acked in the cursor (its contiguous point is past the delayed ones),
    # and what is stored says where the delayed ones lie and their earliest due time.
    state = stored(m.handle(Tick(3.0, T0 + 10)))
    assert state.next_offset == 5
    assert (state.delay_from, state.delay_due_ms) == (0, T0 + 1000)
    assert m.delayed_count == 3
    assert delivered(m.handle(Poll("c1", 100, 4.0, T0 + 999))) == []
    assert delivered(m.handle(Poll("c1", 100, 4.0, T0 + 1000))) == [0]
    assert delivered(m.handle(Poll("c1", 100, 5.0, T0 + 3500))) == [4, 2]  # by due time
    m.handle(Ack("c1", [("p0", 0), ("p0", 4), ("p0", 2)]))
    state = stored(m.handle(Tick(10.0, T0 + 3600)))
    assert (state.next_offset, state.delay_from, state.delay_due_ms) == (5, None, None)
    assert m.delayed_count == 0
    m.validate()


def test_a_full_subscription_does_not_ask_to_tick_at_a_due_time_it_cannot_release() -> None:
    """At max_held, a delayed message due stays filed (late rather than over the bound); its
    due time must not make the runtime tick at once, over and over, until an ack."""
    m = SubscriptionMachine(
        "shared", {"p0": PartitionCursor(0)}, DeliverySettings(max_held=2, ack_timeout_s=60)
    )
    m.handle(ConsumerAttached("c1", "one"))
    reads = [(0, frame(0)), (1, frame(1)), (2, frame(2, T0 + 1000))]
    m.handle(MessagesAvailable("p0", reads, 0, 3))
    assert delivered(m.handle(Poll("c1", 100, 1.0, T0))) == [0, 1]
    assert m.next_due_ms() is None  # two held: no room for the delayed one
    assert delivered(m.handle(Poll("c1", 100, 2.0, T0 + 1000))) == []
    m.handle(Ack("c1", [("p0", 0)]))
    due_ms = m.next_due_ms()
    assert due_ms is not None
    assert due_ms <= T0 + 1000  # room again: step now
    assert delivered(m.handle(Poll("c1", 100, 3.0, T0 + 1001))) == [2]
    m.validate()


@pytest.mark.parametrize("kind", ["exclusive", "failover"])
def test_exclusive_and_failover_deliver_delayed_messages_at_once(kind: str) -> None:
    m = machine(kind)
    m.handle(ConsumerAttached("c1", "one"))
    m.handle(MessagesAvailable("p0", [(0, frame(0, T0 + 60_000)), (1, frame(1))], 0, 2))
    assert delivered(m.handle(Poll("c1", 100, 1.0, T0))) == [0, 1]
    assert m.delayed_count == 0


def test_a_restart_from_the_stored_cursor_delivers_exactly_the_delayed_ones_not_acked() -> None:
    rng = random.Random(3)
    dues = {o: T0 + rng.randrange(1_000, 30_000) for o in range(0, 3000, 3)}
    log = [(o, frame(o, dues.get(o))) for o in range(3000)]
    first = machine()
    first.handle(ConsumerAttached("c1", "one"))
    first.handle(MessagesAvailable("p0", log, 0, 3000))
    now = T0
    acked: set[int] = set()
    while now < T0 + 15_000:  # half the delayed ones are due and acked, promptly
        now += 50
        got = delivered(first.handle(Poll("c1", 5000, now / 1000, now)))
        first.handle(Ack("c1", [("p0", o) for o in got]))
        acked.update(got)
    state = stored(first.handle(Tick(now / 1000 + 10, now)))
    assert state.next_offset == 3000
    assert state.delay_from is not None
    assert state.delay_from < 3000
    # A second dispatcher resumes from that state: a reader of its own reads again from
    # delay_from, beside the usual reader, which goes on from next_offset at once.
    second = machine(cursor=PartitionCursor.from_state(state))
    second.resume_delayed({"p0": state})
    second.handle(ConsumerAttached("c2", "two"))
    assert second.cursor("p0").read_position == 3000
    more = [(o, frame(o)) for o in range(3000, 3010)]  # produced after the crash
    second.handle(MessagesAvailable("p0", more, 3000, 3010))
    assert delivered(second.handle(Poll("c2", 5000, now / 1000, now))) == list(range(3000, 3010))
    position = second.rescan_position("p0")
    assert position == state.delay_from
    assert position is not None
    elsewhere = log[position + 5 : position + 10]
    second.reread(MessagesAvailable("p0", elsewhere, position + 5, position + 10))  # ignored
    assert second.rescan_position("p0") == position
    while position is not None:  # as the rescan reader does, in fetches of 700
        end = min(position + 700, 3010)
        second.reread(MessagesAvailable("p0", (log + more)[position:end], position, end))
        position = second.rescan_position("p0")
    assert second.cursor("p0").read_position == 3010
    again: list[int] = []
    while now < T0 + 31_000:
        now += 50
        got = delivered(second.handle(Poll("c2", 5000, now / 1000, now)))
        assert all(dues[o] <= now for o in got), "early"
        second.handle(Ack("c2", [("p0", o) for o in got]))
        again.extend(got)
    again = [o for o in again if o < 3000]
    not_acked = {o for o in dues if o not in acked}
    assert not_acked <= set(again), "a delayed message was lost"
    # Those acked again are only those at or after the stored due bound (acked out of due
    # order): with prompt acks, none here.
    assert set(again) - not_acked == set()
    assert second.delayed_count == 0


def test_file_spill_keeps_buckets_apart_and_cleans_up(tmp_path: Path) -> None:
    spill = FileSpill(tmp_path / "sub")
    assert not (tmp_path / "sub").exists()  # made at the first spill only
    spill.append(7, b"ab")
    spill.append(9, b"z")
    spill.prefetch(7)  # read ahead, then appended to: what was read goes back first
    spill.append(7, b"cd")
    assert spill.take(7) == b"abcd"
    assert spill.take(7) == b""  # taken: gone
    spill.prefetch(9)
    spill.drain()
    assert not list((tmp_path / "sub").glob("*.dly"))  # read ahead: its file is gone
    assert spill.take(9) == b"z"
    spill.clear()
    spill.drain()
    assert not (tmp_path / "sub").exists()
    files = FileSpill(tmp_path / "idx")
    index = DelayedMessages(files, memory_bytes_max=4096)
    for offset in range(400):
        index.file("p0", offset, T0 + 1000 * (offset % 40), frame(offset, T0))
    files.drain()
    assert list((tmp_path / "idx").glob("*.dly")), "nothing went to files"
    got = [d.offset for now in range(0, 41_000, 500) for d in index.take_due(T0 + now, 1000)]
    assert got == sorted(range(400), key=lambda o: (o % 40, o))
    files.drain()
    assert not list((tmp_path / "idx").glob("*.dly"))


def test_sdk_helpers_and_http_fields_store_the_attribute() -> None:
    assert deliver_after(250, {"a": "b"}) == {"a": "b", DELIVER_AFTER_ATTRIBUTE: "250"}
    assert deliver_at(T0) == {DELIVER_AT_ATTRIBUTE: str(T0)}
    with pytest.raises(InvalidMessageError):
        deliver_after(-1)
    with pytest.raises(InvalidMessageError):
        deliver_at(int(time.time() * 1000) + DELAY_MS_MAX + 60_000)
    body = b'{"messages": [{"payload": "x", "deliver_after_ms": 5, "attributes": {"a": "b"}}]}'
    assert parse_produce(body) is None  # the model answers (and names what is wrong)
    message = ProduceRequest.model_validate_json(body).messages[0]
    assert message.record_attributes() == {"a": "b", DELIVER_AFTER_ATTRIBUTE: "5"}
    for bad in ('"deliver_after_ms": -1', '"deliver_at_ms": 1, "deliver_after_ms": 1'):
        with pytest.raises(ValidationError):
            ProduceRequest.model_validate_json(f'{{"messages": [{{"payload": "x", {bad}}}]}}')


def test_file_spill_holds_a_bounded_amount_of_unwritten_bytes(tmp_path: Path) -> None:
    spill = FileSpill(tmp_path / "q", queued_bytes_max=10_000)
    for bucket in range(200):
        spill.append(bucket % 7, bytes(1000))
        assert spill.queued_bytes <= 10_000 + 1000  # the bound, plus the one just queued
    assert sum(len(spill.take(b)) for b in range(7)) == 200_000  # nothing lost on the way


def test_a_delayed_message_read_above_an_unacked_one_survives_a_restart() -> None:
    # 0..3 are plain and delivered but not acked when the dispatcher dies; 4 is delayed,
    # acked in the cursor when read: it lies in acked_beyond, above the contiguous point,
    # where the usual reader of a new owner skips it. The read again must reach it.
    log = [(o, frame(o, T0 + 5_000 if o == 4 else None)) for o in range(5)]
    first = machine()
    first.handle(ConsumerAttached("c1", "one"))
    first.handle(MessagesAvailable("p0", log, 0, 5))
    assert delivered(first.handle(Poll("c1", 100, 1.0, T0))) == [0, 1, 2, 3]
    first.cursor("p0").touch()
    state = stored(first.handle(Tick(3.0, T0 + 10)))
    assert (state.next_offset, state.acked_beyond, state.delay_from) == (0, (4,), 0)
    second = machine(cursor=PartitionCursor.from_state(state))
    second.resume_delayed({"p0": state})
    second.handle(ConsumerAttached("c2", "two"))
    second.handle(MessagesAvailable("p0", log[:4], 0, 5))  # the usual reader: 4 is acked
    assert delivered(second.handle(Poll("c2", 100, 1.0, T0))) == [0, 1, 2, 3]
    position = second.rescan_position("p0")
    while position is not None:
        second.reread(MessagesAvailable("p0", log[position:], position, 5))
        position = second.rescan_position("p0")
    assert delivered(second.handle(Poll("c2", 100, 6.0, T0 + 5_000))) == [4]
