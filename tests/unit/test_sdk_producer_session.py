"""The SDK's producer session over a fake server (httpx.MockTransport): opened before the
first batch, its id on every batch, kept alive about three times per TTL, a lost session
failing later batches, a refused open, and no session without an access mode."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from danube.client import AsyncDanubeClient, ConflictError, NotFoundError, RetryPolicy
from danube.frame.produce import scan_frames_for_produce

pytestmark = pytest.mark.unit

FAST = RetryPolicy(base_s=0.001, cap_s=0.004)
BASE = "/v1/topics/default/t/producers"
WAIT_S = 5.0


class FakeServer:
    """Answers the producer routes and produces; ``gone`` makes keep-alives answer 404."""

    def __init__(self, ttl_ms: int = 150) -> None:
        self.ttl_ms = ttl_ms
        self.gone = False
        self.refuse: str | None = None
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[dict[str, object]] = []
        self.keepalives = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        # An idempotent producer's own calls (its epoch, the topic's partitions) are not
        # what these tests are about.
        if path == f"{BASE}/me/epoch":
            return httpx.Response(200, json={"producer": "me", "epoch": 1})
        if path.startswith("/v1/lookup/"):
            return httpx.Response(404, json={"error": {"code": "topic_not_found", "message": ""}})
        self.calls.append((method, path))
        if (method, path) == ("POST", BASE):
            if self.refuse is not None:
                return httpx.Response(409, json={"error": {"code": self.refuse, "message": ""}})
            body = json.loads(request.content)
            assert body == {"name": "me", "access_mode": "exclusive"}
            answer = {"producer_id": "abc123", "access_mode": "exclusive"}
            return httpx.Response(201, json={**answer, "session_ttl_ms": self.ttl_ms})
        if path == f"{BASE}/abc123/keepalive":
            self.keepalives += 1
            if self.gone:
                error = {"code": "producer_not_found", "message": "gone"}
                return httpx.Response(404, json={"error": error})
            return httpx.Response(204)
        if (method, path) == ("DELETE", f"{BASE}/abc123"):
            return httpx.Response(204)
        assert path == "/v1/topics/default/t/messages", path
        # The SDK's binary body: what the JSON body carries around messages is in the query.
        assert request.headers["content-type"] == "application/vnd.danube.records"
        frames = scan_frames_for_produce(request.content, max_count=10_000)
        self.bodies.append(dict(request.url.params))
        runs = [{"partition": "/default/t", "offset": 0, "count": len(frames)}]
        return httpx.Response(200, json={"runs": runs})


def _client(server: FakeServer) -> AsyncDanubeClient:
    return AsyncDanubeClient(
        "http://danube.test", transport=httpx.MockTransport(server), retry=FAST
    )


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():  # noqa: ASYNC110 (a fake server's counters, no event to wait on)
            await asyncio.sleep(0.01)


async def test_a_session_is_held_kept_alive_sent_and_closed() -> None:
    server = FakeServer()
    async with (
        _client(server) as client,
        client.producer("t", name="me", access_mode="exclusive") as producer,
    ):
        assert producer.producer_id == "abc123"
        assert (await producer.send_and_wait("x")).offset == 0
        assert server.bodies[0]["producer_id"] == "abc123"
        await _until(lambda: server.keepalives >= 3)  # 150 ms TTL: every 50 ms
        assert producer.session_error is None

        server.gone = True  # expired on the server: later batches fail with its error
        await _until(lambda: producer.session_error is not None)
        with pytest.raises(NotFoundError) as lost:
            await producer.send_and_wait("y")
        assert lost.value.code == "producer_not_found"
        assert len(server.bodies) == 1
    assert server.calls[0] == ("POST", BASE)
    assert server.calls[-1] == ("DELETE", f"{BASE}/abc123")


async def test_a_refused_session_fails_the_open_and_sends_nothing() -> None:
    server = FakeServer()
    server.refuse = "exclusive_producer"
    async with _client(server) as client:
        with pytest.raises(ConflictError) as refused:
            async with client.producer("t", name="me", access_mode="exclusive"):
                pass
    assert (refused.value.status, refused.value.code) == (409, "exclusive_producer")
    assert server.calls == [("POST", BASE)]


async def test_no_access_mode_no_session() -> None:
    server = FakeServer()
    async with _client(server) as client, client.producer("t", name="me") as producer:
        await producer.send_and_wait("x")
        assert producer.producer_id is None
    assert [path for _, path in server.calls] == ["/v1/topics/default/t/messages"]
    assert "producer_id" not in server.bodies[0]
