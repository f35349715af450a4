"""Key-shared delivery in the subscription machine: one owner per key, filters, order in churn."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.events import (
    Ack,
    ConsumerAttached,
    ConsumerDetached,
    Deliver,
    Event,
    Message,
    MessagesAvailable,
    Nack,
    Poll,
    Tick,
)
from danube.dispatcher.keyed import KeySharedMachine, record_key
from danube.dispatcher.keyshared import HashRing
from danube.dispatcher.redelivery import DeliverySettings
from danube.frame import Record, encode_record

pytestmark = pytest.mark.unit


def key_of(payload: object) -> str | None:
    assert isinstance(payload, tuple)
    key = payload[0]
    assert key is None or isinstance(key, str)
    return key


def machine(partitions: Sequence[str] = ("p0",), **limits: float) -> KeySharedMachine:
    cursors = {name: PartitionCursor(0) for name in partitions}
    return KeySharedMachine(
        cursors,
        DeliverySettings(**limits),  # type: ignore[arg-type]
        key_of=key_of,
        rng=lambda: 0.5,
        points_per_consumer=16,
    )


def feed(m: KeySharedMachine, start: int, keys: Sequence[str | None], part: str = "p0") -> None:
    messages = [(start + i, (key, start + i)) for i, key in enumerate(keys)]
    m.handle(MessagesAvailable(part, messages))


def poll(m: KeySharedMachine, consumer: str, now_s: float = 0.0, n: int = 1000) -> list[Message]:
    out = [a for a in m.handle(Poll(consumer, n, now_s)) if isinstance(a, Deliver)]
    m.validate()
    return [msg for d in out for msg in d.messages]


def attach(m: KeySharedMachine, consumer: str, *filters: str) -> None:
    m.handle(ConsumerAttached(consumer, consumer, tuple(filters)))
    m.validate()


def offsets(messages: Sequence[Message]) -> list[int]:
    return [msg.offset for msg in messages]


def key_owned_after_join(owners: Sequence[str], joining: str) -> str:
    """A key that moves to ``joining`` when it joins ``owners`` (same ring as the machine)."""
    ring = HashRing(points_per_consumer=16)
    for consumer in owners:
        ring.join(consumer)
    before = {f"k{i}": ring.owner(f"k{i}") for i in range(200)}
    ring.join(joining)
    return next(k for k, owner in before.items() if ring.owner(k) == joining)


def test_each_key_goes_to_one_consumer_in_order_and_keyless_spread() -> None:
    m = machine()
    attach(m, "a")
    attach(m, "b")
    keys = [f"k{i % 10}" for i in range(100)] + [None] * 20
    feed(m, 0, keys)
    got = {c: poll(m, c, n=40) for c in "ab"}
    got = {c: got[c] + poll(m, c) for c in "ab"}
    by_key: dict[str, set[str]] = {}
    order: dict[str, list[int]] = {}
    for consumer, messages in got.items():
        for msg in messages:
            key = key_of(msg.payload)
            if key is not None:
                by_key.setdefault(key, set()).add(consumer)
                order.setdefault(key, []).append(msg.offset)
    assert all(seen == sorted(seen) and len(seen) == 10 for seen in order.values())
    assert all(len(owners) == 1 for owners in by_key.values())
    assert len(by_key) == 10
    assert {o for owners in by_key.values() for o in owners} == {"a", "b"}
    assert sorted(offsets(got["a"] + got["b"])) == list(range(120))


def test_a_moved_key_waits_until_its_messages_in_flight_elsewhere_are_acked() -> None:
    m = machine()
    attach(m, "a")
    key = key_owned_after_join(["a"], "b")
    feed(m, 0, [key, key])
    assert offsets(poll(m, "a")) == [0, 1]
    attach(m, "b")
    assert m.owner(key) == "b"
    feed(m, 2, [key])
    assert poll(m, "b") == []  # 0 and 1 are still unacked at a
    assert poll(m, "a") == []  # not a's key any more
    m.handle(Ack("a", [("p0", 0)]))
    assert poll(m, "b") == []
    m.handle(Ack("a", [("p0", 1)]))
    assert offsets(poll(m, "b")) == [2]


def test_a_leaving_consumers_messages_go_to_the_keys_new_owner_first_in_order() -> None:
    m = machine()
    attach(m, "a")
    attach(m, "b")
    key = next(f"k{i}" for i in range(200) if m.owner(f"k{i}") == "a")
    feed(m, 0, [key] * 3)
    assert offsets(poll(m, "a", n=2)) == [0, 1]
    m.handle(ConsumerDetached("a", 1.0))
    m.validate()
    got = poll(m, "b", 1.0)
    assert offsets(got) == [0, 1, 2]
    assert [msg.redelivery_count for msg in got] == [1, 1, 0]


def test_filters_route_keys_and_unmatched_keys_wait_for_a_matching_consumer() -> None:
    m = machine()
    attach(m, "users", "user-*")
    feed(m, 0, ["user-1", "order-1", "user-2", "order-1"])
    assert offsets(poll(m, "users")) == [0, 2]
    assert m.unmatched_count() == 2
    attach(m, "orders", "order-?")
    assert offsets(poll(m, "orders")) == [1, 3]
    assert m.unmatched_count() == 0


def test_a_nacked_message_comes_back_to_the_owner_and_later_ones_wait_behind_it() -> None:
    m = machine()
    attach(m, "a")
    feed(m, 0, ["k", "k", "j"])
    assert offsets(poll(m, "a", n=1)) == [0]
    m.handle(Nack("a", [("p0", 0)], delay_ms=1000, now_s=0.0))
    # 1 (key k) waits behind the delayed 0; j is free.
    assert offsets(poll(m, "a", 0.5)) == [2]
    got = poll(m, "a", 1.5)
    assert offsets(got) == [0, 1]
    assert got[0].redelivery_count == 1


def test_an_ack_timeout_redelivers_to_the_keys_owner_before_its_later_messages() -> None:
    m = machine(ack_timeout_s=1.0, redelivery_base_s=0.1, redelivery_max_s=0.1)
    attach(m, "a")
    key = key_owned_after_join(["a"], "b")
    feed(m, 0, [key])
    assert offsets(poll(m, "a")) == [0]
    attach(m, "b")
    feed(m, 1, [key])
    assert poll(m, "b", 0.5) == []
    m.handle(Tick(1.0))  # 0 is taken back from a (no ack in time)
    m.validate()
    got = poll(m, "b", 1.2)
    assert offsets(got) == [0, 1]


def test_a_full_window_of_timed_out_messages_is_taken_again() -> None:
    m = machine(max_unacked_per_consumer=2, ack_timeout_s=1.0, redelivery_base_s=0.1)
    attach(m, "a")
    feed(m, 0, ["k", "k", "k"])
    assert offsets(poll(m, "a")) == [0, 1]
    m.handle(Tick(1.0))
    assert offsets(poll(m, "a", 1.5)) == [0, 1]  # its own, although its window is full


def test_record_key_reads_the_key_of_an_encoded_record() -> None:
    assert (
        record_key(
            encode_record(Record(payload=b"x", publish_time_ms=1, producer="p", key="user-1"))
        )
        == "user-1"
    )
    assert record_key(encode_record(Record(payload=b"x", publish_time_ms=1, producer="p"))) is None
    assert record_key(b"\xff garbage") is None


# --- property: random churn ------------------------------------------------------------

CONSUMERS = ("a", "b", "c")
KEYS = ("k0", "k1", "k2", "k3", None)

op = st.one_of(
    st.tuples(st.just("feed"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=6)),
    st.tuples(st.just("attach"), st.sampled_from(CONSUMERS)),
    st.tuples(st.just("detach"), st.sampled_from(CONSUMERS)),
    st.tuples(st.just("poll"), st.sampled_from(CONSUMERS), st.integers(1, 4)),
    st.tuples(st.just("ack"), st.sampled_from(CONSUMERS), st.integers(0, 3)),
    st.tuples(st.just("nack"), st.sampled_from(CONSUMERS)),
    st.tuples(st.just("tick"), st.floats(0.1, 2.0)),
)


class Checker:
    """The outside view: who holds each delivered, unacked message; checks every delivery."""

    def __init__(self) -> None:
        self.holder: dict[int, str] = {}  # offset -> consumer it was last delivered to
        self.acked: set[int] = set()
        self.keys: dict[int, str | None] = {}

    def delivered(self, consumer: str, messages: Sequence[Message]) -> None:
        for msg in messages:
            key = self.keys[msg.offset]
            assert msg.offset not in self.acked, f"{msg.offset} delivered after its ack"
            if key is not None:
                for offset, holder in self.holder.items():
                    if self.keys[offset] != key or offset == msg.offset:
                        continue
                    # No message of the key is unacked at another consumer...
                    assert holder == consumer, f"{key}: {offset} unacked at {holder}"
                for offset, k in self.keys.items():
                    # ...and every earlier one is acked, or with this consumer (in order).
                    if k == key and offset < msg.offset and offset not in self.acked:
                        assert self.holder.get(offset) == consumer, f"{key}: {offset} skipped"
            self.holder[msg.offset] = consumer

    def given_back(self, offsets: Sequence[int]) -> None:
        for offset in offsets:
            self.holder.pop(offset, None)

    def timed_out(self, m: KeySharedMachine) -> None:
        """Ack timeouts took messages back (the consumer does not hear of it): no longer
        held by anyone until delivered again."""
        in_flight = {c: {o for _, o in m.in_flight(c)} for c in m.consumers}
        for offset, holder in list(self.holder.items()):
            if offset not in in_flight.get(holder, ()):
                del self.holder[offset]


@pytest.mark.parametrize("slow", [False, True], ids=["", "slow-consumers"])
@settings(max_examples=400, deadline=None)
@given(st.lists(op, max_size=60))
def test_random_churn_keeps_one_holder_per_key_and_per_key_order(
    slow: bool,
    ops: list[tuple],  # type: ignore[type-arg]
) -> None:
    # slow: windows halve per ack-timeout strike; a consumer is detached at its 2nd.
    m = machine(
        max_unacked_per_consumer=5,
        ack_timeout_s=1.0,
        redelivery_base_s=0.2,
        slow_window_min=1 if slow else 0,
        slow_detach_timeouts=2 if slow else 0,
    )
    check = Checker()
    attached: set[str] = set()
    now_s, next_offset = 0.0, 0
    for item in ops:
        name, args = item[0], item[1:]
        events: list[Event] = []
        if name == "feed":
            for key in args[0]:
                check.keys[next_offset] = key
                next_offset += 1
            feed(m, next_offset - len(args[0]), args[0])
        elif name == "attach" and args[0] not in attached:
            attached.add(args[0])
            attach(m, args[0])
        elif name == "detach" and args[0] in attached:
            attached.discard(args[0])
            check.given_back(m.in_flight(args[0]))  # type: ignore[arg-type]
            events.append(ConsumerDetached(args[0], now_s))
        elif name == "poll" and args[0] in attached:
            check.delivered(args[0], poll(m, args[0], now_s, n=args[1]))
        elif name == "ack" and args[0] in attached:
            held = m.unacked(args[0])[: args[1]]
            check.acked.update(o for _, o in held)
            check.given_back([o for _, o in held])
            events.append(Ack(args[0], held))
        elif name == "nack" and args[0] in attached:
            held = m.in_flight(args[0])[:1]
            check.given_back([o for _, o in held])
            events.append(Nack(args[0], held, 0, now_s))
        elif name == "tick":
            now_s += args[0]
            events.append(Tick(now_s))
        for event in events:
            m.handle(event)
            m.validate()
            check.timed_out(m)
            attached &= set(m.consumers)  # the machine detaches slow consumers itself
    # Drain: one consumer left, time passes, everything is delivered and acked in the end.
    for consumer in attached - {"a"}:
        check.given_back([o for _, o in m.in_flight(consumer)])
        m.handle(ConsumerDetached(consumer, now_s))
        check.timed_out(m)
    if "a" not in attached:
        attach(m, "a")
    for _ in range(200):
        now_s += 5.0
        m.handle(Tick(now_s))
        check.timed_out(m)
        got = poll(m, "a", now_s)
        check.delivered("a", got)
        refs = m.unacked("a")
        check.acked.update(o for _, o in refs)
        check.given_back([o for _, o in refs])
        m.handle(Ack("a", refs))
        if m.held_count == 0:
            break
    assert m.held_count == 0
    assert check.acked | {o for o in check.keys if m.cursor("p0").is_acked(o)} == set(
        range(next_offset)
    )
