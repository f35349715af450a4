"""danube.runtime.listener.HeadWithBody: a response head with a length goes out with its
body in one write; a 100 Continue, a chunked head and a head with no body are not held."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from danube.runtime.listener import HeadWithBody

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


class Recording:
    """A transport that keeps what was written, call by call."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, data: Any) -> None:
        self.writes.append(b"".join(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def _held() -> tuple[HeadWithBody, Recording, list[str]]:
    transport = Recording()
    completed: list[str] = []
    held = HeadWithBody(cast(asyncio.Transport, transport), lambda: completed.append("done"))
    return held, transport, completed


def test_a_head_with_a_length_is_written_with_the_body() -> None:
    held, transport, completed = _held()
    held.write(HEAD)
    assert transport.writes == []
    held.write(b"{}")
    assert transport.writes == [HEAD + b"{}"]
    held.completed()
    assert transport.writes == [HEAD + b"{}"]
    assert completed == ["done"]


def test_a_large_body_is_written_in_the_same_call_without_a_join() -> None:
    held, transport, _ = _held()
    body = b"x" * (1 << 20)
    held.write(HEAD)
    held.write(body)
    assert transport.writes == [HEAD + body]


def test_continue_and_chunked_heads_go_at_once() -> None:
    held, transport, _ = _held()
    held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    held.write(chunked)
    held.write(b"2\r\n{}\r\n")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", chunked, b"2\r\n{}\r\n"]


def test_a_head_with_no_body_is_written_when_the_response_completes_or_closes() -> None:
    held, transport, completed = _held()
    held.write(HEAD)
    held.completed()  # a HEAD request: uvicorn writes no body
    assert transport.writes == [HEAD]
    assert completed == ["done"]
    held, transport, _ = _held()
    held.write(HEAD)
    held.close()
    assert transport.writes == [HEAD]
    assert transport.closed
    assert held.is_closing()  # everything else is the transport's
