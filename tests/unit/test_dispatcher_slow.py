"""Fair redelivery and slow consumers in the delivery machine (danube.dispatcher.slow):
who gets a message an ack timeout or a nack took back, the window halving per strike and
growing back per ack, the detach after a streak, per subscription type."""

from __future__ import annotations

import pytest

from danube.dispatcher import slow
from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delivery import DeliveryType, SubscriptionMachine
from danube.dispatcher.entries import ConsumerWindow
from danube.dispatcher.events import (
    Ack,
    Action,
    ConsumerAttached,
    Deliver,
    Message,
    MessagesAvailable,
    Nack,
    Poll,
    SlowConsumerDetached,
    Tick,
)
from danube.dispatcher.keyed import KeySharedMachine
from danube.dispatcher.redelivery import DeliverySettings
from danube.wire.dispatcher.errors import ConsumerDetachedError, ConsumerNotFoundError

pytestmark = pytest.mark.unit

WINDOW = 64
ACK_TIMEOUT_S = 2.0
DUE_S = 0.1  # fixed backoff: a timed-out message is due this long after its timeout


def settings(**changes: int | float | str) -> DeliverySettings:
    base: dict[str, int | float | str] = {
        "max_unacked_per_consumer": WINDOW,
        "ack_timeout_s": ACK_TIMEOUT_S,
        "redelivery_base_s": DUE_S,
        "redelivery_max_s": DUE_S,
        "backoff_kind": "fixed",
        "max_redeliveries": 1000,
        "slow_window_min": 4,
        "slow_detach_timeouts": 3,
    }
    return DeliverySettings(**(base | changes))  # type: ignore[arg-type]


def machine(
    kind: DeliveryType = "shared", count: int = 0, **changes: int | float
) -> SubscriptionMachine:
    m = SubscriptionMachine(kind, {"p0": PartitionCursor(0)}, settings(**changes))
    feed(m, 0, count)
    return m


def feed(m: SubscriptionMachine, start: int, count: int) -> None:
    m.handle(MessagesAvailable("p0", [(o, f"m{o}") for o in range(start, start + count)]))


def attach(m: SubscriptionMachine, *names: str) -> None:
    for name in names:
        m.handle(ConsumerAttached(name, name))


def poll(m: SubscriptionMachine, consumer: str, now_s: float, n: int = 10_000) -> list[Message]:
    actions = m.handle(Poll(consumer, n, now_s))
    m.validate()
    return [msg for a in actions if isinstance(a, Deliver) for msg in a.messages]


def offsets(messages: list[Message]) -> list[int]:
    return sorted(msg.offset for msg in messages)


def tick(m: SubscriptionMachine, now_s: float) -> list[Action]:
    actions = m.handle(Tick(now_s))
    m.validate()
    return actions


def ack_all(m: SubscriptionMachine, consumer: str, messages: list[Message]) -> None:
    m.handle(Ack(consumer, [(msg.partition, msg.offset) for msg in messages]))
    m.validate()


# --- who gets a redelivery ---------------------------------------------------------------


def test_timed_out_messages_go_to_the_other_consumer_though_the_silent_one_polls_first() -> None:
    m = machine(count=10)
    attach(m, "silent", "acker")
    assert offsets(poll(m, "silent", 0.0)) == list(range(10))
    assert poll(m, "acker", 0.5) == []  # nothing left: it waits (and was seen polling)
    tick(m, ACK_TIMEOUT_S)
    now = ACK_TIMEOUT_S + DUE_S
    tick(m, now)
    # The silent one asks first, as a push stream always does: none of its own come back.
    assert poll(m, "silent", now) == []
    got = poll(m, "acker", now)
    assert offsets(got) == list(range(10))
    assert {msg.redelivery_count for msg in got} == {1}
    ack_all(m, "acker", got)
    assert m.unacked("silent") == []
    assert m.cursor("p0").next_offset == 10


