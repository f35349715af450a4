"""The evidence a claimant takes that a dispatcher is gone (danube.runtime.liveness): a refused
connect, and nothing else. Real sockets on 127.0.0.1: a closed port refuses; a listener
accepts; a listener whose process never accepts (a frozen one: the kernel completes the
handshake into the backlog) is not gone either."""

from __future__ import annotations

import asyncio
import socket

import pytest

from danube.runtime.liveness import refuses_connections

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed: nothing listens there now


async def test_a_closed_port_refuses() -> None:
    assert await refuses_connections(f"http://127.0.0.1:{_closed_port()}")


async def test_a_serving_door_does_not() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        assert not await refuses_connections(f"https://127.0.0.1:{port}")


def test_a_listener_that_never_accepts_is_not_gone() -> None:
    with socket.socket() as frozen:  # listens; nobody calls accept (SIGSTOP)
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(8)
        port = frozen.getsockname()[1]
        assert not asyncio.run(refuses_connections(f"http://127.0.0.1:{port}"))


async def test_no_host_is_no_evidence() -> None:
    assert not await refuses_connections("not a url")
    assert not await refuses_connections("http://host-that-does-not-resolve.invalid:80")
