"""The bus watch: lost after ``grace_s`` without a successful round trip (told once, and
once when back; the connection dropped as stale meanwhile), fresh only while a round trip
sent within FRESH_S succeeded; a flush while reconnecting is no round trip."""

from __future__ import annotations

import asyncio

import pytest

from danube.bus import NotConnectedError
from danube.ingest.buswatch import FRESH_S, BusWatch, round_trip


class _Link:
    """A fake clock and a probe that answers or fails (a silent link: it waits its deadline)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.up = True
        self.rtt_s = 0.01

    def clock(self) -> float:
        return self.now

    async def probe(self, timeout_s: float) -> None:
        if self.up:
            self.now += self.rtt_s
            return
        self.now += timeout_s
        raise TimeoutError("no PONG")


def _watch(link: _Link, changes: list[bool]) -> BusWatch:
    return BusWatch(link.probe, grace_s=2.0, on_change=changes.append, clock=link.clock)


def test_lost_after_grace_and_back_once() -> None:
    link, changes = _Link(), list[bool]()
    watch = _watch(link, changes)
    assert asyncio.run(watch.probe_once())
    assert not watch.lost
    assert watch.fresh()
    link.up = False
    link.now += 0.25
    # A silent link: the round trip waits its deadline (the grace), then the link is lost.
    assert not asyncio.run(watch.probe_once())
    assert watch.lost
    assert not watch.fresh()
    assert not asyncio.run(watch.probe_once())
    assert changes == [True]  # told once
    link.up = True
    assert asyncio.run(watch.probe_once())
    assert not watch.lost
    assert watch.fresh()
    assert changes == [True, False]


def test_not_lost_within_grace() -> None:
    link, changes = _Link(), list[bool]()
    watch = _watch(link, changes)
    asyncio.run(watch.probe_once())
    link.now += 1.9  # a round trip in flight on a slow link: not lost yet
    assert not watch.lost
    assert changes == []


def test_fresh_needs_a_round_trip_sent_recently() -> None:
    link, changes = _Link(), list[bool]()
    watch = _watch(link, changes)
    asyncio.run(watch.probe_once())
    link.now += FRESH_S + 0.1
    # No round trip since (the probe hangs on a cut link): the leader may not shrink its
    # ISR, although the link is not declared lost yet.
    assert not watch.fresh()
    assert not watch.lost


def test_lost_link_is_dropped_as_stale_after_each_failed_round_trip() -> None:
    link = _Link()
    reconnects: list[float] = []

    async def reconnect() -> None:
        reconnects.append(link.now)

    watch = BusWatch(link.probe, grace_s=2.0, reconnect=reconnect, clock=link.clock)
    asyncio.run(watch.probe_once())
    assert reconnects == []
    link.up = False
    link.now += 0.25
    asyncio.run(watch.probe_once())
    asyncio.run(watch.probe_once())
    assert len(reconnects) == 2
    link.up = True
    asyncio.run(watch.probe_once())
    assert len(reconnects) == 2  # back: nothing dropped


class _Reconnecting:
    """A bus whose flush returns at once, as nats-py's does while it reconnects."""

    def __init__(self) -> None:
        self.is_connected = False
        self.flushes = 0

    async def flush(self, timeout_s: float | None = None) -> None:
        self.flushes += 1


def test_a_flush_while_reconnecting_is_no_round_trip() -> None:
    bus = _Reconnecting()
    probe = round_trip(bus)
    with pytest.raises(NotConnectedError):
        asyncio.run(probe(2.0))
    bus.is_connected = True
    asyncio.run(probe(2.0))
    assert bus.flushes == 1
