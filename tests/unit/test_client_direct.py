"""The SDK's data doors (danube.client._direct): what a lookup teaches, what a failure
unlearns, and how long an unreachable door stays untried."""

from __future__ import annotations

import time
from collections.abc import Callable

from danube.client import _direct
from danube.client._direct import DataDoors
from danube.client._http import HttpCore
from danube.client.retry import RetryPolicy
from danube.names import TopicName

P0 = TopicName("default", "t-part-0")
P1 = TopicName("default", "t-part-1")


def _doors(*, enabled: bool = True, clock: Callable[[], float] = time.monotonic) -> DataDoors:
    http = HttpCore("http://discovery:8080", timeout_s=5, retry=RetryPolicy())
    return DataDoors(http, enabled=enabled, clock=clock)


async def test_a_lookup_teaches_each_partitions_door_and_a_failure_unlearns_it() -> None:
    doors = _doors()
    doors.learn([P0, P1], ["http://a:7001/", None])
    core = doors.core(P0)
    assert core is not None
    assert core.base_url == "http://a:7001"
    assert doors.core(P1) is None  # no door: the proxy path
    assert doors.core(P0) is core  # one pool per door
    doors.failed(P0)
    assert doors.core(P0) is None
    assert doors.failures == 1
    doors.learn([P0], ["http://a:7001"])  # a leader that moved back is learned again
    assert doors.core(P0) is not None
    await doors.aclose()


async def test_an_unreachable_door_is_not_learned_again_until_its_time_passed() -> None:
    now = [1000.0]
    doors = _doors(clock=lambda: now[0])
    doors.learn([P0, P1], ["http://a:7001", "http://a:7001"])
    doors.failed(P0, unreachable=True)
    doors.learn([P0, P1], ["http://a:7001", "http://a:7001"])
    assert doors.url(P0) is None
    assert doors.url(P1) is None
    now[0] += _direct.UNREACHABLE_S + 1
    doors.learn([P0], ["http://a:7001"])
    assert doors.url(P0) == "http://a:7001"
    await doors.aclose()


async def test_an_unreachable_door_named_under_a_newer_epoch_is_tried_at_once() -> None:
    # A node restarted on the same address takes a partition's lead again (a new epoch):
    # its door is up, whatever the ban said. The same epoch (a frozen leader still named)
    # keeps the ban, for every partition it held then.
    now = [1000.0]
    doors = _doors(clock=lambda: now[0])
    doors.learn([P0, P1], ["http://a:7001", "http://a:7001"], [4, 9])
    doors.failed(P0, unreachable=True)
    doors.learn([P0, P1], ["http://a:7001", "http://a:7001"], [4, 9])
    assert (doors.url(P0), doors.url(P1)) == (None, None)
    doors.learn([P0, P1], ["http://b:7001", "http://a:7001"], [5, 9])  # P0 moved to b
    assert (doors.url(P0), doors.url(P1)) == ("http://b:7001", None)
    doors.learn([P0, P1], ["http://a:7001", "http://a:7001"], [6, 9])  # back on a, restarted
    assert (doors.url(P0), doors.url(P1)) == ("http://a:7001", "http://a:7001")
    await doors.aclose()


def test_a_client_that_reaches_one_address_learns_no_door() -> None:
    doors = _doors(enabled=False)
    doors.learn([P0], ["http://a:7001"])
    assert doors.core(P0) is None
    assert doors.known == 0
