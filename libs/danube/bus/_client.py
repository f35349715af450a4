"""nats-py's client with fewer loop turns per request: what the bus connects with.

nats-py 2.16 hands every command to a flusher task and every received message to a task
per subscription. One request of a lone producer (docs/performance.md, "The front door's
hops") then costs, besides the server's work: a wake-up of the flusher to write it; on the
answer, a wake-up of the reply subscription's task, a callback of ``asyncio.wait_for`` and
only then the caller's own wake-up. On a loaded machine each wake-up is ~100 µs. Here:

- **Write-through.** A command written while nothing waits in the pending buffer, the
  connection is up and the socket's write buffer is empty goes straight to the transport
  (one ``send``), once per loop turn; the rest of the turn's commands go through the
  pending buffer and the flusher as before, so a burst is still written in one
  ``writelines``, order is kept (a command goes straight only when nothing is queued ahead
  of it), the pending limit and the flusher's ``drain`` still hold back a writer whose
  server does not read, and a command made while reconnecting is buffered as before.
- **Plain publishes written whole.** A publish with no reply and no headers whose subject
  the caller checked (:meth:`FastClient.publish_now`: the bus's plain publish, a live
  stream's) is one ``PUB`` command written through under the same conditions, without
  nats-py's checks, command building and coroutine layers; when it cannot go straight out
  the caller publishes the usual way.
- **Replies resolved where they are read.** The answer to :meth:`request_now` resolves its
  future in the read loop's own turn: no subscription task, no ``wait_for`` (the caller's
  deadline is its own ``asyncio.timeout``).
- **Requests started where they are read.** A message for a served subject
  (:meth:`serve_inline`) whose responder has a free slot, and behind which nothing waits in
  the subscription's queue, is handed to the responder in the read loop's turn instead of
  waking the subscription's task; otherwise it is queued as before (so arrival order and the
  bounded pending queue, the back-pressure of :mod:`danube.bus.rpc`, are unchanged).

- **A PONG for a flush that gave up.** nats-py keeps each PING's future in ``_pongs`` and
  sets the next one's result as a PONG comes, whether or not the flush that made it has
  timed out or been cancelled: the ``InvalidStateError`` then ends the read loop with
  only a log line, and the connection, still "connected", receives nothing more (a CI
  rolling restart saw an ingest node go deaf for 10 s while it handed over). Here a PONG
  still answers the oldest PING in order, and a future already done is let be.

These override private methods of nats-py 2.16.0 (pinned in pyproject.toml);
``tests/integration/test_bus_fast_path.py`` holds their behaviour.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Protocol

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.transport import TcpTransport

_NO_RESPONDERS_STATUS = "503"
_STATUS_HEADER = "Status"  # nats.js.api.Header.STATUS: how nats-py names an inline status


class InlineTarget(Protocol):
    """A responder that can take a message in the read loop's turn (danube.bus.rpc)."""

    def can_take_now(self) -> bool:
        """True when taking a message now would not wait (a handler slot is free)."""

    async def on_message(self, msg: Msg) -> None:
        """Take the message (see :class:`danube.bus.rpc.Responder`)."""


