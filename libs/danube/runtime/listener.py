"""Limits on every HTTP listener of the mesh (discovery's API, each service's health port).

uvicorn bounds the idle time *between* requests (``timeout_keep_alive``), the size of a
request head (under h11 only) and, once a request head is complete, the requests in
progress (``limit_concurrency``, a 503). It has no deadline on the head itself:
a client that sends one header byte a second holds its connection, and a descriptor, for
ever, and a thousand of them exhaust the process (issue 14: discovery lost its etcd lease
that way). Neither h11 nor httptools has one either. So the protocols here add two:

- ``header_timeout_s``: a connection that has not sent a whole request head this long after
  it opened (or after its previous response) is closed;
- ``max_connections``: a connection past this many open ones is closed as it is accepted,
  before it costs more than the moment its descriptor lives;
- ``max_connections_per_client``: so is a connection from a client address that holds this
  many already (one client cannot take the whole listener: danube.runtime.peers). A
  connection upgraded to a WebSocket stays counted until it closes (the counted WebSocket
  protocol below takes its count over). Both refusals are counted in
  ``danube_listener_connections_refused_total{listener, reason}``.

Listeners parse HTTP with httptools (C; the pure-Python h11 cost discovery a large share of
its CPU per request: docs/performance.md). httptools has no bound on a request head's size
either (it buffers a header line until its end), so the protocol also answers uvicorn's 400
and closes a connection whose unfinished head is past ``HEAD_BYTES_MAX`` (what
``h11_max_incomplete_event_size`` did under h11).

And when ``accept()`` fails for lack of descriptors, :class:`AcceptBackoffLoop` stops
accepting on that socket for a second after one log line; CPython 3.11's own loop goes on
calling ``accept()`` up to ``backlog`` times in the same tick, logging each failure and
scheduling a restart for each (issue 14: 4 829 errors logged in 3 s).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from danube.config.model import ServiceConfig, TlsConfig
from danube.runtime.peers import (
    CONNECTIONS_REFUSED,
    MAX_CONNECTIONS,
    PER_CLIENT,
    PerClient,
    address_of_peername,
)
from danube.security.tls import ServerTls, with_transport_principal

log = logging.getLogger(__name__)

# A request head (request line and headers) larger than this is refused (uvicorn's h11 default).
HEAD_BYTES_MAX = 16 * 1024
ACCEPT_RETRY_S = 1.0
"""After an accept() out of descriptors (or memory), the socket is not read for this long."""
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on request heads, a bound on their size
    and caps on connections (all of them, and those of one client address).

    The class attributes are set per listener by :func:`uvicorn_limits`, ``per_client``
    shared with that listener's :class:`CountedWebSocketProtocol`."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024
    listener: str = "http"
    per_client: PerClient = PerClient(1024)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.app = with_transport_principal(self.app, transport)
        self._head_timer: asyncio.TimerHandle | None = None
        # Between the end of a request (or the connection's start) and the end of the next
        # head: the bytes received meanwhile, bounded by HEAD_BYTES_MAX.
        self._in_head = True
        self._head_bytes = 0
        # The address this connection is counted under in per_client, while it is.
        self._counted_as: str | None = None
        if len(self.connections) > self.max_connections:
            self._refuse(transport, MAX_CONNECTIONS)
            return
        address = address_of_peername(transport.get_extra_info("peername"))
        if address is not None:
            if not self.per_client.acquire(address):
                self._refuse(transport, PER_CLIENT)
                return
            self._counted_as = address
        self._arm_head_timer()

    def _refuse(self, transport: asyncio.Transport, reason: str) -> None:
        CONNECTIONS_REFUSED.labels(self.listener, reason).inc()
        transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        address = getattr(self, "_counted_as", None)
        if address is not None:
            self._counted_as = None
            self.per_client.release(address)

    def handle_websocket_upgrade(self) -> None:
        super().handle_websocket_upgrade()
        # The transport now belongs to the WebSocket protocol: this one hears no
        # connection_lost any more, so the connection's count goes over to it.
        protocol = self.transport.get_protocol()
        if isinstance(protocol, CountedWebSocketProtocol) and protocol.take_count(
            self.per_client, self._counted_as
        ):
            self._counted_as = None
        else:  # a protocol that would never give it back: uncounted rather than leaked
            self._uncount()

    def data_received(self, data: bytes) -> None:
        counted = self._in_head
        if counted:
            self._head_bytes += len(data)
        super().data_received(data)
        # Checked after parsing: a chunk that ends the head and carries body bytes is fine.
        too_large = counted and self._in_head and self._head_bytes > HEAD_BYTES_MAX
        if too_large and not self.transport.is_closing():
            self.send_400_response("Request head too large.")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()  # the head is in: the request runs under its own limits
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.transport, HeadWithBody):
            # The cycle's task has not run yet: its answer goes out through the wrapper,
            # which writes a held head at the latest when the response completes.
            held = HeadWithBody(cycle.transport, cycle.on_response)
            cycle.transport = held  # type: ignore[assignment]
            cycle.on_response = held.completed

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._in_head and not self.pipeline:
            self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self.transport.close()


class HeadWithBody:
    """The transport as one response of uvicorn's httptools protocol sees it: a response head
    that announces a ``content-length`` is held back and written with the body's first
    write, one ``send`` and one segment instead of two (uvicorn writes them apart: a
    wake-up of the client for a head it cannot use alone, a system call of ours).

    A head without a length (a chunked or streamed answer) goes at once, as a ``100
    Continue`` does; a head still held when the response completes without a body write (a
    ``HEAD`` request) or when the connection is closed is written first."""

    __slots__ = ("_head", "_on_response", "_started", "_transport")

    def __init__(self, transport: asyncio.Transport, on_response: Callable[[], None]) -> None:
        """``on_response``: the cycle's own completion callback, called by :meth:`completed`."""
        self._transport = transport
        self._on_response = on_response
        self._head: bytes | None = None
        self._started = False  # the response's head was written (or is held)

    def write(self, data: bytes) -> None:
        """Write ``data``, holding the response head as the class says."""
        if self._head is not None:
            head, self._head = self._head, None
            if len(data) <= _JOINED_BYTES_MAX:
                self._transport.write(head + data)
            else:  # not copied to be joined
                self._transport.writelines((head, data))
            return
        if not self._started and not data.startswith(_CONTINUE):
            self._started = True
            if _CONTENT_LENGTH in data:
                self._head = data
                return
        self._transport.write(data)

    def flush(self) -> None:
        """Write a held head now."""
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def completed(self) -> None:
        """The response is complete (the cycle's ``on_response``): a held head written."""
        self.flush()
        self._on_response()

    def close(self) -> None:
        """Close the connection, a held head written first."""
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


