"""The SDK consumer's route (danube.client._consume_route): the consume door its attach
named, forgotten when it fails the consumer (421 not_leader, no answer, 502-504) so the
call goes through discovery at once; a door that did not answer is not learned again for
a while; other errors (the consumer's own: 404 consumer_not_found, 429) stay the caller's;
and an ack refused by a door is sent again through discovery, none lost."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danube.client._acks import AckBatcher
from danube.client._consume_route import UNREACHABLE_S, ConsumeRoute, door_failed
from danube.client._http import HttpCore
from danube.client.errors import NotFoundError, OverLimitError, TransportError, api_error
from danube.client.retry import RetryPolicy

pytestmark = pytest.mark.unit

PROXY = "http://discovery:8080"
DOOR = "http://dispatcher-0:7002"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _route(enabled: bool = True) -> tuple[ConsumeRoute, HttpCore, Clock]:
    proxy = HttpCore(PROXY, timeout_s=1.0, retry=RetryPolicy())
    clock = Clock()
    return ConsumeRoute(proxy, enabled=enabled, clock=clock), proxy, clock


def test_which_errors_send_a_consumer_back_to_discovery() -> None:
    assert door_failed(api_error(421, "not_leader", "moved"))
    assert door_failed(TransportError("connection refused"))
    for status in (502, 503, 504):
        assert door_failed(api_error(status, "unavailable", "x"))
    # Discovery took the client's credentials (it attached): the door should have too.
    assert door_failed(api_error(401, "unauthenticated", "x"))
    assert not door_failed(NotFoundError("gone", code="consumer_not_found", status=404))
    assert not door_failed(OverLimitError("slow down", code="too_many_requests", status=429))


async def test_an_attach_that_names_a_door_routes_there_until_it_fails() -> None:
    route, proxy, _ = _route()
    assert route.http is proxy
    route.learn(DOOR + "/")
    door = route.http
    assert door is not proxy
    assert (route.url, door.base_url) == (DOOR, DOOR)
    route.learn(DOOR)
    assert route.http is door  # the same door: the same connections
    # The consumer's own errors stay its own, on the door too.
    assert not route.fall_back(NotFoundError("x", code="consumer_not_found", status=404), door)
    assert route.http is door
    assert route.fall_back(api_error(421, "not_leader", "moved"), door)
    assert (route.http, route.url, route.fallbacks) == (proxy, None, 1)
    # A call made through discovery never falls back further.
    assert not route.fall_back(TransportError("refused"), proxy)
    route.learn(DOOR)  # a 421 does not bar the door: the next attach may name it
    assert route.url == DOOR
    await route.aclose()


async def test_a_door_that_did_not_answer_is_not_learned_again_for_a_while() -> None:
    route, proxy, clock = _route()
    route.learn(DOOR)
    assert route.fall_back(TransportError("refused"), route.http)
    route.learn(DOOR)
    assert route.http is proxy
    clock.now += UNREACHABLE_S + 1
    route.learn(DOOR)
    assert route.url == DOOR
    # A stale failure (the door was replaced meanwhile) still retries, without forgetting.
    stale = route.http
    route.learn("http://dispatcher-1:7002")
    assert route.fall_back(api_error(421, "not_leader", "moved"), stale)
    assert route.url == "http://dispatcher-1:7002"
    await route.aclose()


async def test_direct_off_or_no_url_is_the_proxy_path() -> None:
    route, proxy, _ = _route(enabled=False)
    route.learn(DOOR)
    assert (route.http, route.url) == (proxy, None)
    on, proxy_on, _ = _route()
    on.learn(DOOR)
    on.learn(None)  # a new attach whose dispatcher has no door
    assert on.http is proxy_on
    await route.aclose()
    await on.aclose()


class Session:
    reattach_enabled = True
    consumer_id = "ns.t.s.c1"

    async def reattach(self, stale_id: str) -> None:
        raise AssertionError("a door's refusal goes to discovery first, with the same id")


async def test_an_ack_refused_by_a_moved_door_is_sent_again_through_discovery() -> None:
    route, proxy, _ = _route()
    route.learn(DOOR)
    sent: list[tuple[str, str, Any]] = []

    async def door_post(method: str, path: str, **options: Any) -> None:
        sent.append((DOOR, path, options["body"]))
        # The door asks the caller not to retry a fall-back error itself.
        assert not options["retry_if"](api_error(421, "not_leader", "moved"))
        raise api_error(421, "not_leader", "moved")

    async def proxy_post(method: str, path: str, **options: Any) -> None:
        sent.append((PROXY, path, options["body"]))

    route.http.request_retrying = door_post  # type: ignore[method-assign,assignment]
    proxy.request_retrying = proxy_post  # type: ignore[method-assign,assignment]
    batcher = AckBatcher(route, Session(), interval_s=0.0, batch_max=10, timeout_s=1.0)
    runner = asyncio.create_task(batcher.run())
    batcher.ack("/ns/t", 4)
    batcher.ack("/ns/t", 5)
    await asyncio.wait_for(batcher.flush(), 5)
    runner.cancel()
    body = {"ranges": [{"partition": "/ns/t", "first": 4, "last": 5}]}
    path = "/v1/consumers/ns.t.s.c1/ack"
    assert sent == [(DOOR, path, body), (PROXY, path, body)]
    assert (batcher.acked, batcher.failed, route.fallbacks) == (2, 0, 1)
    await route.aclose()