def test_they_come_back_to_the_same_consumer_when_no_other_can_take_them() -> None:
    # Alone: its own come back (as before fair redelivery).
    m = machine(count=10)
    attach(m, "only")
    poll(m, "only", 0.0)
    tick(m, ACK_TIMEOUT_S)
    assert offsets(poll(m, "only", ACK_TIMEOUT_S + DUE_S)) == list(range(10))

    # Another is attached but has not polled within the ack timeout: it is not there.
    m = machine(count=10)
    attach(m, "silent", "away")
    poll(m, "away", 0.0)
    poll(m, "silent", 0.0)
    now = ACK_TIMEOUT_S + DUE_S + 0.1
    tick(m, ACK_TIMEOUT_S)
    assert offsets(poll(m, "silent", now)) == list(range(10))

    # Another polls but its window is full.
    m = machine(count=WINDOW + 10)
    attach(m, "silent", "full")
    assert offsets(poll(m, "silent", 0.0, n=10)) == list(range(10))
    assert len(poll(m, "full", 1.0)) == WINDOW  # its deadline is a second later
    tick(m, ACK_TIMEOUT_S)
    poll(m, "full", ACK_TIMEOUT_S)  # keeps polling (and holding)
    assert offsets(poll(m, "silent", ACK_TIMEOUT_S + DUE_S)) == list(range(10))


def test_a_nack_goes_to_another_consumer_first_but_not_to_a_worse_one() -> None:
    m = machine(count=2)
    attach(m, "a", "b")
    (first,) = poll(m, "a", 0.0, n=1)
    poll(m, "b", 0.0, n=0)  # b polls (nothing asked): it is there
    m.handle(Nack("a", [("p0", first.offset)], 0, 0.1))
    assert offsets(poll(m, "a", 0.2)) == [1]  # the fresh one; its nacked one waits for b
    assert offsets(poll(m, "b", 0.2)) == [0]

    # b has let messages time out (a strike): a's nack comes back to a, the better home.
    m = machine(count=3)
    attach(m, "a", "b")
    poll(m, "b", 0.0, n=1)
    tick(m, ACK_TIMEOUT_S)
    (mine,) = poll(m, "a", ACK_TIMEOUT_S, n=1)
    assert mine.offset == 1  # the fresh one; b's timed-out 0 waits for b's turn
    m.handle(Nack("a", [("p0", 1)], 0, ACK_TIMEOUT_S))
    poll(m, "b", ACK_TIMEOUT_S, n=0)
    assert 1 in offsets(poll(m, "a", ACK_TIMEOUT_S + DUE_S))


# --- slowed ------------------------------------------------------------------------------


def test_each_strike_halves_the_window_down_to_its_floor_and_acks_double_it_back() -> None:
    m = machine(count=1000, slow_detach_timeouts=0)
    attach(m, "c")
    now = 0.0
    sizes = []
    for _ in range(6):
        sizes.append(len(poll(m, "c", now)))
        now += ACK_TIMEOUT_S
        tick(m, now)
        # A nack of what timed out frees the window: the next poll shows the window whole.
        m.handle(Nack("c", m.unacked("c"), 0, now))
    # 64, then halved per strike down to the floor of 4.
    assert sizes == [64, 32, 16, 8, 4, 4]
    assert (_window(m, "c").strikes, _window(m, "c").halvings) == (6, 4)
    got = poll(m, "c", now)
    assert len(got) == 4
    m.handle(Ack("c", []))  # an ack of nothing is a keep-alive, not an ack
    assert _window(m, "c").strikes == 6
    ack_all(m, "c", got[:1])  # one ack: the streak ends, the window doubles once
    assert (_window(m, "c").strikes, _window(m, "c").halvings) == (0, 3)
    assert len(poll(m, "c", now)) == 8 - 3
    for _ in range(3):  # three more acks: the whole window again
        m.handle(Ack("c", m.unacked("c")[:1]))
    assert _window(m, "c").halvings == 0
    held = len(m.unacked("c"))
    assert len(poll(m, "c", now)) == WINDOW - held


