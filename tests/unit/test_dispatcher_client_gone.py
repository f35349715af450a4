"""A request whose dispatcher was killed under it (DispatcherClient's ``owner_gone``): the
bus gives no sign, the reply never comes. Once the request is QUIET_S past due and the owner
is found gone, it goes the way of one that found no responder: a claim, then the request
again, answered by the new owner, long before the request's own deadline. An owner that is
only slow is waited for, its reply taken."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from danube.bus import NoRespondersError
from danube.bus.messages import Reply
from danube.bus.subjects import Subjects
from danube.meta import TopicName
from danube.wire.dispatcher.client import QUIET_S, DispatcherClient

pytestmark = pytest.mark.unit

TOPIC = TopicName("ns", "t")


class _Bus:
    """One owner at a time: ``dead`` takes requests and never answers (killed under them);
    after a claim, the new owner answers every ack with no refs refused. ``slow_s``: the
    first owner answers after that long instead (alive, slow)."""

    subjects = Subjects()

    def __init__(self, *, slow_s: float | None = None) -> None:
        self.slow_s = slow_s
        self.claimed = False
        self.requests: list[str] = []

    async def request(self, subject: str, body: bytes, *, timeout_s: float, **_: Any) -> Reply:
        self.requests.append(subject)
        if subject == self.subjects.subscription_ownership(TOPIC, "s"):
            self.claimed = True
            return Reply(b"")
        if self.claimed:
            return Reply(orjson.dumps({"not_in_flight": []}))
        if self.slow_s is None:
            await asyncio.sleep(timeout_s)  # the dead owner: nothing comes back
            raise AssertionError("waited out the deadline")
        await asyncio.sleep(self.slow_s)
        return Reply(orjson.dumps({"not_in_flight": [{"partition": "p", "offset": 9}]}))


async def test_a_request_to_a_killed_owner_is_claimed_again_long_before_its_deadline() -> None:
    bus = _Bus()
    asked: list[float] = []

    async def gone(topic: TopicName, sub: str) -> bool:
        asked.append(time.monotonic())
        return True

    client = DispatcherClient(bus, timeout_s=10.0, owner_gone=gone)  # type: ignore[arg-type]
    started = time.monotonic()
    assert await client.ack(TOPIC, "s", "c1", [("p", 1)]) == []  # the new owner's answer
    took_s = time.monotonic() - started
    assert QUIET_S <= took_s < QUIET_S + 1.0, took_s
    assert len(asked) == 1
    assert asked[0] - started >= QUIET_S
    ack, claim, again = bus.requests
    assert claim == bus.subjects.subscription_ownership(TOPIC, "s")
    assert ack == again


async def test_a_slow_owner_that_is_not_gone_is_waited_for() -> None:
    bus = _Bus(slow_s=3 * QUIET_S)
    asked: list[float] = []

    async def gone(topic: TopicName, sub: str) -> bool:
        asked.append(time.monotonic())
        return False

    client = DispatcherClient(bus, timeout_s=10.0, owner_gone=gone)  # type: ignore[arg-type]
    assert await client.ack(TOPIC, "s", "c1", [("p", 9)]) == [("p", 9)]  # its own reply
    assert len(bus.requests) == 1  # no claim, no second request
    assert len(asked) >= 2  # asked after QUIET_S, and again


async def test_without_owner_gone_a_request_finds_no_responder_as_before() -> None:
    class _Nobody(_Bus):
        async def request(self, subject: str, body: bytes, **kw: Any) -> Reply:
            if not self.claimed and subject != self.subjects.subscription_ownership(TOPIC, "s"):
                self.requests.append(subject)
                raise NoRespondersError(subject)
            return await super().request(subject, body, **kw)

    bus = _Nobody()
    client = DispatcherClient(bus, timeout_s=10.0)  # type: ignore[arg-type]
    assert await client.ack(TOPIC, "s", "c1", [("p", 1)]) == []
    assert bus.claimed
