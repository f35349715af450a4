"""The values handlers and callers see: requests, replies and streamed messages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from danube.bus.protocol import monotonic_s


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply: raw ``body`` bytes and its ``headers`` (names starting ``Danube-`` are reserved)."""

    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Request:
    """A request as a handler sees it.

    ``deadline_s`` is when the caller gives up, on this host's monotonic clock (computed
    when the request arrived, from the timeout the caller sent): past it, nobody waits for
    the reply. A handler that calls further services passes ``timeout_s=request.remaining_s()``
    on, so the whole chain gives up together.
    """

    subject: str
    body: bytes
    headers: Mapping[str, str]
    deadline_s: float

    def remaining_s(self) -> float:
        """Seconds left until the deadline; zero or less once it has passed."""
        return self.deadline_s - monotonic_s()

    def expired(self) -> bool:
        """Whether the caller has already given up."""
        return self.remaining_s() <= 0


@dataclass(frozen=True, slots=True)
class Message:
    """A message received by :meth:`Bus.subscribe`: raw ``body`` bytes and its ``headers``."""

    subject: str
    body: bytes
    headers: Mapping[str, str]


Handler: TypeAlias = Callable[[Request], Awaitable[bytes | Reply]]
"""A request handler: returns the reply body (or a :class:`Reply`), or raises."""

MessageCallback: TypeAlias = Callable[[Message], Awaitable[None]]
"""A callback for streamed messages, called once per message, in order."""
