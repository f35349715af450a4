"""The delivery machine's window across ack timeouts, and acks of messages not in flight."""

from __future__ import annotations

import pytest

from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delivery import DeliveryType, SubscriptionMachine
from danube.dispatcher.events import (
    Ack,
    ConsumerAttached,
    ConsumerDetached,
    Deliver,
    Message,
    MessagesAvailable,
    Nack,
    NotInFlight,
    Poll,
    Tick,
)
from danube.dispatcher.redelivery import DeliverySettings

pytestmark = pytest.mark.unit

WINDOW = 10
ACK_TIMEOUT_S = 5.0
# Redelivery after an ack timeout waits 0.5 ... 1 s (base 1 s, rng 0.5: 0.75 s).
DUE_S = 1.0


def machine(kind: DeliveryType = "shared") -> SubscriptionMachine:
    settings = DeliverySettings(
        max_unacked_per_consumer=WINDOW,
        ack_timeout_s=ACK_TIMEOUT_S,
        redelivery_base_s=1.0,
        redelivery_max_s=1.0,
        max_redeliveries=100,
    )
    m = SubscriptionMachine(kind, {"p0": PartitionCursor(0)}, settings, rng=lambda: 0.5)
    m.handle(MessagesAvailable("p0", [(o, f"m{o}") for o in range(100)]))
    return m


def poll(m: SubscriptionMachine, consumer: str, now_s: float, n: int = 1000) -> list[Message]:
    actions = m.handle(Poll(consumer, n, now_s))
    m.validate()
    return [msg for a in actions if isinstance(a, Deliver) for msg in a.messages]


def offsets(messages: list[Message]) -> list[int]:
    return [msg.offset for msg in messages]


@pytest.mark.parametrize("kind", ["exclusive", "shared", "failover"])
def test_a_consumer_that_never_acks_is_given_no_more_than_its_window(kind: DeliveryType) -> None:
    # The defect: an ack timeout took the messages out of the window, so the next poll got a
    # whole new window of fresh messages while the first was still unacked (and so on).
    m = machine(kind)
    m.handle(ConsumerAttached("c", "c"))
    given = set(offsets(poll(m, "c", 0.0)))
    assert given == set(range(WINDOW))
    now = 0.0
    for round_ in range(1, 4):
        now += ACK_TIMEOUT_S
        m.handle(Tick(now))
        m.validate()
        assert m.in_flight("c") == []
        assert len(m.unacked("c")) == WINDOW  # taken back, still counted against it
        assert poll(m, "c", now) == []  # nothing fresh meanwhile
        now += DUE_S
        m.handle(Tick(now))
        again = poll(m, "c", now)
        # Its own messages come back, and only those.
        assert sorted(offsets(again)) == list(range(WINDOW))
        assert {msg.redelivery_count for msg in again} == {round_}
        given.update(offsets(again))
    assert given == set(range(WINDOW))
    # Acking frees the window: fresh messages flow again.
    m.handle(Ack("c", [("p0", o) for o in range(3)]))
    assert offsets(poll(m, "c", now)) == [10, 11, 12]


def test_another_consumer_takes_over_a_stuck_consumers_window() -> None:
    m = machine("shared")
    m.handle(ConsumerAttached("stuck", "stuck"))
    m.handle(ConsumerAttached("ok", "ok"))
    assert offsets(poll(m, "stuck", 0.0)) == list(range(WINDOW))
    m.handle(Tick(ACK_TIMEOUT_S))
    # The other consumer is given them (they come out of the stuck one's window)...
    taken = poll(m, "ok", ACK_TIMEOUT_S + DUE_S, n=4)
    assert offsets(taken) == [0, 1, 2, 3]
    assert len(m.unacked("stuck")) == WINDOW - 4
    # ...so the stuck one has room for exactly that many fresh ones; its own stay for the
    # other one, which polled within the ack timeout and has room (fair redelivery).
    again = poll(m, "stuck", ACK_TIMEOUT_S + DUE_S)
    assert sorted(offsets(again)) == [10, 11, 12, 13]
    assert len(m.unacked("stuck")) == WINDOW
    assert offsets(poll(m, "ok", ACK_TIMEOUT_S + DUE_S)) == [4, 5, 6, 7, 8, 9]
    assert len(m.unacked("stuck")) == 4


def test_a_nack_or_an_ack_of_a_message_taken_back_frees_its_room() -> None:
    m = machine("exclusive")
    m.handle(ConsumerAttached("c", "c"))
    poll(m, "c", 0.0)
    m.handle(Tick(ACK_TIMEOUT_S))
    actions = m.handle(Ack("c", [("p0", 0)]))
    assert not [a for a in actions if isinstance(a, NotInFlight)]  # a late ack counts
    m.handle(Nack("c", [("p0", 1)], 0, ACK_TIMEOUT_S))
    m.validate()
    assert len(m.unacked("c")) == WINDOW - 2
    # Its own 8 (the nacked one included: it comes again) come back first, then 1 fresh.
    again = poll(m, "c", ACK_TIMEOUT_S + DUE_S)
    assert sorted(offsets(again)) == [*range(1, WINDOW), WINDOW]
    assert m.cursor("p0").next_offset == 1  # the late ack moved the cursor


def test_a_detach_gives_the_taken_back_messages_to_the_others() -> None:
    m = machine("shared")
    m.handle(ConsumerAttached("c1", "c1"))
    m.handle(ConsumerAttached("c2", "c2"))
    poll(m, "c1", 0.0)
    m.handle(Tick(ACK_TIMEOUT_S))
    m.handle(ConsumerDetached("c1", ACK_TIMEOUT_S))
    m.validate()
    assert offsets(poll(m, "c2", ACK_TIMEOUT_S + DUE_S)) == list(range(WINDOW))


def test_an_ack_answers_the_refs_that_were_not_in_flight() -> None:
    m = machine("shared")
    m.handle(ConsumerAttached("c", "c"))
    delivered = poll(m, "c", 0.0, n=5)
    assert offsets(delivered) == [0, 1, 2, 3, 4]
    acks = [("p0", 0), ("p0", 7), ("p0", 500), ("other", 1), ("p0", 7), ("p0", 1)]
    actions = m.handle(Ack("c", acks))
    # Read but never delivered (7), never read (500), not a partition of the subscription.
    assert actions == [NotInFlight("c", (("p0", 7), ("p0", 500), ("other", 1)))]
    assert m.unacked("c") == [("p0", 2), ("p0", 3), ("p0", 4)]
    # Acking again what was acked is fine (a retried ack): nothing to tell.
    assert m.handle(Ack("c", [("p0", 0), ("p0", 1)])) == []
    # A message never delivered is still delivered after the ack that named it.
    assert 7 in offsets(poll(m, "c", 0.0))
