"""The listener of an ingest node's data door (DESIGN §10): HTTP/1.1 on httptools' parser
in an ``asyncio.Protocol``, handing each whole request to one coroutine, with no ASGI server
or framework between them.

Why not uvicorn, as every other listener: a produce sent one at a time spends most of its
time in Python on its way through the node, and uvicorn's share of it (a task, a
request-response cycle, ASGI messages and scope for every request) measured 16 % of the
produce's median and 31 % of its 99th percentile (docs/performance.md, "A data door
without uvicorn"). This listener serves one kind of request — a body posted and a short
answer — and keeps every guard the mesh's uvicorn listeners have (danube.runtime.listener):

- ``max_connections`` and ``max_connections_per_client``: a connection past either is
  closed as it is accepted, counted in ``danube_listener_connections_refused_total``;
- ``header_timeout_s``: a request head not whole this long after the connection opened or
  its previous answer was written closes the connection; ``keep_alive_timeout_s``: so does
  a connection that sends nothing that long between requests;
- a request head past ``HEAD_BYTES_MAX``, or that does not parse: 400, closed;
- ``max_inflight`` connections with a request from its head to its answer: the next
  request of another is 429 ``too_many_requests`` and closed before any of its body is
  kept (what the listener holds of bodies is bounded by that many connections' worth);
- a body past the door's bound (by ``Content-Length`` before it is read, or as it arrives
  chunked): 413, closed; a body not whole within the door's timeout after its head: 503,
  closed. A connection closed after a refusal reads (and drops) what its client still
  sends for ``LINGER_S`` first, so that the client reads the answer rather than a reset;
- a request the door has not answered by its deadline (its head's arrival plus the door's
  ``timeout_s``) is cancelled and answered 503 ``timeout`` (the door's own refusal of a
  ``TimeoutError``), by the same sweep: no timer per request (one was a tenth of an ingest
  node's Python time on a produce sent one at a time);
- ``Expect: 100-continue`` is answered when the head is accepted;
- requests on one connection are answered in order (pipelined ones wait their turn; the
  connection is not read while one waits), and no answer is written while the client does
  not read the previous ones (the transport's flow control);
- TLS as the service's ``tls`` section says, the verified client certificate's principal
  handed with each request;
- at a stop: no new connection; idle ones closed; each request in progress answered (then
  its connection closed) within the stop's time, the rest cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from danube.runtime.data_connection import (
    LINGER_S,
    Connection,
    DoorApp,
    DoorLimits,
    DoorRequest,
    Refusal,
    TooLarge,
)
from danube.runtime.door import DOOR_STOP_S
from danube.runtime.peers import PerClient
from danube.security.tls import ServerTls

__all__ = ["DataListener", "DoorApp", "DoorLimits", "DoorRequest", "Refusal", "TooLarge"]

SWEEP_MIN_S = 0.05
SWEEP_MAX_S = 1.0
"""How often a listener looks at its connections' deadlines (a quarter of its shortest
bound, within these): a deadline is kept to within this."""


class DataListener:
    """A door's listener: :meth:`start` binds it, :meth:`close` stops it."""

    def __init__(
        self,
        app: DoorApp,
        refusal: Refusal,
        too_large: TooLarge,
        limits: DoorLimits,
        *,
        listener: str = "data",
        tls: ServerTls | None = None,
    ) -> None:
        """``listener`` names it in the refusal metric; ``tls``: HTTPS with that context."""
        self.app = app
        self.refusal = refusal
        self.too_large = too_large
        self.limits = limits
        self.listener = listener
        self.tls = tls
        self.per_client = PerClient(limits.max_connections_per_client)
        self.connections: set[Connection] = set()
        self.inflight = 0  # connections with a request from its head to its answer
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        # Every connection's deadlines are looked at this often (a quarter of the shortest
        # bound): no timer per request.
        shortest = min(limits.header_timeout_s, limits.keep_alive_timeout_s, limits.timeout_s)
        self._sweep_s = max(SWEEP_MIN_S, min(SWEEP_MAX_S, shortest / 4, LINGER_S / 4))
        self._sweeping: asyncio.TimerHandle | None = None
        self._emptied: asyncio.Event | None = None  # while it stops: set when no connection is left

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in list(self.connections):
            connection.check(now)
        self._sweeping = loop.call_later(self._sweep_s, self._sweep)

    def forget(self, connection: Connection) -> None:
        """``connection`` closed."""
        self.connections.discard(connection)
        if self._emptied is not None and not self.connections:
            self._emptied.set()

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose for 0)."""
        if self._port is None:
            raise RuntimeError("the data listener has not listened")
        return self._port

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (OSError when it cannot)."""
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = self.tls.context if self.tls is not None else None
        self._server = await loop.create_server(
            lambda: Connection(self, loop),
            host,
            port,
            ssl=context,
            ssl_handshake_timeout=self.limits.header_timeout_s if context else None,
            backlog=min(2048, self.limits.max_connections),
            reuse_address=True,
        )
        self._port = self._server.sockets[0].getsockname()[1]
        self._sweeping = loop.call_later(self._sweep_s, self._sweep)

    async def close(self, stop_s: float = DOOR_STOP_S) -> None:
        """Stop accepting; close idle connections; let each request in progress be answered
        within ``stop_s`` (its connection closed after), then cut what is left."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.shut_down()
        self._emptied = asyncio.Event()
        if not self.connections:
            self._emptied.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._emptied.wait(), stop_s)
        for connection in list(self.connections):
            connection.abort()
        if self._sweeping is not None:
            self._sweeping.cancel()
        if self._server is not None:
            await self._server.wait_closed()
