"""Delayed messages handed early to consumers that hold them (danube.dispatcher.delaying,
"Handed early"): a holding consumer of a shared subscription is given a delayed message up
to ``delay_lookahead_ms`` before its time; a consumer that does not hold never is, not even
as the redelivery of one a holding consumer left with."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delayed import BUCKET_MS, LOAD_AHEAD_MS
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import (
    Ack,
    ConsumerAttached,
    ConsumerDetached,
    Deliver,
    MessagesAvailable,
    Poll,
    Tick,
)
from danube.dispatcher.keyed import KeySharedMachine, record_key
from danube.dispatcher.redelivery import DeliverySettings
from danube.frame import RawFrame, Record, encode_frame, encode_record
from danube.wire.delay import DELIVER_AT_ATTRIBUTE

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000  # a publish time, Unix ms
AHEAD_MS = 1000


def frame(offset: int, due_ms: int | None = None, *, key: str | None = None) -> RawFrame:
    attributes = {} if due_ms is None else {DELIVER_AT_ATTRIBUTE: str(due_ms)}
    record = encode_record(
        Record(payload=b"x", publish_time_ms=T0, producer="p", key=key, attributes=attributes)
    )
    return RawFrame(offset, memoryview(encode_frame(offset, record)))


def settings(**fields: object) -> DeliverySettings:
    return DeliverySettings(delay_lookahead_ms=AHEAD_MS, **fields)  # type: ignore[arg-type]


def shared(**fields: object) -> SubscriptionMachine:
    return SubscriptionMachine("shared", {"p0": PartitionCursor(0)}, settings(**fields))


def delivered(actions: Sequence[object]) -> list[int]:
    return [o for a in actions if isinstance(a, Deliver) for o in a.offsets]


def test_a_holding_consumer_is_given_a_delayed_message_ahead_and_another_is_not() -> None:
    m = shared()
    m.handle(ConsumerAttached("holds", "a", holds_delayed=True))
    m.handle(ConsumerAttached("plain", "b"))
    m.handle(MessagesAvailable("p0", [(0, frame(0, T0 + 1500)), (1, frame(1))], 0, 2))
    assert delivered(m.handle(Poll("plain", 100, 1.0, T0))) == [1]  # not delayed: at once
    next_ms = m.next_due_ms()
    assert next_ms is not None
    assert next_ms <= T0 + 1500 - AHEAD_MS  # ticks ahead of it
    assert delivered(m.handle(Poll("holds", 100, 1.0, T0 + 499))) == []  # not yet ahead
    assert delivered(m.handle(Poll("plain", 100, 1.5, T0 + 600))) == []  # released early
    assert delivered(m.handle(Poll("holds", 100, 1.6, T0 + 600))) == [0]  # ...for it
    m.validate()


def test_an_early_message_nobody_took_reaches_everyone_at_its_time() -> None:
    m = shared()
    m.handle(ConsumerAttached("holds", "a", holds_delayed=True))  # attached, never polls
    m.handle(ConsumerAttached("plain", "b"))
    m.handle(MessagesAvailable("p0", [(0, frame(0, T0 + 1500))], 0, 1))
    m.handle(Tick(1.0, T0 + 600))  # released early, into no fresh queue
    assert m.next_due_ms() == T0 + 1500  # the early one's time: it joins the queues then
    assert delivered(m.handle(Poll("plain", 100, 1.1, T0 + 1499))) == []
    assert delivered(m.handle(Poll("plain", 100, 1.2, T0 + 1500))) == [0]
    assert delivered(m.handle(Poll("holds", 100, 1.3, T0 + 1600))) == []  # once only
    m.validate()


def test_the_redelivery_of_an_early_message_waits_for_its_time_for_a_plain_consumer() -> None:
    m = shared()
    m.handle(ConsumerAttached("holds", "a", holds_delayed=True))
    m.handle(ConsumerAttached("plain", "b"))
    m.handle(MessagesAvailable("p0", [(0, frame(0, T0 + 1500))], 0, 1))
    assert delivered(m.handle(Poll("holds", 100, 1.0, T0 + 600))) == [0]
    m.handle(ConsumerDetached("holds", 1.1))  # it left with it: taken back at once
    assert delivered(m.handle(Poll("plain", 100, 1.2, T0 + 700))) == []
    assert delivered(m.handle(Poll("plain", 100, 1.3, T0 + 1500))) == [0]
    m.handle(Ack("plain", [("p0", 0)]))
    assert m.delayed_count == 0
    m.validate()


def test_without_a_holding_consumer_or_on_key_shared_nothing_comes_early() -> None:
    m = shared()
    m.handle(ConsumerAttached("plain", "b"))
    m.handle(MessagesAvailable("p0", [(0, frame(0, T0 + 1500))], 0, 1))
    # Its bucket's load ahead of time only (delayed.py), not the lookahead too.
    assert m.next_due_ms() == (T0 + 1500) // BUCKET_MS * BUCKET_MS - LOAD_AHEAD_MS
    assert delivered(m.handle(Poll("plain", 100, 1.0, T0 + 1499))) == []
    assert delivered(m.handle(Poll("plain", 100, 1.0, T0 + 1500))) == [0]
    keyed = KeySharedMachine({"p0": PartitionCursor(0)}, settings(), key_of=record_key)
    keyed.handle(ConsumerAttached("holds", "a", holds_delayed=True))
    keyed.handle(MessagesAvailable("p0", [(0, frame(0, T0 + 1500, key="k"))], 0, 1))
    assert delivered(keyed.handle(Poll("holds", 100, 1.0, T0 + 1499))) == []
    assert delivered(keyed.handle(Poll("holds", 100, 1.0, T0 + 1500))) == [0]


def test_the_lookahead_is_at_most_half_the_ack_timeout() -> None:
    with pytest.raises(ValueError, match="delay_lookahead_ms"):
        DeliverySettings(ack_timeout_s=1.0, delay_lookahead_ms=501)
    DeliverySettings(ack_timeout_s=1.0, delay_lookahead_ms=500)


@pytest.mark.parametrize("seed", range(8))
def test_random_histories_never_hand_a_plain_consumer_anything_early(seed: int) -> None:
    """Holding and plain consumers poll, ack, leave and come back at random while delayed
    and plain messages are read: a plain consumer never gets a message before its time, a
    holding one never more than the lookahead before it, and every message is delivered."""
    rng = random.Random(seed)
    m = shared(ack_timeout_s=5.0, max_unacked_per_consumer=rng.choice([3, 50]))
    dues = {o: (T0 + rng.randrange(0, 4000) if rng.random() < 0.7 else None) for o in range(300)}
    holding = {"h1": True, "h2": True, "p1": False}
    attached: set[str] = set()
    acked: set[int] = set()
    read, wall, now_s = 0, T0, 0.0
    while len(acked) < len(dues):
        wall += rng.randrange(1, 40)
        now_s += 0.02
        if read < len(dues) and rng.random() < 0.3:
            batch = [(o, frame(o, dues[o])) for o in range(read, min(read + 20, len(dues)))]
            m.handle(MessagesAvailable("p0", batch, read, read + len(batch)))
            read += len(batch)
        consumer = rng.choice(sorted(holding))
        if consumer not in attached:
            m.handle(ConsumerAttached(consumer, consumer, holds_delayed=holding[consumer]))
            attached.add(consumer)
        elif rng.random() < 0.03:
            m.handle(ConsumerDetached(consumer, now_s))
            attached.discard(consumer)
            continue
        actions = m.handle(Poll(consumer, rng.randrange(1, 10), now_s, wall))
        got = delivered(actions)
        for offset in got:
            due = dues[offset]
            if due is not None:
                ahead = AHEAD_MS if holding[consumer] else 0
                assert wall >= due - ahead, f"{offset} to {consumer} at {wall}, due {due}"
        if got and rng.random() < 0.9:
            m.handle(Ack(consumer, [("p0", o) for o in got]))
            acked.update(got)
        m.handle(Tick(now_s, wall))
        m.validate()
        assert wall < T0 + 600_000, "not everything was delivered"
    assert m.delayed_count == 0
