"""The SDK's lean HTTP/1.1 client (danube.wire.http1) against a fake server on loopback:
an answer that keeps the connection alive leaves it for the next request; one that says
``connection: close`` does not."""

from __future__ import annotations

import asyncio

from danube.wire.http1 import Http1Pool

_KEPT = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
_CLOSE = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"


async def _serve(answer: bytes, connections: list[int]) -> tuple[asyncio.Server, int]:
    """A server answering every request with ``answer``; ``connections`` counts accepts."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _three_posts(answer: bytes) -> tuple[list[bytes], int]:
    connections: list[int] = []
    server, port = await _serve(answer, connections)
    async with server:
        pool = Http1Pool(f"http://127.0.0.1:{port}", ssl_context=None, headers={})
        bodies = []
        for body in (b"a", b"bc", b"def"):
            got = await pool.request("POST", "/p", content_type="application/json", body=body)
            bodies.append(got.body)
        await pool.aclose()
    return bodies, len(connections)


async def test_a_kept_alive_answer_leaves_its_connection_for_the_next_request() -> None:
    # Before: the keep-alive flag was read after the parser had reset, so it was always
    # False and every request opened a new connection (three here).
    bodies, connections = await _three_posts(_KEPT)
    assert bodies == [b"ok"] * 3
    assert connections == 1


async def test_an_answer_that_says_close_is_not_reused() -> None:
    _, connections = await _three_posts(_CLOSE)
    assert connections == 3
