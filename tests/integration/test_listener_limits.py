"""The httptools listener's own limits on a real socket: a request head past HEAD_BYTES_MAX
is answered 400 and closed, a head slower than header_timeout_s is closed, a connection past
max_connections is closed at accept, and so is one past max_connections_per_client from one
client address (WebSocket connections counted until they close) while another address is
served, each refusal counted; and keep-alive requests are served one after another (a HEAD
request's answer, whose head is held for a body that never comes, among them)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import pytest
import uvicorn
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from danube.config.model import ServiceConfig
from danube.runtime.http import HealthServer, bound_port, wait_started
from danube.runtime.listener import HEAD_BYTES_MAX, uvicorn_limits
from danube.up import free_port

pytestmark = pytest.mark.integration

HEADER_TIMEOUT_S = 0.5


@pytest.fixture
async def port() -> AsyncIterator[int]:
    port = free_port()
    limits = ServiceConfig(header_timeout_s=HEADER_TIMEOUT_S, max_connections=3)
    server = HealthServer("127.0.0.1", port, lambda: True, limits)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
            await asyncio.sleep(0.01)
    yield port
    server.stop()
    await asyncio.wait_for(task, 5)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _oversized_head(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        filler = b"X-Filler: " + b"a" * 1000 + b"\r\n"
        try:
            for _ in range(HEAD_BYTES_MAX // len(filler) + 4):
                sock.sendall(filler)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _read_all(sock)


def _slow_head_closed_after_s(port: int) -> float:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _read_all(sock) == b""
        return time.monotonic() - started


def _keep_alive(port: int) -> bytes:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request * 2 + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return _read_all(sock)


async def test_a_head_past_the_bound_is_answered_400_and_closed(port: int) -> None:
    answer = await asyncio.to_thread(_oversized_head, port)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]


async def test_a_slow_head_is_closed_after_the_header_timeout(port: int) -> None:
    closed_after_s = await asyncio.to_thread(_slow_head_closed_after_s, port)
    assert HEADER_TIMEOUT_S * 0.9 <= closed_after_s < HEADER_TIMEOUT_S + 3


async def test_pipelined_keep_alive_requests_are_all_answered(port: int) -> None:
    answer = await asyncio.to_thread(_keep_alive, port)
    assert answer.count(b"HTTP/1.1 200 OK") == 3
    assert answer.count(b'{"status":"ok"}') == 3


def _head_then_get(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)  # the HEAD's answer alone: its head is not held for ever
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return first + b"|" + _read_all(sock)


async def test_a_head_requests_answer_is_written_though_it_has_no_body(port: int) -> None:
    answer = await asyncio.to_thread(_head_then_get, port)
    first, _, second = answer.partition(b"|")
    assert first.startswith(b"HTTP/1.1 "), first
    assert first.endswith(b"\r\n\r\n"), first
    assert b"content-length: " in first
    assert second.startswith(b"HTTP/1.1 200 OK"), second
    assert second.endswith(b'{"status":"ok"}'), second


async def test_connections_past_the_cap_are_closed_at_accept(port: int) -> None:
    held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        await asyncio.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port), timeout=5)
        with extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await asyncio.to_thread(_read_all, extra) == b""
    finally:
        for sock in held:
            sock.close()


def _refusals(listener: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "danube_listener_connections_refused_total", {"listener": listener, "reason": reason}
    )
    return value or 0.0


async def test_the_global_cap_counts_its_refusals(port: int) -> None:
    before = _refusals("health", "max_connections")
    await test_connections_past_the_cap_are_closed_at_accept(port)
    assert _refusals("health", "max_connections") - before == 1


PER_CLIENT = 2


async def _echo(websocket: WebSocket) -> None:
    await websocket.accept()
    async for text in websocket.iter_text():
        await websocket.send_text(text)


@pytest.fixture
async def ws_port() -> AsyncIterator[int]:
    """A listener with a WebSocket echo route, limited to PER_CLIENT connections per client
    address (and 3 in all, from the health server's own fixture above: higher here)."""
    app = Starlette(routes=[Route("/healthz", _ok), WebSocketRoute("/echo", _echo)])
    limits = ServiceConfig(max_connections_per_client=PER_CLIENT, keep_alive_timeout_s=60)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            **uvicorn_limits(limits, listener="per-client-test"),
        )
    )
    serving = asyncio.create_task(server.serve())
    await wait_started(server, serving, 10.0)
    yield bound_port(server)
    server.should_exit = True
    await asyncio.wait_for(serving, 5)


async def _ok(_: Request) -> Response:
    return PlainTextResponse("ok")


def _connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def _get(port: int, source: str) -> bytes:
    """One ``GET /healthz`` from ``source`` on a connection of its own: the answer, or b""
    when the connection was closed at accept."""
    with _connect(port, source) as sock:
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return b""
        return _read_all(sock)


def _websocket(port: int, source: str) -> ClientConnection:
    return ws_connect(f"ws://127.0.0.1:{port}/echo", sock=_connect(port, source))


def _per_client_scenario(port: int) -> list[str]:
    """Two WebSockets from 127.0.0.1 take its limit; what happens next, step by step."""
    steps: list[str] = []
    with _websocket(port, "127.0.0.1") as first, _websocket(port, "127.0.0.1") as second:
        first.send("a")
        second.send("b")
        steps.append(f"echo {first.recv(timeout=5)!s}{second.recv(timeout=5)!s}")
        steps.append(f"127.0.0.1 third: {_get(port, '127.0.0.1')[:15]!r}")
        steps.append(f"127.0.0.2: {_get(port, '127.0.0.2')[:15]!r}")
        first.close()
        # The closed WebSocket's count is given back (once the server has heard the close).
        deadline = time.monotonic() + 5
        while not (answer := _get(port, "127.0.0.1")) and time.monotonic() < deadline:
            time.sleep(0.05)
        steps.append(f"127.0.0.1 after a close: {answer[:15]!r}")
    return steps


async def test_one_client_address_is_limited_and_another_is_served(ws_port: int) -> None:
    before = _refusals("per-client-test", "per_client")
    steps = await asyncio.to_thread(_per_client_scenario, ws_port)
    assert steps == [
        "echo ab",
        "127.0.0.1 third: b''",
        "127.0.0.2: b'HTTP/1.1 200 OK'",
        "127.0.0.1 after a close: b'HTTP/1.1 200 OK'",
    ]
    assert _refusals("per-client-test", "per_client") - before >= 1
