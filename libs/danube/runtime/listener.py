"""Limits on every HTTP listener of the mesh (discovery's API, each service's health port).

uvicorn bounds the idle time *between* requests (``timeout_keep_alive``), the size of a
request head (``h11_max_incomplete_event_size``) and, once a request head is complete, the
requests in progress (``limit_concurrency``, a 503). It has no deadline on the head itself:
a client that sends one header byte a second holds its connection, and a descriptor, for
ever, and a thousand of them exhaust the process (issue 14: discovery lost its etcd lease
that way). Neither h11 nor httptools has one either. So the protocol here adds two:

- ``header_timeout_s``: a connection that has not sent a whole request head this long after
  it opened (or after its previous response) is closed;
- ``max_connections``: a connection past this many open ones is closed as it is accepted,
  before it costs more than the moment its descriptor lives.

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
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from danube.config.model import ServiceConfig, TlsConfig
from danube.security.tls import ServerTls, with_transport_principal

log = logging.getLogger(__name__)

# A request head (request line and headers) larger than this is refused (uvicorn's default).
HEAD_BYTES_MAX = 16 * 1024
ACCEPT_RETRY_S = 1.0
"""After an accept() out of descriptors (or memory), the socket is not read for this long."""
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request heads and a cap on connections."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Over TLS, each request's scope carries the client certificate's principal.
        self.app = with_transport_principal(self.app, transport)
        self._head_timer: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            transport.abort()  # the descriptor goes now; the client sees a reset
            return
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_timer()  # the head is in: the request runs under its own limits

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
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
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class PrincipalWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol (``ws="websockets-sansio"``) whose scopes carry the
    client certificate's principal, as the HTTP requests of the connection did."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.app = with_transport_principal(self.app, transport)


def uvicorn_tls(config: TlsConfig) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` that serve TLS as ``config`` says (none when
    it is off); the certificate follows its files (danube.security.tls.ServerTls)."""
    if not config.enabled:
        return {}
    tls = ServerTls(config)  # loads the files now: a bad path fails the start, clearly
    return {"ssl_context_factory": lambda _config, _default: tls.context}


def uvicorn_limits(config: ServiceConfig) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.Config`` that put ``config``'s limits on a listener."""
    protocol = type(
        "GuardedH11Protocol",
        (_GuardedH11Protocol,),
        {"header_timeout_s": config.header_timeout_s, "max_connections": config.max_connections},
    )
    return {
        "http": protocol,
        "timeout_keep_alive": config.keep_alive_timeout_s,
        "h11_max_incomplete_event_size": HEAD_BYTES_MAX,
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
