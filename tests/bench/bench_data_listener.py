"""The data door's listener (danube.runtime.data_listener) against uvicorn (the mesh's other
listeners, with their guards: danube.runtime.http.AsgiServer), in one process on uvloop: a
client thread posts 1 KiB bodies one at a time on one kept-alive connection, each server
answers the same short JSON at once. Prints, per round, the median round trip and the
server loop's CPU per request (the client runs on another thread, not counted).

Run: ``.venv/bin/python tests/bench/bench_data_listener.py [--rounds 3] [--count 5000]``.
Not collected by pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time

import uvloop
from starlette.types import Receive, Scope, Send

from danube.config.model import ServiceConfig
from danube.runtime.data_listener import DataListener, DoorLimits, DoorRequest
from danube.runtime.door import Answer
from danube.runtime.http import AsgiServer

BODY = b"x" * 1024
ANSWER: Answer = (
    200,
    b'{"runs":[{"partition":"/default/t-part-0","offset":1,"count":1}],"partitions":1}',
    "application/json",
    None,
)
REQUEST = (
    b"POST /v1/topics/default/t-part-0/messages?producer_id=p HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    b"content-type: application/vnd.danube.records\r\ncontent-length: %d\r\n\r\n" % len(BODY)
) + BODY
WARM_UP = 500


async def door(_: DoorRequest) -> Answer:
    return ANSWER


async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    status, body, media, _ = ANSWER
    head = [(b"content-length", b"%d" % len(body)), (b"content-type", media.encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


def client(port: int, count: int) -> list[float]:
    """Round trips (s) of ``count`` requests after the warm-up."""
    times = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(WARM_UP + count):
            started = time.perf_counter()
            sock.sendall(REQUEST)
            answer = sock.recv(65536)
            while not answer.endswith(b"}"):
                answer += sock.recv(65536)
            times.append(time.perf_counter() - started)
    return times[WARM_UP:]


async def measure(kind: str, count: int) -> tuple[float, float]:
    """Median round trip and server CPU per request, both in µs."""
    config = ServiceConfig()
    if kind == "data listener":
        limits = DoorLimits.of(config, 16 << 20, 10.0, 256)
        listener = DataListener(door, lambda _: ANSWER, lambda: ValueError(), limits)
        await listener.start("127.0.0.1", 0)
        port = listener.port

        async def stop() -> None:
            await listener.close()

    else:
        server = AsgiServer(asgi, "127.0.0.1", 0, config, listener="bench")
        serving = asyncio.create_task(server.serve())
        await server.wait_started(serving, 5)
        port = server.port

        async def stop() -> None:
            server.stop()
            await serving

    cpu = time.thread_time()
    times = await asyncio.to_thread(client, port, count)
    cpu = time.thread_time() - cpu  # this thread: the server's loop
    await stop()
    return statistics.median(times) * 1e6, cpu / (WARM_UP + count) * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=5000)
    args = parser.parse_args()
    for round_ in range(1, args.rounds + 1):
        for kind in ("data listener", "uvicorn"):
            p50, cpu = await measure(kind, args.count)
            print(f"round {round_}: {kind:13s} p50 {p50:6.1f} µs, server CPU {cpu:6.1f} µs/request")


if __name__ == "__main__":
    uvloop.run(main())
