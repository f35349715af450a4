"""The parts of the mesh's path that `make bench-peers` times alone (tests/bench/floor.py):
each makes the round trips it is asked for, one at a time, against real processes, and
leaves nothing behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from floor import bus_echo_server, bus_round_trips, fdatasync_latencies, http_round_trips

pytestmark = pytest.mark.integration

PAYLOAD = b"x" * 1024
COUNT = 25


async def test_bus_round_trips_go_to_the_echo_process(tmp_path: Path, nats_url: str) -> None:
    with bus_echo_server(tmp_path, nats_url):
        latencies = await bus_round_trips(nats_url, PAYLOAD, COUNT)
    assert len(latencies) == COUNT
    assert all(0 < seconds < 5 for seconds in latencies)


def test_fdatasync_appends_each_then_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sync.dat"
    latencies = fdatasync_latencies(path, PAYLOAD, COUNT)
    assert len(latencies) == COUNT
    assert all(seconds > 0 for seconds in latencies)
    assert not path.exists()
    path.write_bytes(b"")  # an existing file is refused (O_EXCL), not appended to
    with pytest.raises(FileExistsError):
        fdatasync_latencies(path, PAYLOAD, 1)
    assert path.read_bytes() == b""


class _Healthz:
    """A bare HTTP/1.1 server: answers each request with ``status``, keeps the connection."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.requests = 0
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while (await reader.readuntil(b"\r\n\r\n")).startswith(b"GET /healthz "):
                self.requests += 1
                writer.write(f"HTTP/1.1 {self.status} X\r\ncontent-length: 0\r\n\r\n".encode())
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()


async def test_http_round_trips_time_all_but_the_connecting_one() -> None:
    healthz = _Healthz(200)
    server = await asyncio.start_server(healthz.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        latencies = await http_round_trips(f"http://127.0.0.1:{port}", COUNT)
    assert len(latencies) == COUNT
    assert healthz.requests == COUNT + 1  # the first, untimed, opened the connection
    assert healthz.connections == 1  # kept alive: each timed one is a round trip, no connect


async def test_http_round_trips_refuse_an_unhealthy_answer() -> None:
    healthz = _Healthz(503)
    server = await asyncio.start_server(healthz.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        with pytest.raises(RuntimeError, match="answered 503"):
            await http_round_trips(f"http://127.0.0.1:{port}", COUNT)
