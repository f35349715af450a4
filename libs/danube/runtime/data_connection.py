"""One connection of a data door's listener (danube.runtime.data_listener, whose docstring
has the guards): its requests read with httptools' parser, answered in order by the door,
its deadlines looked at by the listener's sweep (:meth:`Connection.check`)."""

from __future__ import annotations

import asyncio
import collections
import http
import logging
import math
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, cast

import httptools

from danube.config.model import ServiceConfig
from danube.errors import BadRequestError, OverLimitError, UnavailableError
from danube.runtime.door import Answer
from danube.runtime.listener import HEAD_BYTES_MAX
from danube.runtime.peers import (
    CONNECTIONS_REFUSED,
    MAX_CONNECTIONS,
    PER_CLIENT,
    PerClient,
    address_of_peername,
)
from danube.security.tls import principal_of_peercert

log = logging.getLogger(__name__)

LINGER_S = 1.0
"""After a refusal that closes a connection, what the client still sends is read and dropped
this long before the socket closes."""


@dataclass(slots=True)
class DoorRequest:
    """One whole request: header names in lower case, the body as it came, the verified
    client certificate's principal (None without one), and the loop time by which it is to
    be answered (its head's arrival plus the door's timeout)."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    tls_principal: str | None
    deadline: float

    def header(self, name: bytes) -> str | None:
        """The first value of header ``name`` (lower case), None when absent."""
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None


DoorApp = Callable[[DoorRequest], Awaitable[Answer]]
"""A door's handling of a request: its answer (it raises nothing)."""
Refusal = Callable[[Exception], Answer]
"""The answer to a request the listener refuses itself (a head that does not parse, a body
too large or too slow): the door's own error answer, counted as its others are."""
TooLarge = Callable[[], Exception]
"""The error of a body past the bound (it names the setting)."""


@dataclass(frozen=True, slots=True)
class DoorLimits:
    """What a data listener allows: a body's bytes and the time from a request's head to
    its answer (the door's settings), and the service's listener limits."""

    body_bytes_max: int
    timeout_s: float
    max_inflight: int
    header_timeout_s: float
    keep_alive_timeout_s: float
    max_connections: int
    max_connections_per_client: int

    @classmethod
    def of(
        cls, config: ServiceConfig, body_bytes_max: int, timeout_s: float, max_inflight: int
    ) -> DoorLimits:
        """The limits of ``config``'s listeners with the door's own three."""
        return cls(
            body_bytes_max=body_bytes_max,
            timeout_s=timeout_s,
            max_inflight=max_inflight,
            header_timeout_s=config.header_timeout_s,
            keep_alive_timeout_s=config.keep_alive_timeout_s,
            max_connections=config.max_connections,
            max_connections_per_client=min(
                config.max_connections_per_client, config.max_connections
            ),
        )


class Owner(Protocol):
    """What a connection needs of its listener (danube.runtime.data_listener.DataListener)."""

    app: DoorApp
    refusal: Refusal
    too_large: TooLarge
    limits: DoorLimits
    listener: str  # its name in the refusal metric
    per_client: PerClient
    connections: set[Connection]
    inflight: int  # requests of all its connections from their heads to their answers

    def forget(self, connection: Connection) -> None:
        """``connection`` closed."""
        ...