def test_a_burst_of_batches_timing_out_together_is_one_strike() -> None:
    m = machine(count=40)
    attach(m, "c")
    for _ in range(4):
        poll(m, "c", 0.0, n=10)  # four batches, four ack deadlines
    tick(m, ACK_TIMEOUT_S)
    assert _window(m, "c").strikes == 1
    # Its own come back (alone); their timeout is a new strike.
    assert len(poll(m, "c", ACK_TIMEOUT_S + DUE_S)) == 40
    tick(m, 2 * ACK_TIMEOUT_S + DUE_S)
    assert _window(m, "c").strikes == 2


# --- detached ----------------------------------------------------------------------------


def test_a_streak_detaches_the_consumer_and_its_messages_go_to_the_other_at_once() -> None:
    m = machine(count=200)
    attach(m, "silent", "acker")
    now = 0.0
    detached: list[SlowConsumerDetached] = []
    for _ in range(100):  # bounded: a regression fails here rather than hangs
        if detached:
            break
        poll(m, "silent", now)  # grabs what its window allows, acks nothing
        got = poll(m, "acker", now, n=5)
        ack_all(m, "acker", got)
        now += ACK_TIMEOUT_S / 4
        detached = [a for a in tick(m, now) if isinstance(a, SlowConsumerDetached)]
    (event,) = detached
    assert (event.consumer_id, event.name, event.strikes) == ("silent", "silent", 3)
    assert "3 times in a row" in event.reason
    assert m.consumers == ["acker"]
    with pytest.raises(ConsumerDetachedError) as refused:
        m.handle(Poll("silent", 10, now))
    assert refused.value.code == "consumer_detached"
    assert isinstance(refused.value, ConsumerNotFoundError)  # a kind of not attached
    assert "timed out unacknowledged 3 times" in refused.value.message
    with pytest.raises(ConsumerDetachedError):
        m.handle(Ack("silent", []))  # a keep-alive too
    # What it held goes to the other (in flight: at once, count + 1), then the rest.
    for _ in range(1000):
        if not m.held_count:
            break
        got = poll(m, "acker", now)
        assert got, "nothing delivered while messages are held"
        ack_all(m, "acker", got)
        now += DUE_S
        tick(m, now)
    assert m.cursor("p0").next_offset == 200


def test_an_ack_ends_the_streak() -> None:
    m = machine(count=500)
    attach(m, "slowpoke", "other")
    now = 0.0
    for _ in range(10):
        got = poll(m, "slowpoke", now)
        poll(m, "other", now, n=0)
        ack_all(m, "slowpoke", got[:1])  # it acks a little each round: never detached
        now += ACK_TIMEOUT_S
        actions = tick(m, now)
        assert not [a for a in actions if isinstance(a, SlowConsumerDetached)]
    assert m.consumers == ["slowpoke", "other"]


@pytest.mark.parametrize("kind", ["exclusive", "shared"])
def test_a_lone_consumer_is_slowed_but_never_detached(kind: DeliveryType) -> None:
    m = machine(kind, count=100)
    attach(m, "c")
    now = 0.0
    for _ in range(8):
        assert poll(m, "c", now)  # its own come back: nobody else can take them
        now += ACK_TIMEOUT_S
        assert not [a for a in tick(m, now) if isinstance(a, SlowConsumerDetached)]
        now += DUE_S
        tick(m, now)
    assert m.consumers == ["c"]
    assert _window(m, "c").strikes == 8


def test_failover_detaches_a_silent_active_consumer_and_the_standby_takes_over() -> None:
    m = machine("failover", count=20)
    attach(m, "active", "standby")
    now = 0.0
    for _ in range(3):
        assert poll(m, "standby", now) == []  # a standby gets nothing while active is there
        assert poll(m, "active", now)  # its own come back to it: nobody else can take them
        now += ACK_TIMEOUT_S
        tick(m, now)
        now += DUE_S
        tick(m, now)
    assert m.consumers == ["standby"]
    got = poll(m, "standby", now)
    assert offsets(got) == list(range(20))
    # Counted once per timeout: the detach gives back what a timeout already took back.
    assert {msg.redelivery_count for msg in got} == {3}


