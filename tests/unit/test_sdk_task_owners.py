"""What the failure of each background task of the SDK and the CLI does to its owner: the
producer's failed sender fails the batch it was sending and every queued message with its
error, a producer session's dead keep-alive loses the session, a consumer's dead ack sender
fails receive(), a stream's credit granter fails its consumer on a bug but not on a closed
socket, the bench's progress ticker stops with its run, `danube up` announces the mesh once
ready and nothing if stopped first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from danube.bench.app import _progress
from danube.bench.run import Meter
from danube.cli.up import _announce
from danube.client import AsyncDanubeClient, RetryPolicy
from danube.client._inbox import Inbox
from danube.client._sources import StreamSource
from danube.client.errors import ClientError, ClosedError
from danube.config import load_settings
from danube.up.mesh import plan_mesh

pytestmark = pytest.mark.unit

FAST = RetryPolicy(base_s=0.001, cap_s=0.004)
WAIT_S = 5.0
SESSION = "/v1/topics/default/t/producers"


class Bug(Exception):
    """What a bug raises: not one of the SDK's errors."""


def _client(handler: Any) -> AsyncDanubeClient:
    return AsyncDanubeClient(
        "http://danube.test", transport=httpx.MockTransport(handler), retry=FAST
    )


async def test_a_failed_sender_fails_every_queued_message_with_its_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    posted, release = asyncio.Event(), asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        posted.set()
        await release.wait()
        raise Bug("the transport broke")

    async with _client(handler) as client:
        producer = client.producer("t", idempotent=False)
        with caplog.at_level(logging.ERROR, logger="danube.tasks"):
            in_flight = await producer.send(b"in flight")
            await asyncio.wait_for(posted.wait(), WAIT_S)
            queued = [await producer.send(b"a"), await producer.send(b"b")]
            release.set()
            await asyncio.wait([in_flight, *queued], timeout=WAIT_S)
        sender = producer._sender
        assert sender is not None
        assert sender.done()
        error = sender.exception()
        assert isinstance(error, BaseExceptionGroup)
        assert error.subgroup(Bug) is not None
        assert [future.exception() for future in queued] == [error, error]
        # The batch the failure ended gets the failure itself, not silence.
        assert in_flight.done()
        assert isinstance(in_flight.exception(), Bug)
        assert any("task sender failed" in r.getMessage() for r in caplog.records)
        with pytest.raises(ClosedError):
            await producer.send(b"c")
        with pytest.raises(BaseExceptionGroup):
            await producer.close()  # the sender's error, as before


async def test_a_dead_keep_alive_loses_the_producer_session() -> None:
    produced = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal produced
        path = request.url.path
        if (request.method, path) == ("POST", SESSION):
            answer = {"producer_id": "p1", "access_mode": "exclusive", "session_ttl_ms": 150}
            return httpx.Response(201, json=answer)
        if path == f"{SESSION}/p1/keepalive":
            raise Bug("the keep-alive broke")
        if path == f"{SESSION}/p1":
            return httpx.Response(204)
        produced += 1
        return httpx.Response(200, json={"results": [{"partition": "/default/t", "offset": 0}]})

    async with _client(handler) as client:
        producer = client.producer("t", access_mode="exclusive", transport="json")
        async with producer:
            await producer.send_and_wait(b"held")
            async with asyncio.timeout(WAIT_S):
                while producer.session_error is None:  # noqa: ASYNC110 (no event to wait on)
                    await asyncio.sleep(0.01)
            assert "keep-alive failed" in str(producer.session_error)
            with pytest.raises(ClientError, match="keep-alive failed"):
                await producer.send_and_wait(b"outside the session")
        assert produced == 1


def _delivered(offset: int) -> dict[str, Any]:
    return {
        "partition": "/default/t",
        "offset": offset,
        "payload": "m",
        "publish_time_ms": 1,
        "producer": "p",
        "redelivery_count": 0,
    }


