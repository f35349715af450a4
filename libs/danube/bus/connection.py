"""The NATS connection of one process: connect, publish, request, serve, subscribe, drain.

Every call that waits on the network has a deadline; every subscription has bounded pending
limits; nats-py's own exceptions never leave this module (they become :mod:`danube.bus.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import nats.errors
from nats.aio.client import _validate_subject
from nats.aio.subscription import Subscription as NatsSubscription

from danube import trace
from danube.bus import _commands
from danube.bus._client import FastClient
from danube.bus.errors import (
    BusError,
    BusTimeoutError,
    InvalidSubjectError,
    NoRespondersError,
    NotConnectedError,
    PayloadTooLargeError,
)
from danube.bus.messages import Handler, MessageCallback, Reply
from danube.bus.permissions import inbox_prefix
from danube.bus.protocol import (
    TIMEOUT_HEADER,
    check_timeout,
    check_user_headers,
    encode_timeout,
    headers_size_bytes,
    remote_error,
)
from danube.bus.rpc import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_SERVE_PENDING_BYTES,
    DEFAULT_SERVE_PENDING_MSGS,
    DropCounter,
    Responder,
)
from danube.bus.subjects import Subjects
from danube.bus.subscription import (
    DEFAULT_SUBSCRIBE_PENDING_BYTES,
    DEFAULT_SUBSCRIBE_PENDING_MSGS,
    Subscription,
    adapt_callback,
)
from danube.config.model import BusConfig
from danube.config.secrets import read_password

logger = logging.getLogger(__name__)

_CLOSE_GRACE_S = 2.0  # for closing the socket once draining is over or has run out of time


class Bus:
    """A connection to the NATS bus; make one with :meth:`connect`, end it with :meth:`close`.

    ``async with await Bus.connect(config, name="ingest") as bus: ...`` closes on the way out.
    """

    def __init__(self, nc: FastClient, config: BusConfig, name: str) -> None:
        """Wrap an unconnected client; use :meth:`connect` rather than this."""
        self._nc = nc
        self.config = config
        self.name = name
        self.subjects = Subjects(config.subject_prefix)
        self._closing = False
        self.reconnects = 0  # connections re-established after a loss (another server, often)
        self._responders: weakref.WeakSet[Responder] = weakref.WeakSet()
        # By id() of the NATS subscription. Weak values, not weak keys: each counter holds
        # its subscription, so a weak-key entry would keep both alive for good (one leaked
        # responder or subscription per bus subscription ever made). The counter lives while
        # its owner holds it or NATS still delivers to it; the id is unique while it lives.
        self._counters: weakref.WeakValueDictionary[int, DropCounter] = (
            weakref.WeakValueDictionary()
        )

    @classmethod
    async def connect(cls, config: BusConfig, *, name: str, timeout_s: float | None = None) -> Bus:
        """Connect to ``config.servers``; raise NotConnectedError if that fails within the deadline.

        ``timeout_s`` (default ``config.connect_timeout_s``) bounds the whole first connect, all
        servers and retries included. Once connected, a lost connection is re-established in
        the background (``reconnect_wait_s`` apart, ``max_reconnect_attempts`` times, -1 for
        ever); publishes made meanwhile are buffered up to nats-py's pending size.
        """
        _commands.install()  # every publish's command built with one copy of its payload
        bus = cls(FastClient(), config, name)
        deadline_s = config.connect_timeout_s if timeout_s is None else timeout_s
        # nats-py annotates these durations as int but uses them as float seconds; passing
        # them through an Any-typed mapping keeps sub-second settings without a type error.
        options: dict[str, Any] = {
            "servers": list(config.servers),
            "name": name,
            "connect_timeout": config.connect_timeout_s,
            "reconnect_time_wait": config.reconnect_wait_s,
            "max_reconnect_attempts": config.max_reconnect_attempts,
            "ping_interval": config.ping_interval_s,
            "max_outstanding_pings": config.max_outstanding_pings,
            "pending_size": config.reconnect_buffer_bytes,
            "drain_timeout": config.drain_timeout_s,
            "allow_reconnect": True,
            "error_cb": bus._on_error,
            "disconnected_cb": bus._on_disconnected,
            "reconnected_cb": bus._on_reconnected,
            "closed_cb": bus._on_closed,
            "lame_duck_mode_cb": bus._on_lame_duck,
        }
        if config.user is not None:
            # The password goes to nats-py only; the per-user inbox keeps replies private
            # (danube.bus.permissions: only this user may subscribe to it).
            options["user"] = config.user
            options["password"] = read_password(config.password, config.password_file, key="bus")
            options["inbox_prefix"] = inbox_prefix(config.user)
        servers = [_redacted(url) for url in config.servers]
        try:
            async with asyncio.timeout(deadline_s):
                await bus._nc.connect(**options)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            bus._closing = True
            with contextlib.suppress(Exception):  # best effort: the connection never came up
                async with asyncio.timeout(_CLOSE_GRACE_S):
                    await bus._nc.close()
            raise NotConnectedError(
                f"cannot connect to {servers} within {deadline_s} s: {_describe(exc)}"
            ) from exc
        logger.info("bus %s: connected to %s", name, _url(bus._nc))
        return bus

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def is_connected(self) -> bool:
        """True while connected and not closing (the readiness check of a service)."""
        return self._nc.is_connected and not self._closing

    async def reconnect_stale(self) -> None:
        """Treat the connection as stale now: drop it and reconnect (to another server of
        a cluster first), as nats-py does itself once ``max_outstanding_pings`` pings went
        unanswered, which takes ``ping_interval_s`` times that many plus one (10-15 s by
        default). For a caller that knows sooner: round trips unanswered for its own grace
        (danube.ingest.buswatch). Subscriptions are made again on the new connection."""
        if self._closing or not self._nc.is_connected:
            return
        logger.warning("bus %s: no answer from %s; reconnecting", self.name, _url(self._nc))
        # nats-py has no public call for this; its ping timer calls the same.
        await self._nc._process_op_err(nats.errors.StaleConnectionError())

    @property
    def max_payload_bytes(self) -> int:
        """The server's limit on one message, headers included."""
        return self._nc.max_payload

    async def publish(
        self, subject: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Publish ``body`` (raw bytes) to ``subject``; at most once, no reply expected."""
        if not headers and trace.current() is None:
            # A plain publish (a live stream's): its subject checked once, written through
            # when nothing waits ahead of it.
            raw = _plain_subject(subject)
            self._check_size(body, None)
            if not self._nc.publish_now(raw, body):
                await self._publish(subject, body, None)
            return
        sent = check_user_headers(headers)
        sent.update(trace.bus_headers())  # the request being served, if any (danube.trace)
        await self._publish(subject, body, sent or None)

    async def request(
        self,
        subject: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """Send a request and wait for its reply, at most ``timeout_s`` (default from config).

        The timeout travels in the ``Danube-Timeout-Ms`` header (relative: the responder
        starts its deadline on its own clock, so clock skew does not matter), the trace id
        of the request being served in ``Danube-Trace-Id``. Raises
        BusTimeoutError, NoRespondersError (at once, from the server), RemoteError for an
        error the handler raised, NotConnectedError or PayloadTooLargeError.
        """
        timeout_s = check_timeout(self.config.request_timeout_s if timeout_s is None else timeout_s)
        sent = check_user_headers(headers)
        sent[TIMEOUT_HEADER] = encode_timeout(timeout_s)
        sent.update(trace.bus_headers())
        _check_concrete(subject)
        self._check_size(body, sent)
        try:
            async with asyncio.timeout(timeout_s):
                # The reply resolves its future in the read loop's turn (danube.bus._client).
                msg = await self._nc.request_now(subject, body, sent)
        except nats.errors.NoRespondersError as exc:
            raise NoRespondersError(subject) from exc
        except TimeoutError as exc:  # nats-py's TimeoutError is a subclass
            raise BusTimeoutError(subject, timeout_s) from exc
        except nats.errors.Error as exc:
            raise _translate(exc, subject) from exc
        received: Mapping[str, str] = msg.headers or {}
        error = remote_error(received, subject=subject)
        if error is not None:
            raise error
        return Reply(body=msg.data, headers=received)

    async def serve(
        self,
        subject: str,
        handler: Handler,
        *,
        queue: str | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        pending_msgs_limit: int = DEFAULT_SERVE_PENDING_MSGS,
        pending_bytes_limit: int = DEFAULT_SERVE_PENDING_BYTES,
    ) -> Responder:
        """Answer requests on ``subject`` (wildcards allowed) with ``handler``.

        At most ``max_concurrency`` handlers run at once; the rest wait in the pending queue
        (``pending_*_limit``), beyond which NATS drops requests (see :mod:`danube.bus.rpc`).
        Members of the same ``queue`` group share the requests, each going to one of them. The
        subscription is known to the server when this returns.
        """
        responder = Responder(
            subject=subject,
            handler=handler,
            max_concurrency=max_concurrency,
            default_timeout_s=self.config.request_timeout_s,
            publish_timeout_s=self.config.request_timeout_s,
            max_payload_bytes=lambda: self._nc.max_payload,
            publish=self._publish,
            drain_timeout_s=self.config.drain_timeout_s,
        )
        sub = await self._subscribe(
            subject, queue, responder.on_message, pending_msgs_limit, pending_bytes_limit
        )
        responder.attach(sub)
        self._nc.serve_inline(sub._id, responder)  # a request taken in the read loop's turn
        self._counters[id(sub)] = responder
        self._responders.add(responder)
        await self.flush()
        return responder

    async def subscribe(
        self,
        subject: str,
        callback: MessageCallback | None = None,
        *,
        queue: str | None = None,
        pending_msgs_limit: int = DEFAULT_SUBSCRIBE_PENDING_MSGS,
        pending_bytes_limit: int = DEFAULT_SUBSCRIBE_PENDING_BYTES,
    ) -> Subscription:
        """Receive the messages published to ``subject`` (wildcards allowed), in order.

        With ``callback``, each message is passed to it, one at a time; without, iterate the
        returned :class:`Subscription`. A full pending queue drops new messages (counted). The
        subscription is known to the server when this returns.
        """
        cb = None if callback is None else adapt_callback(subject, callback)
        sub = await self._subscribe(subject, queue, cb, pending_msgs_limit, pending_bytes_limit)
        subscription = Subscription(subject, sub, has_callback=callback is not None)
        self._counters[id(sub)] = subscription
        await self.flush()
        return subscription

    async def flush(self, timeout_s: float | None = None) -> None:
        """Round trip to the server: everything sent before has been processed by it."""
        timeout_s = check_timeout(self.config.request_timeout_s if timeout_s is None else timeout_s)
        try:
            async with asyncio.timeout(timeout_s):
                # nats-py 2.16 writes flush()'s PING straight to the socket while SUB and PUB
                # commands wait in its pending buffer for the flusher task, so the PONG can come
                # back before the server has seen them. Pushing the buffer out first restores
                # the barrier (without it, a request right after serve() could find no
                # responders).
                await self._nc._flush_pending(force_flush=True)
                await self._nc.flush(timeout=math.ceil(timeout_s))
        except TimeoutError as exc:
            raise BusTimeoutError("(flush)", timeout_s) from exc
        except nats.errors.Error as exc:
            raise _translate(exc, "(flush)") from exc

    async def close(self) -> None:
        """Drain, then close: answer the requests already taken, flush publishes, disconnect.

        Served subjects stop taking requests first and their running handlers finish and
        reply; then the other subscriptions drain and pending publishes are flushed. The whole
        drain is bounded by ``config.drain_timeout_s``; handlers still running then are
        cancelled. Calling it again is a no-op.
        """
        if self._closing:
            return
        self._closing = True
        responders = list(self._responders)
        try:
            async with asyncio.timeout(self.config.drain_timeout_s):
                await asyncio.gather(*(r.drain() for r in responders))
                if self._nc.is_connected:  # nats-py can only drain a live connection
                    await self._nc.drain()
        except TimeoutError:
            logger.warning("bus %s: drain took over %s s", self.name, self.config.drain_timeout_s)
        except nats.errors.Error as exc:
            logger.warning("bus %s: drain failed: %r", self.name, exc)
        finally:
            for responder in responders:
                responder.cancel()
            if not self._nc.is_closed:
                with contextlib.suppress(TimeoutError, nats.errors.Error):
                    async with asyncio.timeout(_CLOSE_GRACE_S):
                        await self._nc.close()

    # --- internals ---------------------------------------------------------------------

    async def _publish(self, subject: str, body: bytes, headers: Mapping[str, str] | None) -> None:
        _check_concrete(subject)
        self._check_size(body, headers)
        timeout_s = self.config.request_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                await self._nc.publish(subject, body, headers=dict(headers) if headers else None)
        except TimeoutError as exc:
            raise BusTimeoutError(subject, timeout_s) from exc
        except nats.errors.Error as exc:
            raise _translate(exc, subject) from exc

    async def _subscribe(
        self,
        subject: str,
        queue: str | None,
        cb: Any,
        pending_msgs_limit: int,
        pending_bytes_limit: int,
    ) -> NatsSubscription:
        if self._closing:
            raise NotConnectedError(f"bus {self.name} is closing; cannot subscribe to {subject!r}")
        if pending_msgs_limit < 1 or pending_bytes_limit < 1:
            raise BusError("pending limits must be at least 1 (a queue is always bounded)")
        try:
            return await self._nc.subscribe(
                subject,
                queue=queue or "",
                cb=cb,
                pending_msgs_limit=pending_msgs_limit,
                pending_bytes_limit=pending_bytes_limit,
            )
        except nats.errors.Error as exc:
            raise _translate(exc, subject) from exc

    def _check_size(self, body: bytes, headers: Mapping[str, str] | None) -> None:
        # The server closes a connection that sends an oversize message: refuse it here.
        size = len(body) + headers_size_bytes(headers)
        if size > self._nc.max_payload:
            raise PayloadTooLargeError(size_bytes=size, limit_bytes=self._nc.max_payload)

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            counter = self._counters.get(id(exc.sub))
            if counter is not None:
                counter.note_dropped()
                return
        logger.warning("bus %s: %r", self.name, exc)

    async def _on_disconnected(self) -> None:
        if self._closing:
            logger.info("bus %s: disconnected", self.name)
        else:
            logger.warning("bus %s: disconnected; reconnecting", self.name)

    async def _on_reconnected(self) -> None:
        self.reconnects += 1
        logger.info("bus %s: reconnected to %s", self.name, _url(self._nc))

    async def _on_closed(self) -> None:
        logger.info("bus %s: closed", self.name)

    async def _on_lame_duck(self) -> None:
        logger.warning("bus %s: server %s is shutting down (lame duck)", self.name, _url(self._nc))


def _url(nc: FastClient) -> str:
    url = nc.connected_url
    if url is None:
        return "?"
    return f"{url.hostname}:{url.port}"  # never the netloc: it may carry user:password@


def _redacted(server: str) -> str:
    """A server URL fit for a message: any ``user:password@`` replaced."""
    scheme, sep, rest = server.rpartition("://")
    _, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if at else ''}{host}"


def _describe(exc: BaseException) -> str:
    """What went wrong at connect, worded for an operator (nats-py's own text never holds
    the password: it reports the server's 'Authorization Violation')."""
    if isinstance(exc, nats.errors.AuthorizationError) or "authorization" in str(exc).lower():
        return "the server refused the credentials (authorization violation)"
    return repr(exc)


@functools.lru_cache(maxsize=4096)
def _plain_subject(subject: str) -> bytes:
    """``subject`` as a plain publish writes it, once checked: concrete, and nats-py's own
    check of a publish's subject (``_validate_subject``, which the plain publish skips); a
    bad one raises (not remembered)."""
    _check_concrete(subject)
    try:
        _validate_subject(subject)
    except nats.errors.BadSubjectError:
        raise InvalidSubjectError(subject, "not a valid NATS subject") from None
    return subject.encode()


def _check_concrete(subject: str) -> None:
    # The server silently ignores a publish to a wildcard; make that a loud error instead.
    tokens = subject.split(".")
    if not subject or any(t in ("", "*", ">") for t in tokens):
        raise InvalidSubjectError(subject, "publish and request need a concrete subject")


def _translate(exc: nats.errors.Error, subject: str) -> BusError:
    """Turn a nats-py error into the bus's own (the caller chains it with ``from``)."""
    if isinstance(exc, nats.errors.NoRespondersError):
        return NoRespondersError(subject)
    if isinstance(exc, nats.errors.BadSubjectError):
        return InvalidSubjectError(subject, "not a valid NATS subject")
    if isinstance(
        exc,
        nats.errors.ConnectionClosedError
        | nats.errors.ConnectionDrainingError
        | nats.errors.ConnectionReconnectingError
        | nats.errors.OutboundBufferLimitError
        | nats.errors.StaleConnectionError
        | nats.errors.NoServersError,
    ):
        return NotConnectedError(f"bus unavailable for {subject!r}: {exc}")
    return BusError(f"nats error on {subject!r}: {exc}")
