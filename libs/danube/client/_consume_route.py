"""Where a consumer's calls go (DESIGN §10, docs/client.md "Direct consume"): the consume
door of the dispatcher that owns its subscription, as its last attach named it, or the
server the client was given (discovery: the proxy path).

Attach always goes to discovery (it creates topics, checks policies, claims the
subscription); its answer's ``url`` names the owner's door. Polls, streams, acks, nacks and
the detach then go there. A door that fails the consumer — ``421 not_leader`` (the
subscription moved), no answer at all (its dispatcher died), 502-504, or 401 (it cannot
authenticate what discovery did) — is forgotten: the call is made again at once through
discovery with the same consumer id, which finds the subscription wherever it is now
(``consumer_not_found`` there attaches again, as it always did, and the new attach names
the new owner's door). Nothing is lost on the way: an ack
not answered is sent again, a message not acked comes again (at-least-once).

A door that did not answer at all is not used again for ``UNREACHABLE_S`` (the client may
not reach the nodes, e.g. from outside a compose network). ``ConsumerOptions.direct =
False`` never uses a door.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from danube.client._http import HttpCore
from danube.client.errors import ClientError, TransportError
from danube.client.retry import is_retriable

NOT_LEADER = "not_leader"
# Statuses of a door that is there but cannot serve: a proxy in front of it, a restart
# (502-504); 401: it cannot tell who the client is although discovery could (a client
# certificate the door's listener does not ask for, a key the door has not read yet).
_DOOR_FAILED_STATUSES = frozenset({401, 502, 503, 504})
UNREACHABLE_S = 30.0


def door_failed(error: ClientError) -> bool:
    """Whether ``error``, from a consume door, means: ask discovery instead."""
    if error.code == NOT_LEADER or isinstance(error, TransportError):
        return True
    return error.status in _DOOR_FAILED_STATUSES


def retry_on_door(error: ClientError) -> bool:
    """The retries of a call made on a door: not those that fall back to discovery."""
    return is_retriable(error) and not door_failed(error)


class ConsumeRoute:
    """One consumer's consume door (its connections), or none: the proxy path."""

    def __init__(
        self, proxy: HttpCore, *, enabled: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.proxy = proxy
        self.enabled = enabled
        self._clock = clock
        self._door: HttpCore | None = None
        self._url: str | None = None
        self._old: list[HttpCore] = []  # replaced doors: closed with the route
        self._unreachable: dict[str, float] = {}
        self.fallbacks = 0  # times a door failed and discovery was asked instead

    @property
    def http(self) -> HttpCore:
        """Where the next call goes."""
        return self._door or self.proxy

    @property
    def url(self) -> str | None:
        """The door in use, None on the proxy path."""
        return self._url

    def learn(self, url: str | None) -> None:
        """What an attach answered: the owner's door (None: none, the proxy path)."""
        if url is not None:
            url = url.rstrip("/")
        if not self.enabled or url is None or self._unreachable.get(url, 0.0) > self._clock():
            self._forget()
            return
        if url == self._url:
            return
        self._forget()
        self._door, self._url = self.proxy.sibling(url), url

    def fall_back(self, error: ClientError, used: HttpCore) -> bool:
        """Whether a call made through ``used`` failed because of the door: then the door
        is forgotten (not learned again for a while when it did not answer at all) and the
        caller makes the call again at once, through :attr:`http`."""
        if used is self.proxy or not door_failed(error):
            return False
        if used is self._door:
            if isinstance(error, TransportError) and self._url is not None:
                self._unreachable[self._url] = self._clock() + UNREACHABLE_S
            self._forget()
            self.fallbacks += 1
        return True

    def _forget(self) -> None:
        if self._door is not None:
            self._old.append(self._door)
        self._door = self._url = None

    async def aclose(self) -> None:
        """Close the doors' connections."""
        self._forget()
        old, self._old = self._old, []
        for core in old:
            await core.aclose()


def routed(http: HttpCore | ConsumeRoute) -> ConsumeRoute:
    """``http`` as a route: a bare core is the proxy path only."""
    return http if isinstance(http, ConsumeRoute) else ConsumeRoute(http, enabled=False)