async def test_a_dead_ack_sender_fails_receive_once_the_queue_is_taken() -> None:
    polls = 0
    detached = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal polls
        path = request.url.path
        if path.endswith("/subscriptions/s/consumers"):
            return httpx.Response(201, json={"consumer_id": "c1"})
        if path == "/v1/consumers/c1/messages":
            polls += 1
            if polls > 1:
                await asyncio.sleep(0.05)  # a long poll that finds nothing
                return httpx.Response(200, json={"messages": []})
            return httpx.Response(200, json={"messages": [_delivered(0), _delivered(1)]})
        if path == "/v1/consumers/c1/ack":
            raise Bug("the ack sender broke")
        assert (request.method, path) == ("DELETE", "/v1/consumers/c1")
        detached.set()
        return httpx.Response(204)

    async with _client(handler) as client:
        consumer = client.consumer("t", "s", mode="poll", ack_interval_ms=0)
        async with consumer:
            first = await consumer.receive(timeout_s=WAIT_S)
            consumer.ack(first)
            # The queued message still comes; then the ack sender's failure, not a wait.
            assert (await consumer.receive(timeout_s=WAIT_S)).offset == 1
            with pytest.raises(BaseExceptionGroup) as failed:
                await consumer.receive(timeout_s=WAIT_S)
            assert failed.value.subgroup(Bug) is not None
        assert detached.is_set()  # closed as usual


class OneSocket:
    """A stream socket whose flow sends raise ``error``, and which closes when told."""

    close_code = 1000
    close_reason = ""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.sends = 0
        self.closed = asyncio.Event()

    async def send(self, text: str) -> None:
        self.sends += 1
        raise self.error

    def __aiter__(self) -> AsyncIterator[str]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[str]:
        await self.closed.wait()
        return
        yield  # an async generator that yields nothing


@pytest.mark.parametrize("closed_socket", [True, False])
async def test_a_credit_granter_fails_its_consumer_on_a_bug_only(closed_socket: bool) -> None:
    inbox = Inbox(4)
    source = StreamSource(None, inbox, None, None)  # type: ignore[arg-type]
    error = ConnectionClosed(None, None) if closed_socket else Bug("the granter broke")
    ws = OneSocket(error)
    serving = asyncio.create_task(source._serve(ws))  # type: ignore[arg-type]
    async with asyncio.timeout(WAIT_S):
        while ws.sends == 0:  # noqa: ASYNC110 (a fake socket's counter)
            await asyncio.sleep(0.01)
    await asyncio.sleep(0)  # the granter's end is handled
    assert inbox.failure is (None if closed_socket else error)
    ws.closed.set()
    async with asyncio.timeout(WAIT_S):
        await serving
    assert len(source._tasks) == 0


async def test_the_bench_progress_ticker_ends_with_its_run() -> None:
    def tickers() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t.get_name() == "ticker"]

    async with _progress("produce", Meter(total=10, duration_s=1.0)):
        await asyncio.sleep(0)
        assert len(tickers()) == 1
    assert tickers() == []


async def test_up_announces_the_mesh_once_ready_and_nothing_when_stopped_first(
    tmp_path: Path,
) -> None:
    plan = plan_mesh(load_settings(None, environ={}), data_dir=tmp_path, services=["ingest"])
    lines: list[str] = []
    printer = SimpleNamespace(line=lambda _, text: lines.append(text))
    supervisor, stop = SimpleNamespace(ready=asyncio.Event()), asyncio.Event()
    tasks_before = len(asyncio.all_tasks())

    stop.set()
    await asyncio.wait_for(_announce(supervisor, plan, printer, tmp_path, stop), WAIT_S)  # type: ignore[arg-type]
    assert lines == []

    stop.clear()
    announcing = asyncio.create_task(_announce(supervisor, plan, printer, tmp_path, stop))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert lines == []  # waits for the mesh
    supervisor.ready.set()
    await asyncio.wait_for(announcing, WAIT_S)
    assert lines[0].startswith(f"mesh ready: {len(plan.specs)} processes")
    assert len(asyncio.all_tasks()) == tasks_before  # its waits are gone
