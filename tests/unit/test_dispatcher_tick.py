"""A subscription's tick loop: every TICK_INTERVAL_S while its machine holds messages or a
cursor to write, every QUIET_TICK_S (or at its next event) while it is quiet, so that idle
subscriptions cost the dispatcher next to nothing."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from danube.dispatcher import ticking
from danube.dispatcher.changes import Changes
from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import ConsumerAttached, Event, MessagesAvailable, Tick
from danube.dispatcher.redelivery import DeliverySettings
from danube.frame import RawFrame, Record, encode_frame, encode_record
from danube.wire.delay import DELIVER_AT_ATTRIBUTE

pytestmark = pytest.mark.unit


class TickHost:
    """What ticking.tick_loop is handed by a subscription's runtime, around a real machine."""

    def __init__(self) -> None:
        self.machine = SubscriptionMachine(
            "exclusive", {"p0": PartitionCursor(0)}, DeliverySettings(), rng=lambda: 0.5
        )
        self.machine.handle(ConsumerAttached("c", "c"))
        self.changes = Changes()
        self.ticks = 0

    def _machine(self) -> SubscriptionMachine:
        return self.machine

    async def changed(self, timeout_s: float) -> None:
        await self.changes.wait(timeout_s)

    async def tick(self, now_s: float, wall_ms: int) -> None:
        await self.handle(Tick(now_s, wall_ms))

    def notify(self) -> None:
        self.changes.notify()

    async def handle(self, event: Event) -> list[Any]:
        self.ticks += isinstance(event, Tick)
        return self.machine.handle(event)


async def _ticks_in(host: TickHost, seconds: float) -> int:
    before = host.ticks
    await asyncio.sleep(seconds)
    return host.ticks - before


async def test_a_quiet_subscription_ticks_rarely_and_an_event_wakes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ticking, "TICK_INTERVAL_S", 0.01)
    monkeypatch.setattr(ticking, "QUIET_TICK_S", 0.2)
    host = TickHost()
    loop = asyncio.create_task(ticking.tick_loop(host._machine, host.changed, host.tick))
    try:
        assert host.machine.quiet()
        assert await _ticks_in(host, 0.5) <= 3  # every 0.2 s (50 at the busy interval)
        # A message held: ack deadlines and cursor writes fall due with time.
        host.machine.handle(MessagesAvailable("p0", [(0, b"m")]))
        host.notify()  # as the runtime does on every event: the quiet wait ends now
        assert not host.machine.quiet()
        assert await _ticks_in(host, 0.3) >= 6  # ~30 at 10 ms; quiet, at most 2
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


def _delayed(offset: int, due_ms: int) -> tuple[int, RawFrame]:
    """A frame at ``offset`` of a record to be delivered at ``due_ms``."""
    record = encode_record(
        Record(
            payload=b"m",
            publish_time_ms=due_ms - 300,
            producer="p",
            attributes={DELIVER_AT_ATTRIBUTE: str(due_ms)},
        )
    )
    return offset, RawFrame(offset, memoryview(encode_frame(offset, record)))


async def _released_over(host: TickHost, seconds: float) -> dict[int, float]:
    """Run the tick loop for ``seconds``; when each offset was released (ms of the wall
    clock), the delayed messages being released in due order."""
    released: dict[int, float] = {}
    handle = host.handle

    async def watched(event: Event) -> list[Any]:
        actions = await handle(event)
        now_ms = time.time() * 1000
        for offset in range(len(released), host.machine.held_count):
            released[offset] = now_ms
        return actions

    host.handle = watched  # type: ignore[method-assign]
    loop = asyncio.create_task(ticking.tick_loop(host._machine, host.changed, host.tick))
    try:
        await asyncio.sleep(seconds)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    return released


async def test_a_quiet_subscription_ticks_when_a_delayed_message_falls_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ticking, "QUIET_TICK_S", 5.0)  # far longer than the test
    host = TickHost()
    host.machine = SubscriptionMachine("shared", {"p0": PartitionCursor(0)}, DeliverySettings())
    host.machine.handle(ConsumerAttached("c", "c"))
    due_ms = int(time.time() * 1000) + 300
    host.machine.handle(MessagesAvailable("p0", [_delayed(0, due_ms)], 0, 1))
    host.machine.handle(Tick(time.monotonic(), due_ms - 300))  # its cursor written: quiet
    assert host.machine.quiet()
    released = await _released_over(host, 0.6)
    assert 0 in released, "the delayed message was not released"
    assert due_ms <= released[0] < due_ms + 40  # at its time, not at a quiet tick (5 s)


async def test_messages_falling_due_every_millisecond_are_released_a_gap_at_a_time() -> None:
    # 200 messages due one a millisecond: released in ticks at least DUE_TICK_GAP_S apart
    # (not one tick a millisecond), none before its time, none later than the gap allows.
    host = TickHost()
    host.machine = SubscriptionMachine(
        "shared", {"p0": PartitionCursor(0)}, DeliverySettings(max_held=10_000)
    )
    host.machine.handle(ConsumerAttached("c", "c"))
    first_due = int(time.time() * 1000) + 100
    frames = [_delayed(offset, first_due + offset) for offset in range(200)]
    host.machine.handle(MessagesAvailable("p0", frames, 0, len(frames)))
    released = await _released_over(host, 0.45)
    assert sorted(released) == list(range(200))
    assert all(released[offset] >= first_due + offset for offset in released)
    late = sorted(released[offset] - (first_due + offset) for offset in released)
    assert late[len(late) // 2] <= ticking.DUE_TICK_GAP_S * 1000 + 20  # a loaded machine's stalls
    ticks = len({round(at, 1) for at in released.values()})
    assert ticks <= 60  # ~40 over the 200 ms at a 5 ms gap; ~200 with a tick a millisecond