_CONTINUE = b"HTTP/1.1 100 "
_JOINED_BYTES_MAX = 64 * 1024
_CONTENT_LENGTH = b"\r\ncontent-length: "  # uvicorn writes header names in lower case


class CountedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (``ws="websockets-sansio"``) whose scopes carry the
    client certificate's principal, as the HTTP requests of the connection did, and which
    keeps the upgraded connection counted against its client address until it closes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.app = with_transport_principal(self.app, transport)
        self._count: tuple[PerClient, str] | None = None

    def take_count(self, per_client: PerClient, address: str | None) -> bool:
        """Hold the HTTP connection's count (``address`` in ``per_client``) until this
        protocol hears the connection closed; ``False`` if there is none to hold."""
        if address is None:
            return False
        self._count = (per_client, address)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        count, self._count = getattr(self, "_count", None), None
        if count is not None:
            count[0].release(count[1])
        super().connection_lost(exc)


def uvicorn_tls(config: TlsConfig) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` that serve TLS as ``config`` says (none when
    it is off); the certificate follows its files (danube.security.tls.ServerTls)."""
    if not config.enabled:
        return {}
    tls = ServerTls(config)  # loads the files now: a bad path fails the start, clearly
    return {"ssl_context_factory": lambda _config, _default: tls.context}


def uvicorn_limits(config: ServiceConfig, *, listener: str) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` that put ``config``'s limits on a listener
    (its HTTP and WebSocket protocols); ``listener`` names it in the refusal metric.

    Each call makes one listener's protocols: call it once per server."""
    per_client = min(config.max_connections_per_client, config.max_connections)
    protocol = type(
        "GuardedHttpToolsProtocol",
        (_GuardedHttpToolsProtocol,),
        {
            "header_timeout_s": config.header_timeout_s,
            "max_connections": config.max_connections,
            "listener": listener,
            "per_client": PerClient(per_client),
        },
    )
    return {
        "http": protocol,
        "ws": CountedWebSocketProtocol,
        "timeout_keep_alive": config.keep_alive_timeout_s,
        # Requests past this wait in the kernel's queue, not in ours.
        "backlog": min(2048, config.max_connections),
    }


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open descriptors to its hard limit (a default soft
    limit of 1024 is far below what a broker needs); return ``(soft, hard)`` after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft, hard  # e.g. an unlimited hard limit the kernel caps lower
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class AcceptBackoffLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop whose accept() backs off once per failure instead of spinning.

    Overrides one private method of CPython's ``BaseSelectorEventLoop`` (the same signature
    in 3.11 to 3.13): the loop that runs each time a listening socket is readable."""

    def _accept_connection(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *timeouts: Any,
    ) -> None:
        for _ in range(backlog):
            try:
                conn, addr = sock.accept()
                conn.setblocking(False)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # nothing more waiting
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise  # the loop logs it and goes on
                log.error(
                    "accept() failed (%s): not accepting on %s for %.1f s",
                    exc.strerror,
                    sock.getsockname(),
                    ACCEPT_RETRY_S,
                )
                # Linux keeps reporting the socket readable: stop reading it for a while.
                self._remove_reader(sock.fileno())  # type: ignore[attr-defined]
                self.call_later(
                    ACCEPT_RETRY_S,
                    self._start_serving,  # type: ignore[attr-defined]
                    protocol_factory,
                    sock,
                    sslcontext,
                    server,
                    backlog,
                    *timeouts,
                )
                return
            accept = self._accept_connection2(  # type: ignore[attr-defined]
                protocol_factory, conn, {"peername": addr}, sslcontext, server, *timeouts
            )
            self.create_task(accept)
