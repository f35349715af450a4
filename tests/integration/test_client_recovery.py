"""The client SDK through failures, with the services in-process on real NATS and etcd: a
produce sent while no ingest node runs is retried on 503 until one starts, and a streaming
consumer attaches again after its dispatcher restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from danube.client import AsyncDanubeClient
from danube.config import DanubeSettings
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.runtime.service import run_in_process

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 20.0
RECEIVE_TIMEOUT_S = 30.0


class StatusLog(httpx.AsyncBaseTransport):
    """The real transport, remembering the status of every answer."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.statuses: list[int] = []
        self.seen_503 = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.statuses.append(response.status_code)
        if response.status_code == 503:
            self.seen_503.set()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def _discovery(settings: DanubeSettings) -> AsyncIterator[str]:
    """Discovery in-process, ready; yields its URL."""
    url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=url, timeout=5) as http,
    ):
        async with asyncio.timeout(READY_TIMEOUT_S):
            while True:
                assert not task.done(), "discovery stopped before it was ready"
                try:
                    if (await http.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        yield url


async def test_a_produce_is_retried_on_503_until_an_ingest_node_starts(
    mesh_settings: Callable[..., DanubeSettings],
) -> None:
    # Discovery gives up on a partition with no owner after 1 s: 503 no_owner.
    settings = mesh_settings(produce_timeout_s=1.0)
    transport = StatusLog()
    async with (
        _discovery(settings) as url,
        AsyncDanubeClient(url, transport=transport) as client,
        client.producer("/default/late", send_timeout_s=60) as producer,
    ):
        sending = asyncio.ensure_future(producer.send_and_wait("first"))
        async with asyncio.timeout(15):
            await transport.seen_503.wait()
        assert not sending.done()
        async with run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True):
            async with asyncio.timeout(45):
                stored = await sending
            assert (stored.partition, stored.offset) == ("/default/late", 0)
            assert (await producer.send_and_wait("second")).offset == 1
            description = await client.admin.describe_topic("/default/late")
    assert transport.statuses.count(503) >= 1
    assert description.partitions[0].offsets.next_offset == 2  # nothing stored twice


async def test_a_streaming_consumer_attaches_again_after_its_dispatcher_restarts(
    mesh_settings: Callable[..., DanubeSettings],
) -> None:
    settings = mesh_settings()
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        _discovery(settings) as url,
        AsyncDanubeClient(url) as client,
        client.producer("/default/restart") as producer,
    ):
        async with run_in_process(dispatcher_app.serve, settings, "disp-1"):
            consumer = await client.subscribe("/default/restart", "s", start="earliest")
            first_id = consumer.consumer_id
            for i in range(5):
                await producer.send(f"m{i}")
            await producer.flush()
            before = [await consumer.receive(RECEIVE_TIMEOUT_S) for _ in range(5)]
            for message in before:
                message.ack()
            await consumer.flush_acks()
        # The dispatcher is gone; its successor knows the subscription's cursor, not the
        # consumer: the stream ends with consumer_not_found and the client attaches again.
        async with run_in_process(dispatcher_app.serve, settings, "disp-1"):
            for i in range(5, 10):
                await producer.send(f"m{i}")
            await producer.flush()
            after = [await consumer.receive(RECEIVE_TIMEOUT_S) for _ in range(5)]
            for message in after:
                message.ack()
            await consumer.close()

    assert [m.text for m in before] == [f"m{i}" for i in range(5)]
    assert [(m.offset, m.text) for m in after] == [(i, f"m{i}") for i in range(5, 10)]
    assert consumer.reattached >= 1
    assert consumer.consumer_id != first_id
    assert consumer.acks_failed == 0
