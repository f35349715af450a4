"""Whether this node still reaches the bus: the data path of every partition it leads
(docs/replication.md, "A leader cut from the bus").

A leader cut from NATS but not from etcd keeps its lease, hence its owner keys, while no
produce, fetch or claim request reaches it: without this watch its partitions stay
unavailable for as long as the cut lasts. So the node makes a bus round trip (a PING the
server answers, :meth:`danube.bus.Bus.flush`) every ``PROBE_INTERVAL_S``, and

- **lost**: no round trip succeeded for ``grace_s`` (the node lease's TTL: a leader cut
  from the bus gives way as soon as one cut from etcd would). Its leaders fence their
  partitions and delete their owner keys (compared on their epoch) so an in-sync follower
  claims; no replica of the node claims while lost.
- **fresh**: a round trip *sent* within ``FRESH_S`` succeeded. A leader shrinks its ISR
  only while fresh: followers that stopped fetching are its own silence as likely as
  theirs, and a leader that shrank its ISR to itself before resigning would leave no
  replica that may claim.

The nats-py client's own pings (``bus.ping_interval_s`` times ``bus.max_outstanding_pings``)
notice a silent server too, but only after 10-15 s with the defaults (5 s, 2). So once lost,
the watch also drops the connection as stale (``Bus.reconnect_stale``) after every failed
round trip: the client reconnects, to another server of a NATS cluster if one answers,
instead of waiting out its pings (and, once a cut heals, TCP's retransmission backoff).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Protocol

from danube.bus import NotConnectedError

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.25
"""A round trip starts this long after the last one ended."""
FRESH_S = 1.0
"""A round trip sent this recently that succeeded lets a leader shrink its ISR."""


class BusLink(Protocol):
    """What a round trip needs of the bus (danube.bus.Bus)."""

    @property
    def is_connected(self) -> bool: ...

    async def flush(self, timeout_s: float | None = None) -> None: ...


def round_trip(bus: BusLink) -> Callable[[float], Coroutine[object, object, None]]:
    """A PING answered by the server, as a probe for :class:`BusWatch`. nats-py's flush
    returns at once, without a round trip, while the client reconnects: it counts only if
    the bus was connected before and after it."""

    async def probe(timeout_s: float) -> None:
        if not bus.is_connected:
            raise NotConnectedError("the bus is reconnecting")
        await bus.flush(timeout_s)
        if not bus.is_connected:
            raise NotConnectedError("the bus dropped during the round trip")

    return probe


class BusWatch:
    """The node's view of its bus link, from round trips made by :meth:`run`."""

    def __init__(
        self,
        probe: Callable[[float], Awaitable[None]],
        *,
        grace_s: float,
        on_change: Callable[[bool], None] = lambda lost: None,
        reconnect: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe  # one round trip with a deadline (s); raises when it fails
        self.grace_s = grace_s
        self._on_change = on_change
        self._reconnect = reconnect  # drop the silent connection, try another server
        self._clock = clock
        now = clock()
        self._ok_at = now  # when the last successful round trip ended
        self._ok_sent_at = now  # when it was sent
        self._lost = False

    @property
    def lost(self) -> bool:
        """No round trip succeeded for ``grace_s``."""
        return self._clock() - self._ok_at > self.grace_s

    def fresh(self) -> bool:
        """A round trip sent within ``FRESH_S`` succeeded."""
        return self._clock() - self._ok_sent_at <= FRESH_S

    async def probe_once(self) -> bool:
        """One round trip (at most ``grace_s``); whether it succeeded. Tells ``on_change``
        when the link is lost or back."""
        sent = self._clock()
        try:
            await self._probe(self.grace_s)
            ok = True
        except Exception as exc:  # disconnected, timed out, closing: all count as failed
            log.debug("bus round trip failed: %s", exc)
            ok = False
        if ok:
            self._ok_at, self._ok_sent_at = self._clock(), sent
        self._report()
        if self.lost and self._reconnect is not None:
            try:
                await self._reconnect()
            except Exception as exc:  # closing, or reconnecting already
                log.debug("bus reconnect not started: %s", exc)
        return ok

    def _report(self) -> None:
        lost = self.lost
        if lost != self._lost:
            self._lost = lost
            if lost:
                log.warning(
                    "bus lost: no round trip for %.1f s; leaders here give way", self.grace_s
                )
            else:
                log.info("bus back: round trips answered again")
            self._on_change(lost)

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            await self.probe_once()
            await asyncio.sleep(PROBE_INTERVAL_S)