class Connection(asyncio.Protocol):
    """One client connection of a listener."""

    def __init__(self, listener: Owner, loop: asyncio.AbstractEventLoop) -> None:
        self.listener = listener
        self.loop = loop
        self.limits = listener.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.counted_as: str | None = None  # the address counted in listener.per_client
        self.tls_principal: str | None = None
        # The request being read.
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.head_bytes = 0
        self.in_head = True  # no head under way is whole yet
        self.begun = False  # a byte of the next request came
        self.head_at = 0.0  # when the request's head became whole
        self.declared: int | None = None  # its Content-Length
        self.expects_continue = False
        # Whole requests waiting for their turn (pipelined), each with whether its
        # connection stays open after its answer.
        self.pending: collections.deque[tuple[DoorRequest, bool]] = collections.deque()
        self.running: asyncio.Task[None] | None = None
        # The deadline of the request being answered, and whether the sweep cancelled it
        # for being past it (then its answer is the timeout refusal).
        self.answer_by = math.inf
        self.overdue = False
        self.paused = False  # reading paused: a request waits its turn
        self.writable: asyncio.Future[None] | None = None  # set while writes are paused
        self.slot = False  # holds one of the listener's inflight (see on_headers_complete)
        self.refused = False  # a refusal was written: the rest is dropped
        self.stopping = False  # the listener stops: close after the answer under way
        # Since when this connection waits for what it waits for: the next head, a body,
        # or the end of a linger (see check).
        self.since = loop.time()

    # --- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's (the services' loop), whose classes are not asyncio's
        self.transport = transport = cast(asyncio.Transport, transport)
        listener = self.listener
        if len(listener.connections) >= self.limits.max_connections:
            self._turn_away(MAX_CONNECTIONS)
            return
        address = address_of_peername(transport.get_extra_info("peername"))
        if address is not None:
            if not listener.per_client.acquire(address):
                self._turn_away(PER_CLIENT)
                return
            self.counted_as = address
        listener.connections.add(self)
        if transport.get_extra_info("sslcontext") is not None:
            # The handshake is over when a protocol hears of its connection; only a
            # certificate the CA verified is reported.
            self.tls_principal = principal_of_peercert(transport.get_extra_info("peercert"))

    def _turn_away(self, reason: str) -> None:
        CONNECTIONS_REFUSED.labels(self.listener.listener, reason).inc()
        assert self.transport is not None
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._give_slot()
        self.listener.forget(self)
        if self.counted_as is not None:
            self.listener.per_client.release(self.counted_as)
            self.counted_as = None
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def pause_writing(self) -> None:
        if self.writable is None or self.writable.done():
            self.writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # lingering: read and dropped
        counted = self.in_head
        if counted:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # A request to switch protocols: answered as any other, then closed (nothing
            # after its head is HTTP).
            self.stopping = True
            self._pause()
        except httptools.HttpParserError as exc:
            self._refuse(BadRequestError(f"the request does not parse as HTTP/1.1: {exc}"))
            return
        if counted and self.in_head and self.head_bytes > HEAD_BYTES_MAX and not self.refused:
            self._refuse(BadRequestError(f"the request head is over {HEAD_BYTES_MAX} bytes"))

    def eof_received(self) -> bool | None:
        # The client sent all it will: the answers under way are still written (a client
        # may half-close after its last request), then the connection closes.
        if self.running is None and not self.pending:
            return None  # closed now
        self.stopping = True
        return True

    # --- httptools callbacks -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self.begun = True
        self.url = b""
        self.headers = []
        self.body = []
        self.body_bytes = 0
        self.declared = None
        self.expects_continue = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.headers.append((name, value))
        if name == b"content-length":
            self.declared = int(value) if value.isdigit() else None  # httptools checks it
        elif name == b"expect":
            self.expects_continue = value.lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.since = self.head_at = self.loop.time()
        if self.declared is not None and self.declared > self.limits.body_bytes_max:
            self._refuse(self.listener.too_large())
            return
        # A connection holds a slot of the listener's from a request's head (before any of
        # its body is kept) until it has none read, waiting or answered: what a listener
        # holds of bodies is bounded by max_inflight connections' worth (each at most the
        # request answered, one waiting its turn and what one read brought after it).
        if not self.slot:
            listener = self.listener
            if listener.inflight >= self.limits.max_inflight:
                self._refuse(OverLimitError("too many produce requests in flight; retry"))
                return
            listener.inflight += 1
            self.slot = True
        if self.expects_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self.refused:
            return
        self.body_bytes += len(body)
        if self.body_bytes > self.limits.body_bytes_max:
            self._refuse(self.listener.too_large())
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        raw_path, _, query = self.url.partition(b"?")
        path = raw_path.decode("latin-1")
        if "%" in path:  # decoded as every other listener of the mesh decodes it (uvicorn)
            path = urllib.parse.unquote(path)
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        request = DoorRequest(
            method=self.parser.get_method().decode("ascii"),
            path=path,
            query=query,
            headers=self.headers,
            body=body,
            tls_principal=self.tls_principal,
            deadline=self.head_at + self.limits.timeout_s,
        )
        self.body = []
        self.in_head = True
        self.begun = False
        self.head_bytes = 0
        keep_alive = self.parser.should_keep_alive() and not self.parser.should_upgrade()
        if self.running is None:
            self.running = self.loop.create_task(self._serve(request, keep_alive))
        else:
            self.pending.append((request, keep_alive))
            self._pause()  # one waits its turn: read no further until it has had it

    # --- answering ---------------------------------------------------------------------

    async def _serve(self, request: DoorRequest, keep_alive: bool) -> None:
        """Answer ``request``, then each pending one in turn."""
        try:
            while True:
                self.answer_by = request.deadline
                try:
                    answer = await self.listener.app(request)
                except asyncio.CancelledError:
                    if not self.overdue:
                        raise  # cut (a stop), not overdue
                    answer = self._timed_out()
                except Exception:  # a door answers its errors itself: this is a bug
                    log.exception("a data door failed on %s %s", request.method, request.path)
                    if self.transport is not None:
                        self.transport.abort()
                    return
                # Answered: nothing is cancelled while the answer waits for the client.
                self.answer_by = math.inf
                if self.overdue:  # the door caught the sweep's cancel and answered anyway
                    self._timed_out()
                if self.writable is not None:
                    await self.writable  # the client reads its answers again (or left)
                transport = self.transport
                if transport is None or transport.is_closing():
                    return
                keep_alive = keep_alive and not self.stopping
                transport.write(
                    encode_answer(answer, keep_alive, head_only=request.method == "HEAD")
                )
                if not keep_alive:
                    transport.close()
                    return
                if not self.pending:
                    break
                request, keep_alive = self.pending.popleft()
        finally:
            self.running = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.paused:
            self.paused = False
            transport.resume_reading()
        # Waiting for the next head, or for a body on its way (its client waited on us).
        self.since = self.loop.time()
        if self.in_head:
            self._give_slot()

    def _timed_out(self) -> Answer:
        """The answer of a request the sweep cancelled at its deadline."""
        self.overdue = False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # that cancel was this connection's, and it is handled
        return self.listener.refusal(
            TimeoutError(f"no answer within the door's {self.limits.timeout_s} s")
        )

    def _give_slot(self) -> None:
        if self.slot:
            self.slot = False
            self.listener.inflight -= 1

    def _pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def _refuse(self, exc: Exception) -> None:
        """Answer ``exc`` (after what is under way), drop what else comes, and close."""
        self.refused = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        answer = encode_answer(self.listener.refusal(exc), keep_alive=False, head_only=False)
        if self.running is not None:
            # Pipelined behind a request under way: its answer goes first.
            self.pending.clear()
            self.running.add_done_callback(lambda _: self._write_and_linger(answer))
            return
        self._write_and_linger(answer)

    def _write_and_linger(self, answer: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(answer)
        if self.paused:
            self.paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
        self.since = self.loop.time()  # closed by check() after LINGER_S

    # --- deadlines (DataListener's sweep) ------------------------------------------------

    def check(self, now: float) -> None:
        """Close (or refuse) this connection if what it waits for is overdue at ``now``."""
        transport = self.transport
        running = self.running
        if running is not None:
            # Answering: past its deadline the request is cancelled, and answered as timed
            # out (one sweep for every request: no timer of its own).
            if now >= self.answer_by and not self.overdue:
                self.overdue = True
                running.cancel()
            return
        if transport is None or transport.is_closing():
            return
        limits = self.limits
        waited = now - self.since
        if self.refused:
            if waited >= LINGER_S:
                transport.close()
        elif self.in_head:
            if self.begun:  # a head under way: it has header_timeout_s
                if waited >= limits.header_timeout_s:
                    transport.close()
            elif waited >= min(limits.keep_alive_timeout_s, limits.header_timeout_s):
                transport.close()  # idle
        elif waited >= limits.timeout_s:
            self._refuse(
                UnavailableError(
                    f"the body did not all come within {limits.timeout_s} s of its head",
                    code="timeout",
                )
            )

    # --- the listener stops ------------------------------------------------------------

    def shut_down(self) -> None:
        """Close when idle, else after the answer under way (later requests dropped)."""
        self.stopping = True
        self.pending.clear()
        if self.running is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Cut the connection and its request under way."""
        if self.running is not None:
            self.running.cancel()
        if self.transport is not None:
            self.transport.abort()


_PHRASES = {status.value: status.phrase.encode("ascii") for status in http.HTTPStatus}


def encode_answer(answer: Answer, keep_alive: bool, *, head_only: bool) -> bytes:
    """``answer`` as HTTP/1.1 bytes: one write of head and body."""
    status, body, media, headers = answer
    parts = [
        b"HTTP/1.1 %d %s\r\ncontent-length: %d\r\n"
        % (status, _PHRASES.get(status, b"Unknown"), len(body))
    ]
    if body:
        parts.append(b"content-type: %s\r\n" % media.encode("latin-1"))
    for name, value in (headers or {}).items():
        line = f"{name}: {value}\r\n".encode("latin-1")
        if line.count(b"\n") != 1 or line.count(b"\r") != 1:
            log.error("a data door's answer header %r has a line break: not sent", name)
            continue
        parts.append(line)
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    if not head_only:
        parts.append(body)
    return b"".join(parts)
