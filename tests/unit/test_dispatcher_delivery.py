"""The dispatcher's delivery state machine: types, windows, redelivery, dead letters, restarts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from danube.dispatcher.cursor import CursorState, FlushPolicy, PartitionCursor
from danube.dispatcher.delivery import DeliveryType, SubscriptionMachine
from danube.dispatcher.events import (
    Ack,
    Action,
    ConsumerAttached,
    ConsumerDetached,
    DeadLetter,
    Deliver,
    Event,
    FlushCursor,
    Message,
    MessagesAvailable,
    Nack,
    PauseReading,
    Poll,
    ReadFrom,
    ResumeReading,
    Seek,
    Tick,
)
from danube.dispatcher.redelivery import DeliverySettings, redelivery_delay_s
from danube.wire.dispatcher.errors import (
    ConsumerExistsError,
    ConsumerNotFoundError,
    SubscriptionTakenError,
)

pytestmark = pytest.mark.unit


def machine(
    kind: DeliveryType,
    partitions: Sequence[str] = ("p0",),
    rng: float = 0.5,
    **limits: float | str,
) -> SubscriptionMachine:
    cursors = {name: PartitionCursor(0) for name in partitions}
    return SubscriptionMachine(
        kind,
        cursors,
        DeliverySettings(**limits),  # type: ignore[arg-type]
        rng=lambda: rng,
    )


def feed(m: SubscriptionMachine, partition: str, offsets: Sequence[int]) -> list[Action]:
    return m.handle(MessagesAvailable(partition, [(o, f"m{o}") for o in offsets]))


def poll(m: SubscriptionMachine, consumer: str, now_s: float = 0.0, n: int = 1000) -> list[Message]:
    delivered = [a for a in m.handle(Poll(consumer, n, now_s)) if isinstance(a, Deliver)]
    assert all(d.consumer_id == consumer for d in delivered)
    return [msg for d in delivered for msg in d.messages]


def refs(messages: Sequence[Message]) -> list[tuple[str, int]]:
    return [(msg.partition, msg.offset) for msg in messages]


def test_exclusive_refuses_a_second_consumer() -> None:
    m = machine("exclusive")
    m.handle(ConsumerAttached("c1", "first"))
    with pytest.raises(SubscriptionTakenError) as refused:
        m.handle(ConsumerAttached("c2", "second"))
    assert (refused.value.code, refused.value.holder) == ("subscription_taken", "c1")
    assert m.consumers == ["c1"]
    m.handle(ConsumerDetached("c1", 0.0))
    m.handle(ConsumerAttached("c2", "second"))  # free again once the holder left
    assert m.consumers == ["c2"]


def test_shared_spreads_30k_messages_each_to_exactly_one_consumer() -> None:
    m = machine("shared", ("p0", "p1", "p2"), max_held=40_000, max_unacked_per_consumer=100)
    for name in ("p0", "p1", "p2"):
        feed(m, name, range(10_000))
    consumers = ["a", "b", "c"]
    for c in consumers:
        m.handle(ConsumerAttached(c, c))
    seen: Counter[tuple[str, int]] = Counter()
    per_consumer: Counter[str] = Counter()
    rounds = 0
    while len(seen) < 30_000:
        rounds += 1
        assert rounds < 1000
        for c in consumers:
            got = poll(m, c, n=37)
            seen.update(refs(got))
            per_consumer[c] += len(got)
            m.handle(Ack(c, refs(got)))
    assert set(seen.values()) == {1}
    assert set(seen) == {(p, o) for p in ("p0", "p1", "p2") for o in range(10_000)}
    assert min(per_consumer.values()) >= 9_000
    assert all(m.cursor(p).next_offset == 10_000 for p in ("p0", "p1", "p2"))


def test_each_partition_is_delivered_in_offset_order() -> None:
    m = machine("exclusive", ("p0", "p1"))
    feed(m, "p0", range(50))
    feed(m, "p1", range(30))
    m.handle(ConsumerAttached("c", "c"))
    got = poll(m, "c", n=7) + poll(m, "c", n=1000)
    for name, count in (("p0", 50), ("p1", 30)):
        assert [msg.offset for msg in got if msg.partition == name] == list(range(count))


def test_the_window_bounds_unacked_messages_per_consumer() -> None:
    m = machine("shared", max_unacked_per_consumer=10)
    feed(m, "p0", range(100))
    m.handle(ConsumerAttached("c", "c"))
    first = poll(m, "c")
    assert [msg.offset for msg in first] == list(range(10))
    assert poll(m, "c") == []
    m.handle(Ack("c", refs(first[:4])))
    assert [msg.offset for msg in poll(m, "c")] == [10, 11, 12, 13]
    assert len(m.unacked("c")) == 10


def test_failover_takeover_redelivers_the_unacked_window_from_the_first_unacked() -> None:
    m = machine("failover")
    feed(m, "p0", range(20))
    m.handle(ConsumerAttached("a", "a"))
    m.handle(ConsumerAttached("b", "b"))
    assert m.active_consumer == "a"
    assert poll(m, "b") == []  # the standby receives nothing
    got = poll(m, "a", n=10)
    m.handle(Ack("a", [("p0", o) for o in (0, 1, 2, 5)]))
    actions = m.handle(ConsumerDetached("a", 1.0))
    assert FlushCursor("p0", CursorState(next_offset=3, acked_beyond=(5,))) in actions
    assert m.active_consumer == "b"
    taken = poll(m, "b", now_s=1.0)
    assert [msg.offset for msg in taken] == [3, 4, 6, 7, 8, 9, *range(10, 20)]
    assert [msg.redelivery_count for msg in taken[:6]] == [1] * 6
    assert [msg.redelivery_count for msg in taken[6:]] == [0] * 10
    assert len(got) == 10


def test_nack_with_delay_redelivers_after_the_delay_with_count_plus_one() -> None:
    m = machine("shared")
    feed(m, "p0", [0, 1])
    m.handle(ConsumerAttached("c", "c"))
    poll(m, "c", now_s=10.0)
    m.handle(Nack("c", [("p0", 0)], delay_ms=2500, now_s=10.0))
    assert poll(m, "c", now_s=12.499) == []
    again = poll(m, "c", now_s=12.5)
    assert [(msg.offset, msg.redelivery_count) for msg in again] == [(0, 1)]


def test_a_message_held_back_for_later_keeps_only_what_detach_payload_gives() -> None:
    """A delayed redelivery swaps its payload for a detached one (the runtime's own copy of a
    frame, so one held message does not keep a whole fetch reply alive); one due at once
    keeps the payload it had."""
    m = machine("shared")
    m.detach_payload = lambda payload: f"own {payload}"
    feed(m, "p0", [0, 1])
    m.handle(ConsumerAttached("c", "c"))
    poll(m, "c", now_s=10.0)
    m.handle(Nack("c", [("p0", 0)], delay_ms=2500, now_s=10.0))
    m.handle(Nack("c", [("p0", 1)], delay_ms=0, now_s=10.0))
    again = poll(m, "c", now_s=13.0)
    assert sorted((msg.offset, msg.payload) for msg in again) == [(0, "own m0"), (1, "m1")]


def test_ack_timeout_redelivers_with_growing_jittered_backoff() -> None:
    base, ack_timeout = 1.0, 5.0
    m = machine("shared", rng=0.25, ack_timeout_s=ack_timeout, redelivery_base_s=base,
                redelivery_max_s=64.0, max_redeliveries=10)  # fmt: skip
    feed(m, "p0", [0])
    m.handle(ConsumerAttached("c", "c"))
    now = 0.0
    assert len(poll(m, "c", now)) == 1
    delays: list[float] = []
    for attempt in range(5):
        expired_at = now + ack_timeout
        m.handle(Tick(expired_at - 0.001))
        assert m.in_flight("c") == [("p0", 0)]  # not before the timeout
        m.handle(Tick(expired_at))
        assert m.in_flight("c") == []
        assert m.unacked("c") == [("p0", 0)]  # still in its window until delivered again
        ceiling = base * 2**attempt
        delay = ceiling / 2 + 0.25 * ceiling / 2
        assert poll(m, "c", expired_at + delay - 0.001) == []
        again = poll(m, "c", expired_at + delay)
        assert [msg.redelivery_count for msg in again] == [attempt + 1]
        delays.append(delay)
        now = expired_at + delay
    assert delays == sorted(delays)
    assert len(set(delays)) == 5


def test_a_poll_is_delivered_as_columns_and_its_batch_times_out_together() -> None:
    m = machine("shared", ("p0", "p1"), ack_timeout_s=5.0, redelivery_base_s=1.0,
                redelivery_max_s=1.0, backoff_kind="fixed")  # fmt: skip
    feed(m, "p0", range(300))
    feed(m, "p1", range(300))
    m.handle(ConsumerAttached("c", "c"))
    (first,) = [a for a in m.handle(Poll("c", 400, 0.0)) if isinstance(a, Deliver)]
    sent = list(zip(first.partitions, first.offsets, strict=True))
    assert len(sent) == 400
    assert first.payloads == [f"m{o}" for o in first.offsets]
    assert first.redelivery_counts == [0] * 400
    assert refs(first.messages) == sent  # the message view of the same columns
    # One ack deadline for the batch, not a heap item per message.
    assert len(m._deadlines) == 1
    (second,) = [a for a in m.handle(Poll("c", 400, 2.0)) if isinstance(a, Deliver)]
    assert len(second.offsets) == 200
    acked = sent[::2]
    m.handle(Ack("c", acked))
    m.handle(Tick(4.999))
    assert len(m.in_flight("c")) == 600 - len(acked)  # nothing timed out yet
    m.handle(Tick(5.0))  # the first batch's deadline: only its unacked ones come back
    expected = [ref for ref in sent if ref not in set(acked)]
    in_flight = set(m.in_flight("c"))
    assert not in_flight & set(expected)
    assert in_flight == set(zip(second.partitions, second.offsets, strict=True))
    again = poll(m, "c", now_s=6.0, n=1000)
    assert sorted(refs(again)) == sorted(expected)
    assert {msg.redelivery_count for msg in again} == {1}
    m.handle(Tick(7.0))  # the second batch's deadline takes it back, not the resent ones
    assert set(m.in_flight("c")) == set(expected)
    m.handle(Tick(11.0))  # the resent ones time out with the batch they were resent in
    assert m.in_flight("c") == []
    m.validate()


@given(st.lists(st.floats(0.0, 1.0, exclude_max=True), min_size=8, max_size=8))
def test_backoff_delays_stay_in_their_jitter_bounds_and_never_shrink(draws: list[float]) -> None:
    values = iter(draws)
    delays = [
        redelivery_delay_s(a, base_s=0.5, cap_s=1000.0, rng=lambda: next(values)) for a in range(8)
    ]
    for attempt, delay in enumerate(delays):
        ceiling = 0.5 * 2**attempt
        assert ceiling / 2 <= delay <= ceiling
    assert delays == sorted(delays)


def test_dead_letter_after_max_redeliveries_and_the_cursor_moves_on() -> None:
    m = machine("shared", max_redeliveries=2)
    feed(m, "p0", [0, 1])
    m.handle(ConsumerAttached("c", "c"))
    counts = []
    for _ in range(2):
        got = poll(m, "c")
        counts.append([msg.redelivery_count for msg in got if msg.offset == 0])
        m.handle(Ack("c", [("p0", 1)]))
        m.handle(Nack("c", [("p0", 0)], delay_ms=0, now_s=0.0))
    got = poll(m, "c")
    assert [(msg.offset, msg.redelivery_count) for msg in got] == [(0, 2)]
    actions = m.handle(Nack("c", [("p0", 0)], delay_ms=0, now_s=0.0))
    assert actions == [DeadLetter(Message("p0", 0, "m0", 3))]
    assert counts == [[0], [1]]
    assert m.cursor("p0").next_offset == 2
    assert poll(m, "c") == []


def test_held_messages_pause_reading_and_resume_at_half() -> None:
    m = machine("shared", ("p0", "p1"), max_held=10)
    assert feed(m, "p0", range(6)) == []
    assert feed(m, "p1", range(4)) == [PauseReading("p0"), PauseReading("p1")]
    m.handle(ConsumerAttached("c", "c"))
    got = poll(m, "c")
    assert m.handle(Ack("c", refs(got[:4]))) == []  # 6 held: above half
    assert m.handle(Ack("c", refs(got[4:5]))) == [ResumeReading("p0"), ResumeReading("p1")]


def test_a_read_that_leaves_a_hole_is_ignored_and_overlaps_are_deduplicated() -> None:
    m = machine("exclusive")
    feed(m, "p0", [0, 1, 2])
    feed(m, "p0", [7, 8])  # a live message while offsets 3.. are unread
    assert m.cursor("p0").read_position == 3
    m.handle(MessagesAvailable("p0", [(1, "x"), (2, "x"), (5, "m5")], from_offset=1, next_offset=9))
    m.handle(ConsumerAttached("c", "c"))
    assert [(msg.offset, msg.payload) for msg in poll(m, "c")] == [
        (0, "m0"),
        (1, "m1"),
        (2, "m2"),
        (5, "m5"),
    ]
    assert m.cursor("p0").read_position == 9


def test_restart_from_flushed_cursors_redelivers_exactly_the_unacked_offsets() -> None:
    m = machine("shared")
    feed(m, "p0", range(10))
    m.handle(ConsumerAttached("c", "c"))
    poll(m, "c")
    m.handle(Ack("c", [("p0", o) for o in (0, 1, 4, 5, 8)]))
    flushed = [a for a in m.handle(Tick(1.0)) if isinstance(a, FlushCursor)]
    assert flushed == [FlushCursor("p0", CursorState(next_offset=2, acked_beyond=(4, 5, 8)))]
    stored = CursorState.model_validate_json(flushed[0].state.model_dump_json())
    restarted = SubscriptionMachine("shared", {"p0": PartitionCursor.from_state(stored)})
    start = restarted.cursor("p0").read_position
    feed(restarted, "p0", range(start, 10))
    restarted.handle(ConsumerAttached("d", "d"))
    assert [msg.offset for msg in poll(restarted, "d")] == [2, 3, 6, 7, 9]


def test_cursors_are_written_in_batches_not_per_ack() -> None:
    policy = FlushPolicy(flush_acks=100, flush_interval_s=10.0)
    m = SubscriptionMachine("shared", {"p0": PartitionCursor(0, policy=policy)})
    feed(m, "p0", range(300))
    m.handle(ConsumerAttached("c", "c"))
    got = poll(m, "c")
    writes = 0
    for i, msg in enumerate(got):
        m.handle(Ack("c", refs([msg])))
        writes += sum(isinstance(a, FlushCursor) for a in m.handle(Tick(0.0 + i * 0.001)))
    assert writes == 3  # the first change, then once per 100 acks


def test_seek_drops_what_is_held_and_reads_from_the_new_offset() -> None:
    m = machine("exclusive")
    feed(m, "p0", range(10))
    m.handle(ConsumerAttached("c", "c"))
    poll(m, "c", n=3)
    actions = m.handle(Seek({"p0": 100}, now_s=0.0))
    assert actions[:2] == [ReadFrom("p0", 100), FlushCursor("p0", CursorState(next_offset=100))]
    assert (m.unacked("c"), m.held_count) == ([], 0)
    feed(m, "p0", [100, 101])
    assert [msg.offset for msg in poll(m, "c")] == [100, 101]


def test_consumer_details_name_each_consumer_and_count_what_it_holds() -> None:
    m = machine("shared")
    feed(m, "p0", range(5))
    m.handle(ConsumerAttached("a", "alpha"))
    m.handle(ConsumerAttached("b", "beta"))
    got = poll(m, "a", n=3)
    m.handle(Ack("a", refs(got[:1])))
    assert m.consumer_details() == [("a", "alpha", 2), ("b", "beta", 0)]
    m.handle(ConsumerDetached("a", now_s=0.0))
    assert m.consumer_details() == [("b", "beta", 0)]


def test_unknown_consumers_are_refused() -> None:
    m = machine("shared")
    with pytest.raises(ConsumerNotFoundError):
        m.handle(Poll("ghost", 1, 0.0))


# --- random interleavings ----------------------------------------------------------------

OFFSETS = 40
PARTS = ("p0", "p1")
Op = tuple[str, int, int]
ops = st.lists(
    st.tuples(
        # poll, nack and tick weigh double: they drive redeliveries and dead letters.
        st.sampled_from(
            ["attach", "detach", "poll", "poll", "ack", "nack", "nack", "tick", "tick", "feed"]
        ),
        st.integers(0, 1),
        st.integers(0, 8),
    ),
    max_size=100,
)


class Driver:
    """Runs a machine, acking as a consumer would, and checks every action as it comes."""

    def __init__(self, kind: DeliveryType, max_redeliveries: int, slow: bool = False) -> None:
        # slow: windows halve per ack-timeout strike, a consumer is detached at the 2nd.
        limits = DeliverySettings(
            max_unacked_per_consumer=5,
            ack_timeout_s=3.0,
            max_redeliveries=max_redeliveries,
            slow_window_min=1 if slow else 0,
            slow_detach_timeouts=2 if slow else 0,
        )
        cursors = {p: PartitionCursor(0) for p in PARTS}
        self.m = SubscriptionMachine(kind, cursors, limits, rng=lambda: 0.5)
        self.acked: set[tuple[str, int]] = set()
        self.dead: set[tuple[str, int]] = set()
        self.fed = dict.fromkeys(PARTS, 0)
        self.max_redeliveries = max_redeliveries
        for name in PARTS:  # something to deliver from the first poll on
            self.feed(name, 10)

    def do(self, event: Event) -> list[Action]:
        try:
            actions = self.m.handle(event)
        except (SubscriptionTakenError, ConsumerNotFoundError, ConsumerExistsError):
            return []
        finally:
            self.m.validate()
        for action in actions:
            if isinstance(action, Deliver):
                # Never deliver what was acked.
                assert self.acked.isdisjoint(refs(action.messages))
            elif isinstance(action, DeadLetter):
                key = (action.message.partition, action.message.offset)
                assert key not in self.acked
                assert key not in self.dead
                assert action.message.redelivery_count == self.max_redeliveries + 1
                self.dead.add(key)
        return actions

    def ack(self, consumer: str, keys: list[tuple[str, int]]) -> None:
        self.do(Ack(consumer, keys))
        if consumer in self.m.consumers:
            self.acked.update(k for k in keys if k not in self.dead)

    def feed(self, name: str, stop: int) -> None:
        self.do(MessagesAvailable(name, [(o, o) for o in range(self.fed[name], stop)]))
        self.fed[name] = max(self.fed[name], stop)

    def step(self, op: str, who: int, n: int, now: float) -> None:
        consumer = f"c{who}"
        if op == "attach":
            self.do(ConsumerAttached(consumer, consumer))
        elif op == "detach":
            self.do(ConsumerDetached(consumer, now))
        elif op == "feed":
            name = PARTS[who % 2]
            self.feed(name, min(OFFSETS, self.fed[name] + n + 1))
        elif op == "tick":
            self.do(Tick(now + n))
        elif op == "poll":
            for action in self.do(Poll(consumer, n, now)):
                if isinstance(action, Deliver) and n % 2 == 0:
                    self.ack(consumer, refs(action.messages[: n // 2]))
        elif consumer in self.m.consumers:
            held = self.m.unacked(consumer)[: n + 1]
            if op == "ack":
                self.ack(consumer, held)
            else:
                self.do(Nack(consumer, held, n * 100, now))

    def drain(self, now: float) -> None:
        for name in PARTS:
            self.feed(name, OFFSETS)
        if not self.m.consumers:
            self.do(ConsumerAttached("drain", "drain"))
        for _ in range(50):
            # Asked every round: a consumer slow before the drain may be detached in it.
            consumer = self.m.active_consumer or self.m.consumers[0]
            now += 100.0
            for action in self.do(Tick(now)) + self.do(Poll(consumer, 1000, now)):
                if isinstance(action, Deliver):
                    self.ack(consumer, refs(action.messages))


@pytest.mark.parametrize("slow", [False, True], ids=["", "slow-consumers"])
@pytest.mark.parametrize("kind", ["exclusive", "shared", "failover"])
@settings(max_examples=150, deadline=None)
@given(script=ops, max_redeliveries=st.integers(0, 2))
def test_random_interleavings_never_redeliver_acked_and_never_lose(
    kind: DeliveryType, slow: bool, script: list[Op], max_redeliveries: int
) -> None:
    driver = Driver(kind, max_redeliveries, slow)
    for i, (op, who, n) in enumerate(script):
        driver.step(op, who, n, now=i * 0.5)
    driver.drain(now=len(script) * 0.5)
    # Steer the search toward scripts that dead-letter (random ones seldom do).
    target(float(len(driver.dead)), label="dead letters")
    everything = {(p, o) for p in PARTS for o in range(OFFSETS)}
    assert driver.acked | driver.dead == everything
    assert driver.acked.isdisjoint(driver.dead)
    assert all(driver.m.cursor(p).next_offset == OFFSETS for p in PARTS)
    assert driver.m.held_count == 0


def test_flush_dirty_writes_only_changed_cursors_with_increasing_seq() -> None:
    m = machine("exclusive", ("p0", "p1"))
    m.handle(ConsumerAttached("c", "c"))
    feed(m, "p0", [0, 1, 2])
    m.handle(Tick(0.0))  # writes the never-written cursors once
    seq_before = m.cursor("p0").flush_seq
    got = poll(m, "c")
    m.handle(Ack("c", [("p0", 0), ("p0", 2)]))
    assert m.cursor("p0").dirty
    assert not m.cursor("p1").dirty
    first = m.flush_dirty(["p0", "p1"], 1.0)
    assert first == [FlushCursor("p0", CursorState(next_offset=1, acked_beyond=(2,)))]
    assert isinstance(first[0], FlushCursor)
    assert first[0].seq == seq_before + 1
    assert m.flush_dirty(["p0", "p1"], 1.0) == []  # nothing changed since
    m.handle(Ack("c", refs(got)))
    again = m.flush_dirty(["p0"], 2.0)
    assert again == [FlushCursor("p0", CursorState(next_offset=3))]
    assert isinstance(again[0], FlushCursor)
    assert again[0].seq == seq_before + 2


def test_a_machine_is_quiet_only_with_nothing_held_and_no_cursor_to_write() -> None:
    """quiet() tells the runtime a Tick could change nothing (it then ticks rarely): never
    while a message is held (an ack deadline or a redelivery could fall due) or a cursor
    waits for its write."""
    m = machine("exclusive", ack_timeout_s=30.0)
    m.handle(ConsumerAttached("c", "c"))
    assert m.quiet()
    feed(m, "p0", [0, 1])
    assert not m.quiet()  # buffered
    got = poll(m, "c", now_s=1.0)
    assert not m.quiet()  # in flight: its ack deadline is 31.0
    m.handle(Ack("c", refs(got)))
    assert not m.quiet()  # acked, the cursor not written yet
    m.handle(Tick(3.0))  # written (flush interval 1 s)
    assert m.quiet()
    # The acked batch's deadline was dropped with the rest: a Tick at it finds nothing.
    assert [a for a in m.handle(Tick(31.0)) if not isinstance(a, FlushCursor)] == []
    feed(m, "p0", [2])
    poll(m, "c", now_s=40.0)
    m.handle(Nack("c", [("p0", 2)], 5_000, 40.0))
    assert not m.quiet()  # a redelivery scheduled at 45.0
    assert refs(poll(m, "c", now_s=44.0)) == []
    m.handle(Tick(45.0))
    assert refs(poll(m, "c", now_s=45.0)) == [("p0", 2)]
