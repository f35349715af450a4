"""Message TTL in the dispatcher without servers: when a record expires (its own
``danube.ttl_ms`` over the policy's), and a subscription machine that never delivers an
expired message, acks it for the subscription (cursor and backlog move) and counts it, at a
poll (fresh or redelivered, shared and key-shared) and at a tick with nobody polling."""

from __future__ import annotations

import pytest

from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import (
    Ack,
    ConsumerAttached,
    Deliver,
    MessagesAvailable,
    Nack,
    Poll,
    Tick,
)
from danube.dispatcher.expiring import SWEEP_SCAN_MAX, expiry_for, expiry_ms
from danube.dispatcher.keyed import KeySharedMachine, record_key
from danube.frame import Record, encode_record
from danube.wire.delivery import TTL_ATTRIBUTE

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000  # a publish time, Unix ms


def record(ttl: str | None = None, *, key: str | None = None, at_ms: int = T0) -> bytes:
    attributes = {"a": "b"} if ttl is None else {"a": "b", TTL_ATTRIBUTE: ttl}
    return encode_record(
        Record(payload=b"x", publish_time_ms=at_ms, producer="p", key=key, attributes=attributes)
    )


def test_a_record_expires_by_its_own_ttl_else_the_policy() -> None:
    assert expiry_ms(record(), None) is None
    assert expiry_ms(record(), 5_000) == T0 + 5_000
    assert expiry_ms(record("250"), None) == T0 + 250
    assert expiry_ms(record("250"), 5_000) == T0 + 250  # its own wins, shorter or longer
    assert expiry_ms(record("90000"), 5_000) == T0 + 90_000
    for bad in ("-1", "0", "1.5", "soon", str(10 * 365 * 86_400_000 + 1)):
        assert expiry_ms(record(bad), 5_000) == T0 + 5_000, bad  # ignored
    sequenced = Record(
        payload=b"x", publish_time_ms=T0, producer="p", attributes={TTL_ATTRIBUTE: "7"}, sequence=3
    )
    assert expiry_ms(encode_record(sequenced), None) == T0 + 7
    assert expiry_ms(b"\x01garbage", 5_000) is None  # does not decode: never expires
    assert expiry_for(2)(record()) == T0 + 2_000


def machine(kind: str = "shared") -> SubscriptionMachine:
    cursors = {"p0": PartitionCursor(0)}
    built: SubscriptionMachine
    if kind == "key_shared":
        built = KeySharedMachine(cursors, key_of=record_key)
    else:
        built = SubscriptionMachine("shared", cursors)
    built.expiry_of = expiry_for(None)
    built.handle(ConsumerAttached("c", "c"))
    return built


def delivered(m: SubscriptionMachine, wall_ms: int, now_s: float = 0.0) -> list[int]:
    actions = m.handle(Poll("c", 100, now_s, wall_ms))
    m.validate()
    return [o for a in actions if isinstance(a, Deliver) for o in a.offsets]


@pytest.mark.parametrize("kind", ["shared", "key_shared"])
def test_expired_messages_are_acked_for_the_subscription_never_delivered(kind: str) -> None:
    m = machine(kind)
    # Offsets 0..5: TTL 100 ms on the even ones; keys on some (key-shared files them).
    payloads = [record("100" if o % 2 == 0 else None, key=f"k{o % 3}") for o in range(6)]
    m.handle(MessagesAvailable("p0", list(enumerate(payloads))))
    assert sorted(delivered(m, T0 + 150)) == [1, 3, 5]  # key-shared goes key by key
    assert m.expired == 3
    m.handle(Ack("c", (("p0", 1), ("p0", 3), ("p0", 5))))
    assert m.cursor_states()["p0"].next_offset == 6  # the expired ones count as acked
    m.validate()


def test_a_redelivery_past_its_expiry_is_not_delivered() -> None:
    m = machine()
    m.handle(MessagesAvailable("p0", [(0, record("100")), (1, record())]))
    assert delivered(m, T0 + 50) == [0, 1]  # not expired yet
    m.handle(Nack("c", (("p0", 0), ("p0", 1)), 0, 0.0))
    assert delivered(m, T0 + 150, now_s=1.0) == [1]
    assert m.expired == 1
    m.handle(Ack("c", (("p0", 1),)))
    assert m.cursor_states()["p0"].next_offset == 2


@pytest.mark.parametrize("kind", ["shared", "key_shared"])
def test_a_tick_lets_expired_messages_go_with_nobody_polling(kind: str) -> None:
    m = machine(kind)
    count = SWEEP_SCAN_MAX + 100
    payloads = [(o, record("100", key=None if o % 2 else f"k{o % 7}")) for o in range(count)]
    m.handle(MessagesAvailable("p0", payloads))
    m.handle(Tick(0.0, T0 + 50))
    assert m.expired == 0
    for step in range(3):  # bounded work per tick: more than one tick for all of them
        m.handle(Tick(0.1 * (step + 1), T0 + 150))
        m.validate()
    assert m.expired == count
    assert m.cursor_states()["p0"].next_offset == count
    assert m.held_count == 0
    assert delivered(m, T0 + 150) == []


def test_no_wall_clock_no_expiry() -> None:
    m = machine()
    m.handle(MessagesAvailable("p0", [(0, record("1"))]))
    m.handle(Tick(1.0))
    assert delivered(m, None) == [0]  # type: ignore[arg-type]
    assert m.expired == 0