def test_key_shared_keeps_a_keys_redeliveries_with_its_owner_until_it_is_detached() -> None:
    m = KeySharedMachine(
        {"p0": PartitionCursor(0)}, settings(), key_of=lambda p: str(p), rng=lambda: 0.5
    )
    attach(m, "a", "b")
    owner = m.owner("k")
    other = "b" if owner == "a" else "a"
    m.handle(MessagesAvailable("p0", [(o, "k") for o in range(5)]))
    now = 0.0
    strikes = 0
    for _ in range(10):  # bounded: a regression fails here rather than hangs
        if owner not in m.consumers:
            break
        assert poll(m, other, now) == []  # never another key's holder: order per key
        assert offsets(poll(m, owner, now)) == list(range(5))
        strikes += 1
        now += ACK_TIMEOUT_S
        tick(m, now)
        now += DUE_S  # what timed out keeps its backoff, detached or not
        tick(m, now)
    assert strikes == 3
    got = poll(m, other, now)
    assert offsets(got) == list(range(5))  # in offset order, to the new owner
    assert [msg.offset for msg in got] == list(range(5))


# --- a starving subscription, simulated --------------------------------------------------


def test_an_acking_consumer_gets_every_message_within_twice_the_ack_timeout() -> None:
    """The black-box report: a push consumer with a big window that never acks and a polling
    consumer that acks, on one shared subscription. Every message reaches the acker within
    2 x the ack timeout of its arrival; the silent one ends detached; nothing is lost."""
    m = machine(count=0, max_unacked_per_consumer=1000)
    attach(m, "silent", "acker")
    step_s = 0.05
    arrived: dict[int, float] = {}
    first_to_acker: dict[int, float] = {}
    detached_at: float | None = None
    now, next_offset = 0.0, 0
    while now < 12.0:
        if now < 8.0 and round(now / step_s) % 4 == 0:  # 10 messages every 0.2 s for 8 s
            feed(m, next_offset, 10)
            arrived.update(dict.fromkeys(range(next_offset, next_offset + 10), now))
            next_offset += 10
        if "silent" in m.consumers:
            poll(m, "silent", now)
        got = poll(m, "acker", now, n=100)
        for msg in got:
            first_to_acker.setdefault(msg.offset, now)
        ack_all(m, "acker", got)
        now = round(now + step_s, 6)
        for action in tick(m, now):
            if isinstance(action, SlowConsumerDetached):
                detached_at = now
    assert detached_at is not None
    assert detached_at < 8.0
    assert set(first_to_acker) == set(arrived) == set(range(next_offset))
    late = {o: first_to_acker[o] - arrived[o] for o in arrived}
    assert max(late.values()) <= 2 * ACK_TIMEOUT_S, max(late.items(), key=lambda kv: kv[1])
    assert m.cursor("p0").next_offset == next_offset
    assert m.held_count == 0


# --- the pure parts ----------------------------------------------------------------------


def test_window_floor_never_exceeds_the_configured_window() -> None:
    consumer = ConsumerWindow("c", "c", halvings=10)
    assert slow.window(settings(slow_window_min=4), consumer) == 4
    assert slow.window(settings(slow_window_min=1000), consumer) == WINDOW
    assert slow.window(settings(slow_window_min=0), consumer) == WINDOW  # off
    assert slow.window(settings(), ConsumerWindow("c", "c")) == WINDOW


def test_the_detached_book_forgets_the_oldest_past_its_limit() -> None:
    book = slow.DetachedBook(limit=2)
    for name in ("a", "b", "c"):
        book.add(name, f"why {name}")
    assert (book.reason("a"), book.reason("b"), book.reason("c")) == (None, "why b", "why c")


def _window(m: SubscriptionMachine, consumer: str) -> ConsumerWindow:
    return m._consumers[consumer]  # the bookkeeping under test
