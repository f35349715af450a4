"""The floor under one-message-at-a-time latency in Python on this machine: a server that does
nothing but what durability needs, to measure in the same run as the mesh and its peers.

``python floor.py serve <port> <file>``: a uvloop TCP server. Each request is
``[u32 length][payload]``; the server appends the payload to ``file`` in a writer thread
(one ``write`` and one ``fdatasync`` per batch of what queued meanwhile, as ingest's WAL
writer does), then answers ``[u64 offset]`` from the loop. No routing, no record format, no
checks, no metrics, no bus hop: what is left is one Python process with a loop and a
thread, the socket both ways and the disk. ``floor_latencies`` is its client, one request
at a time (closed loop, or at a rate).

The mesh's path has a floor of its own, whatever its services do: a produce crosses one HTTP
hop (client, discovery), one bus round trip (discovery, nats-server, ingest and back) and one
fdatasync. Each is timed here alone, one at a time, in the same run as the rest:
``http_round_trips`` (the SDK's HTTP/1.1 client, ``GET /healthz`` of a discovery),
``bus_round_trips`` (danube.bus between this process and ``python floor.py bus-echo``, an
echo responder in a process of its own) and ``fdatasync_latencies`` (a 1 KiB append and
fdatasync on the file system of the WAL).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from danube.bus import Bus, NoRespondersError, Reply, Request
from danube.config import BusConfig
from danube.up import ServerProcess, free_port
from danube.up.servers import ProcessSpec
from danube.wire.http1 import Http1Pool

_LENGTH = struct.Struct("<I")
_OFFSET = struct.Struct("<Q")
READY_TIMEOUT_S = 10.0


class _Writer:
    """One thread: write and fdatasync what queued, then answer each on the loop."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.loop = loop
        self.queue: queue.SimpleQueue[tuple[bytes, Callable[[int], None]]] = queue.SimpleQueue()
        self.offset = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            items = [self.queue.get()]
            while not self.queue.empty():
                items.append(self.queue.get())
            os.writev(self.fd, [payload for payload, _ in items])
            os.fdatasync(self.fd)
            first = self.offset
            self.offset += len(items)
            self.loop.call_soon_threadsafe(self._answer, first, [done for _, done in items])

    @staticmethod
    def _answer(first: int, answers: list[Callable[[int], None]]) -> None:
        for index, done in enumerate(answers):
            done(first + index)


class _Protocol(asyncio.Protocol):
    def __init__(self, writer: _Writer) -> None:
        self.writer = writer
        self.buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self.buffer)
            end = _LENGTH.size + length
            if len(self.buffer) < end:
                return
            payload = bytes(self.buffer[_LENGTH.size : end])
            del self.buffer[:end]
            self.writer.queue.put((payload, self._answered))

    def _answered(self, offset: int) -> None:
        self.transport.write(_OFFSET.pack(offset))


async def _serve(port: int, path: str) -> None:
    loop = asyncio.get_running_loop()
    writer = _Writer(path, loop)
    server = await loop.create_server(lambda: _Protocol(writer), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def floor_server(tmp: Path) -> ServerProcess:
    """The floor server on a free port, appending to a file in ``tmp`` (a context manager)."""
    port = free_port()
    argv = [sys.executable, __file__, "serve", str(port), str(tmp / "floor.log")]
    return ServerProcess(ProcessSpec("floor", argv, port), tmp / "floor.out")


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the floor server, once it listens (it is "ready once started")."""
    async with asyncio.timeout(READY_TIMEOUT_S):
        while True:
            try:
                return await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)


async def floor_latencies(port: int, payload: bytes, count: int, rate: float) -> list[float]:
    """``count`` requests one at a time, at ``rate`` a second (0: each right after the answer
    to the last); the seconds each took."""
    reader, writer = await _connect(port)
    request = _LENGTH.pack(len(payload)) + payload
    latencies: list[float] = []
    started = time.perf_counter()
    try:
        for index in range(count):
            if rate:
                delay = started + index / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            sent = time.perf_counter()
            writer.write(request)
            await reader.readexactly(_OFFSET.size)
            latencies.append(time.perf_counter() - sent)
    finally:
        writer.close()
        with contextlib.suppress(OSError):  # the measurement is taken; how it closes is not
            await writer.wait_closed()
    return latencies


# ---------------------------------------------------------------- the mesh's path ---

ECHO_SUBJECT = "floor.echo"


def _bus_config(nats_url: str) -> BusConfig:
    return BusConfig(servers=[nats_url], connect_timeout_s=READY_TIMEOUT_S)


async def _serve_bus_echo(nats_url: str) -> None:
    """Answer every request on ``ECHO_SUBJECT`` with 8 bytes, as ingest answers a produce."""
    bus = await Bus.connect(_bus_config(nats_url), name="floor-echo")

    async def echo(_request: Request) -> Reply:
        return Reply(_OFFSET.pack(0))

    await bus.serve(ECHO_SUBJECT, echo)
    await asyncio.Event().wait()


def bus_echo_server(tmp: Path, nats_url: str) -> ServerProcess:
    """The echo responder on ``nats_url``, a process of its own (a context manager)."""
    argv = [sys.executable, __file__, "bus-echo", nats_url]
    return ServerProcess(ProcessSpec("floor-bus-echo", argv), tmp / "floor-bus-echo.out")


async def bus_round_trips(nats_url: str, payload: bytes, count: int) -> list[float]:
    """``count`` requests to the echo responder, one at a time; the seconds each took."""
    bus = await Bus.connect(_bus_config(nats_url), name="floor-bus")
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while True:  # until the responder (started alongside) subscribed
                try:
                    await bus.request(ECHO_SUBJECT, payload, timeout_s=READY_TIMEOUT_S)
                    break
                except NoRespondersError:
                    await asyncio.sleep(0.05)
        latencies: list[float] = []
        for _ in range(count):
            sent = time.perf_counter()
            await bus.request(ECHO_SUBJECT, payload, timeout_s=READY_TIMEOUT_S)
            latencies.append(time.perf_counter() - sent)
    finally:
        await bus.close()
    return latencies


async def http_round_trips(url: str, count: int) -> list[float]:
    """``count`` ``GET /healthz`` of the discovery at ``url``, one at a time, through the
    SDK's HTTP/1.1 client (the one its producer posts with); the seconds each took."""
    pool = Http1Pool(url, ssl_context=None, headers={})
    latencies: list[float] = []
    try:
        for _ in range(count + 1):  # the first opens the connection: not timed
            sent = time.perf_counter()
            answer = await pool.request("GET", "/healthz", content_type="text/plain", body=b"")
            if answer.status != 200:
                raise RuntimeError(f"GET /healthz answered {answer.status}")
            latencies.append(time.perf_counter() - sent)
    finally:
        await pool.aclose()
    return latencies[1:]


def fdatasync_latencies(path: Path, payload: bytes, count: int) -> list[float]:
    """``count`` appends of ``payload``, each followed by fdatasync, to a new file at
    ``path`` (removed after); the seconds each took. Blocking: run it in a thread."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    latencies: list[float] = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, payload)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return latencies


if __name__ == "__main__":
    import uvloop

    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        uvloop.run(_serve(int(sys.argv[2]), sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "bus-echo":
        uvloop.run(_serve_bus_echo(sys.argv[2]))
    else:
        raise SystemExit("usage: floor.py serve <port> <file> | floor.py bus-echo <nats-url>")
