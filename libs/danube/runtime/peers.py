"""What one client address may hold of a listener, and the count of what was refused.

A listener's global cap (``max_connections``) alone lets one client take all of it: a
client that opens 1 024 connections locks every other client out (issue 31). So each public
listener also caps what one client *address* holds at once — HTTP connections
(danube.runtime.listener), gRPC calls in progress (danube.runtime.grpc_limits) — and counts
every refusal in ``danube_listener_connections_refused_total{listener, reason}`` (or
``danube_listener_calls_refused_total`` for gRPC calls), ``reason`` one of :data:`REASONS`.

A client behind a proxy or a NAT has the proxy's address: raise the per-client limit to the
global one where many clients arrive from one address.
"""

from __future__ import annotations

import urllib.parse
from typing import Final

from prometheus_client import Counter

PER_CLIENT: Final = "per_client"
"""Refused: the client's address holds its limit already."""
MAX_CONNECTIONS: Final = "max_connections"
"""Refused: the listener holds its global limit already."""
REASONS = (PER_CLIENT, MAX_CONNECTIONS)

CONNECTIONS_REFUSED = Counter(
    "danube_listener_connections_refused",
    "Connections a listener closed as it accepted them, by listener and reason",
    ["listener", "reason"],
)
CALLS_REFUSED = Counter(
    "danube_listener_calls_refused",
    "gRPC calls refused with RESOURCE_EXHAUSTED before their handler, by listener and reason",
    ["listener", "reason"],
)


class PerClient:
    """How many of something (connections, calls) each client address holds on one listener,
    at most ``limit`` each. Not thread-safe: one event loop uses it."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a per-client limit is at least 1")
        self.limit = limit
        self._held: dict[str, int] = {}

    def acquire(self, address: str) -> bool:
        """Count one more for ``address``; ``False`` (nothing counted) if it holds its limit."""
        held = self._held.get(address, 0)
        if held >= self.limit:
            return False
        self._held[address] = held + 1
        return True

    def release(self, address: str) -> None:
        """Give back one that :meth:`acquire` counted."""
        held = self._held.get(address, 0) - 1
        if held > 0:
            self._held[address] = held
        else:
            # Gone at zero: the table holds only addresses with something open.
            self._held.pop(address, None)

    def held(self, address: str) -> int:
        """What ``address`` holds now."""
        return self._held.get(address, 0)

    def __len__(self) -> int:
        """Client addresses holding something now."""
        return len(self._held)


def address_of_peername(peername: object) -> str | None:
    """The client address of a socket's ``peername`` (``(host, port)``, or ``(host, port,
    flow, scope)`` for IPv6); ``None`` when there is none to count by (a Unix socket)."""
    if isinstance(peername, tuple) and peername and isinstance(peername[0], str):
        return peername[0]
    return None


def address_of_grpc_peer(peer: str) -> str | None:
    """The client address of a gRPC ``context.peer()``: ``ipv4:127.0.0.2:5000`` →
    ``127.0.0.2``, ``ipv6:[::1]:5000`` (brackets possibly %-encoded) → ``::1``; ``None``
    for a peer that is not an IP address (``unix:``)."""
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6") or not rest:
        return None
    host, _, _port = urllib.parse.unquote(rest).rpartition(":")
    return host.removeprefix("[").removesuffix("]") or None
