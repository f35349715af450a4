"""The SDK's inbox keeps a delayed message handed over before its time until then
(danube.client._inbox, "Delayed messages handed early"): never given to the application
early, given in time order, counted in the room the stream grants credits for, a second
copy of one kept dropped; a consumer that does not hold queues everything at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from danube.client._inbox import HOLD_MS_MAX, Inbox
from danube.client.messages import ReceivedMessage
from danube.wire.delay import DELIVER_AFTER_ATTRIBUTE, DELIVER_AT_ATTRIBUTE

pytestmark = pytest.mark.unit


def now_ms() -> int:
    return int(time.time() * 1000)


def message(
    offset: int, attributes: dict[str, str], publish_ms: int | None = None
) -> ReceivedMessage:
    publish_ms = now_ms() if publish_ms is None else publish_ms
    return ReceivedMessage("p0", offset, b"x", None, attributes, publish_ms, "p", 0)


async def test_a_message_handed_early_is_kept_until_its_time_in_time_order() -> None:
    inbox = Inbox(10, hold=True)
    start = now_ms()
    inbox.put_many(
        [
            message(0, {DELIVER_AT_ATTRIBUTE: str(start + 300)}),
            message(1, {}),  # not delayed: at once
            message(2, {DELIVER_AFTER_ATTRIBUTE: "150"}, publish_ms=start),
        ]
    )
    assert len(inbox) == 3
    assert inbox.free == 7  # kept ones take room: no credit for them
    first = inbox.take_nowait()
    assert first is not None
    assert first.offset == 1
    assert inbox.take_nowait() is None
    order: list[tuple[int, int]] = []
    for _ in range(2):
        got = await asyncio.wait_for(inbox.get(), 2)
        order.append((got.offset, now_ms()))
    assert [offset for offset, _ in order] == [2, 0]
    assert order[0][1] >= start + 150  # never early
    assert order[1][1] >= start + 300
    assert order[1][1] < start + 300 + 100  # and on time
    assert len(inbox) == 0
    assert inbox.held_total == 2


async def test_a_second_copy_of_a_kept_message_is_dropped() -> None:
    inbox = Inbox(10, hold=True)
    due = str(now_ms() + 200)
    inbox.put(message(5, {DELIVER_AT_ATTRIBUTE: due}))
    inbox.put_many([message(5, {DELIVER_AT_ATTRIBUTE: due}), message(6, {})])
    assert len(inbox) == 2
    assert inbox.copies_dropped == 1
    taken = [await asyncio.wait_for(inbox.get(), 2) for _ in range(2)]
    assert [m.offset for m in taken] == [6, 5]
    await asyncio.sleep(0.05)
    assert inbox.take_nowait() is None  # once only


async def test_what_is_not_held_is_queued_at_once() -> None:
    """Due already, due too far ahead (no dispatcher hands one out that early), or a
    consumer that does not hold (exclusive and failover deliver delayed messages at once)."""
    start = now_ms()
    holding = Inbox(10, hold=True)
    holding.put(message(0, {DELIVER_AT_ATTRIBUTE: str(start - 5)}))
    holding.put(message(1, {DELIVER_AT_ATTRIBUTE: str(start + HOLD_MS_MAX + 5000)}))
    holding.put(message(2, {DELIVER_AT_ATTRIBUTE: "not a number"}))
    assert [holding.take_nowait() for _ in range(3)] != [None] * 3
    assert holding.held_total == 0
    plain = Inbox(10)
    plain.put(message(3, {DELIVER_AT_ATTRIBUTE: str(start + 500)}))
    got = plain.take_nowait()
    assert got is not None
    assert got.offset == 3


async def test_a_kept_message_counts_against_the_capacity() -> None:
    from danube.client.errors import ProtocolError

    inbox = Inbox(2, hold=True)
    due = str(now_ms() + 1000)
    inbox.put_many([message(0, {DELIVER_AT_ATTRIBUTE: due}), message(1, {})])
    with pytest.raises(ProtocolError):
        inbox.put(message(2, {}))
    assert [m.offset for m in inbox.drain()] == [1]
    assert len(inbox) == 0


async def test_kept_messages_have_room_of_their_own_then_take_the_queue_s() -> None:
    from danube.client.errors import ProtocolError

    inbox = Inbox(2, hold=True, hold_room=3)
    due = str(now_ms() + 1000)
    inbox.put_many([message(o, {DELIVER_AT_ATTRIBUTE: due}) for o in range(3)])
    assert inbox.free == 2  # the queue's room is untouched
    inbox.put(message(3, {DELIVER_AT_ATTRIBUTE: due}))
    assert inbox.free == 1  # one past the kept room takes a slot of the queue
    inbox.put(message(4, {}))
    assert inbox.free == 0
    assert len(inbox) == 5  # capacity + hold_room: the bound
    with pytest.raises(ProtocolError):
        inbox.put(message(5, {}))
    assert Inbox(2, hold_room=3).free == 2  # no room to keep without holding