class FastClient(Client):
    """``nats.aio.client.Client`` with write-through, replies resolved in the read loop and
    requests started there (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._reply_sid: int | None = None
        self._reply_prefix_len = 0
        self._wrote_through = False  # in this loop turn
        self._inline: weakref.WeakValueDictionary[int, InlineTarget] = weakref.WeakValueDictionary()

    # --- reading --------------------------------------------------------------------------

    async def _process_pong(self) -> None:
        if self._pongs:
            future = self._pongs.pop(0)  # the oldest PING's, answered or not
            if not future.done():  # its flush may have timed out or been cancelled
                future.set_result(True)
            self._pongs_received += 1
            self._pings_outstanding = 0

    # --- writing --------------------------------------------------------------------------

    def _can_write_through(self) -> bool:
        if self._pending or self._wrote_through or self._status != Client.CONNECTED:
            return False
        transport = self._transport
        if not isinstance(transport, TcpTransport) or transport._io_writer is None:
            return False  # a WebSocket transport keeps nats-py's way
        return bool(transport._io_writer.transport.get_write_buffer_size() == 0)

    def _end_turn(self) -> None:
        self._wrote_through = False

    def publish_now(self, subject: bytes, payload: bytes) -> bool:
        """A plain ``PUB`` (no reply, no headers) of ``payload`` to ``subject`` (checked by
        the caller: a valid, concrete subject; ``payload`` within ``max_payload``) written
        through at once, as :meth:`_send_command` writes through; False when it cannot go
        that way now (something waits ahead of it, this turn wrote through already, the
        connection is not up): the caller publishes the usual way. A live stream's publish
        without nats-py's checks, command building and coroutine layers."""
        if not self._can_write_through():
            return False
        assert self._transport is not None
        self._wrote_through = True
        asyncio.get_running_loop().call_soon(self._end_turn)
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += len(payload)
        self._transport.write(b"PUB %b %d\r\n%b\r\n" % (subject, len(payload), payload))
        return True

    async def _send_command(self, cmd: bytes, priority: bool = False) -> None:
        if not priority and self._can_write_through():
            assert self._transport is not None
            self._wrote_through = True
            asyncio.get_running_loop().call_soon(self._end_turn)
            self._transport.write(cmd)
            return
        await super()._send_command(cmd, priority)

    async def _flush_pending(self, force_flush: bool = False) -> Any:
        if not force_flush and not self._pending:
            # Nothing queued (a command went straight out): no flusher to wake. The size
            # may count a PING nats-py wrote directly; nothing is pending, so it is 0.
            self._pending_data_size = 0
            return None
        return await super()._flush_pending(force_flush)

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        # nats-py writes a PING straight to the socket while commands may wait in the pending
        # buffer (a second command in a loop turn does): its PONG can then come back before
        # the server has seen them. A drain's flush is such a PING after its UNSUB: requests
        # the server still sends after the PONG are dropped unanswered when the drain stops
        # the subscription, and their callers wait out their whole deadline. The commands
        # queued before the PING go out before it.
        if self._pending and self._status == Client.CONNECTED and self._transport is not None:
            self._transport.writelines(self._pending)
            self._pending = []
            self._pending_data_size = 0
        await super()._send_ping(future)

    # --- requests -------------------------------------------------------------------------

    async def _init_request_sub(self) -> None:
        # nats-py's, keeping the subscription's id: its replies are resolved in _process_msg
        # (until the id is known, by nats-py's callback, as before).
        self._resp_map = {}
        prefix = self._inbox_prefix[:]
        prefix.extend(b".")
        prefix.extend(self._nuid.next())
        prefix.extend(b".")
        self._resp_sub_prefix = prefix
        self._reply_prefix_len = len(prefix)
        sub = await self.subscribe(prefix.decode() + "*", cb=self._request_sub_callback)
        self._reply_sid = sub._id

    async def request_now(
        self, subject: str, payload: bytes, headers: dict[str, str] | None
    ) -> Msg:
        """Publish a request and wait for its reply, with no deadline of its own (the caller
        sets one). Raises ``nats.errors.NoRespondersError`` as ``request`` does."""
        if self.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        if not self._resp_sub_prefix:
            await self._init_request_sub()
        assert self._resp_sub_prefix is not None
        token = self._nuid.next()  # unique per connection (nats-py adds random bytes; no need)
        key = token.decode()
        future: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._resp_map[key] = future
        try:
            inbox = (self._resp_sub_prefix + token).decode()
            await self.publish(subject, payload, reply=inbox, headers=headers)
            msg = await future
        finally:
            self._resp_map.pop(key, None)
        if msg.headers and msg.headers.get(_STATUS_HEADER) == _NO_RESPONDERS_STATUS:
            raise nats.errors.NoRespondersError
        return msg

    def serve_inline(self, sid: int, target: InlineTarget) -> None:
        """Hand the messages of subscription ``sid`` to ``target`` in the read loop's turn
        whenever it can take them at once (held weakly: it ends with its responder)."""
        self._inline[sid] = target

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        if sid == self._reply_sid:
            self.stats["in_msgs"] += 1
            self.stats["in_bytes"] += len(data)
            future = self._resp_map.get(subject[self._reply_prefix_len :].decode())
            if future is None or future.done():
                return  # its caller gave up
            hdr = await self._process_headers(headers)
            future.set_result(self._build_message(sid, subject, reply, data, hdr))
            return
        target = self._inline.get(sid)
        if target is not None:
            sub = self._subs.get(sid)
            if sub is not None and sub._pending_queue.empty() and target.can_take_now():
                self.stats["in_msgs"] += 1
                self.stats["in_bytes"] += len(data)
                sub._received += 1
                hdr = await self._process_headers(headers)
                try:
                    await target.on_message(self._build_message(sid, subject, reply, data, hdr))
                except Exception as exc:  # as nats-py's subscription task reports a callback's
                    await self._error_cb(exc)
                return
        await super()._process_msg(sid, subject, reply, data, headers)
