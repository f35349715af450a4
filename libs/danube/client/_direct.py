"""Where a producer's parts go (DESIGN §10, docs/client.md "Direct produce"): the data door
of each partition's leader as the last lookup named it, or the server the client was given
(discovery: the proxy path) when none is known.

A lookup (``GET /v1/lookup``) names each partition's leader's ``url``; the producer posts a
partition's part there. A leader that does not lead it any more answers ``421
not_leader``; a door that does not answer (the leader died) is a transport error; both
make the producer forget that door, look the topic up again and send the part at once to
the leader it names (an idempotent producer's resend is stored once). A partition with no
known door goes the proxy path. ``ClientOptions.direct = False`` (a client that reaches
only one address) never learns a door.

Here: the doors a lookup names (:func:`lookup_doors`, :class:`DataDoors`), a part posted to
one (:func:`post_to_door`), and what a door's failure says (:func:`moved`,
:func:`unanswered`); the idempotent producer (danube.client._idempotent) decides with them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence

from danube.client._http import Answer, HttpCore
from danube.client._records import RECORDS_TYPE
from danube.client.errors import ApiError, ClientError, ProtocolError, TransportError
from danube.client.retry import retrying
from danube.names import TopicName

NOT_LEADER = "not_leader"

# One attempt at a data door waits this long at most: a leader frozen (not dead: its socket
# takes the request and says nothing) costs this, then the lookup and the proxy path,
# which waits for the next leader; a leader that is only slow answers the resend as a
# duplicate.
DOOR_ATTEMPT_S = 3.0

# A door that did not answer at all (refused, unresolvable, a certificate refused: the
# client cannot reach the nodes, e.g. from outside a compose network) is not tried again
# for this long; its partitions go the proxy path meanwhile. Sooner when a lookup names it
# for a partition under a newer leader epoch than it had then: its node took a partition's
# lead since, so it is up (a node restarted on the same address).
UNREACHABLE_S = 30.0

# Distinct data doors a producer keeps connections to at most (a topic's leaders: a few
# nodes); past it the oldest is closed when a new one is learned.
DOORS_MAX = 64


class DataDoors:
    """The data doors of one topic's partitions, and a connection pool per door."""

    def __init__(
        self,
        http: HttpCore,
        *,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self._clock = clock
        self._http = http
        self._urls: dict[TopicName, str] = {}
        self._cores: dict[str, HttpCore] = {}
        # Pools trimmed off (DOORS_MAX): closed with the rest, a request may still use one.
        self._closing: list[HttpCore] = []
        self.failures = 0  # doors that failed a part (a leader moved or died), in all
        # Doors that did not answer: until when they are not tried (UNREACHABLE_S), and
        # the leader epochs their partitions had then.
        self._unreachable: dict[str, tuple[float, dict[TopicName, int]]] = {}
        self._epochs: dict[TopicName, int] = {}  # each partition's leader epoch, as learned

    def learn(
        self,
        names: Sequence[TopicName],
        urls: Sequence[str | None],
        epochs: Sequence[int | None] | None = None,
    ) -> None:
        """What a lookup said: each partition's door (None: none known, the proxy path) and
        its leader's epoch (None: not said)."""
        if not self.enabled:
            return
        now = self._clock()
        for i, (name, url) in enumerate(zip(names, urls, strict=True)):
            url = None if url is None else url.rstrip("/")
            epoch = None if epochs is None else epochs[i]
            if url is not None and not self._reachable(url, name, epoch, now):
                url = None
            if url is None:
                self._urls.pop(name, None)
            else:
                self._urls[name] = url
            if epoch is None:
                self._epochs.pop(name, None)
            else:
                self._epochs[name] = epoch

    def _reachable(self, url: str, partition: TopicName, epoch: int | None, now: float) -> bool:
        banned = self._unreachable.get(url)
        if banned is None:
            return True
        until, epochs_then = banned
        then = epochs_then.get(partition)
        if until <= now or (epoch is not None and then is not None and epoch > then):
            del self._unreachable[url]
            return True
        return False

    def core(self, partition: TopicName) -> HttpCore | None:
        """The connections to ``partition``'s door, None when it has none known."""
        url = self._urls.get(partition)
        if url is None:
            return None
        core = self._cores.get(url)
        if core is None:
            core = self._cores[url] = self._http.sibling(url)
            self._trim()
        return core

    def url(self, partition: TopicName) -> str | None:
        """``partition``'s door as last learned."""
        return self._urls.get(partition)

    def failed(self, partition: TopicName, *, unreachable: bool = False) -> None:
        """``partition``'s door failed it: none known until the next lookup;
        ``unreachable`` (no answer at all): that door is not learned again for a while."""
        self.failures += 1
        url = self._urls.pop(partition, None)
        if unreachable and url is not None:
            now = self._clock()
            at_url = [partition, *(p for p, u in self._urls.items() if u == url)]
            epochs = {p: self._epochs[p] for p in at_url if p in self._epochs}
            self._unreachable[url] = (now + UNREACHABLE_S, epochs)
            if len(self._unreachable) > DOORS_MAX:
                self._unreachable = {u: b for u, b in self._unreachable.items() if b[0] > now}

    def forget(self, partition: TopicName) -> None:
        """No door known for ``partition`` (the proxy path) until the next lookup."""
        self._urls.pop(partition, None)

    @property
    def known(self) -> int:
        """How many partitions have a door known."""
        return len(self._urls)

    def _trim(self) -> None:
        while len(self._cores) > DOORS_MAX:
            url = next(iter(self._cores))
            core = self._cores.pop(url)
            self._closing.append(core)

    async def aclose(self) -> None:
        """Close every door's connections."""
        cores, self._cores = [*self._cores.values(), *self._closing], {}
        self._closing = []
        for core in cores:
            await core.aclose()


async def post_to_door(
    door: HttpCore, path: str, content: bytes, params: Mapping[str, str | int], left_s: float
) -> Answer:
    """``content`` posted to a data door, each attempt within ``DOOR_ATTEMPT_S``. Over a limit
    (429: a publish rate, a backlog quota, the door's slots) is retried at the same door with
    the client's backoff within ``left_s``; anything else is the caller's to judge (a door
    that failed, or the request's own refusal)."""

    async def attempt(attempt_s: float) -> Answer:
        return await door.request(
            "POST",
            path,
            content=content,  # the same bytes on every attempt
            content_type=RECORDS_TYPE,
            params=params,
            timeout_s=min(door.timeout_s, DOOR_ATTEMPT_S, attempt_s),
            lean=True,
        )

    return await retrying(
        attempt, timeout_s=left_s, policy=door.retry, what=path, retry_if=_over_limit
    )


def unanswered(exc: TransportError) -> bool:
    """Whether a door could not be reached at all (refused, a name that does not resolve, a
    certificate refused) rather than cut short (a leader that died mid-request): the client
    may not reach the nodes."""
    cause = exc.__cause__
    return not exc.retriable or isinstance(cause, ConnectionRefusedError | socket.gaierror)


def moved(exc: ApiError) -> bool:
    """Whether a data door's refusal says to ask elsewhere: its node does not lead the
    partition any more, or has no leader for it now (the proxy path retries the latter)."""
    return exc.code == NOT_LEADER or exc.status in (502, 503, 504)


def lookup_doors(
    body: object,
) -> tuple[list[TopicName], list[str | None], list[int | None]]:
    """What a lookup's answer names (what :meth:`DataDoors.learn` takes): each partition's
    name, data door and leader epoch. :class:`ProtocolError` for an answer that is not one."""
    partitions = body.get("partitions") if isinstance(body, dict) else None
    if not isinstance(partitions, list) or not partitions:
        raise ProtocolError(f"lookup answered {body!r:.200}")
    try:
        names = [
            TopicName.parse(str(p.get("name") if isinstance(p, dict) else None)) for p in partitions
        ]
    except ValueError as exc:
        raise ProtocolError(f"lookup answered {body!r:.200}") from exc
    return names, [_url_of(p) for p in partitions], [_epoch_of(p) for p in partitions]


def _over_limit(exc: ClientError) -> bool:
    return isinstance(exc, ApiError) and exc.status == 429


def _epoch_of(partition: object) -> int | None:
    """A lookup's leader epoch of one partition (None: no owner named)."""
    owner = partition.get("owner") if isinstance(partition, dict) else None
    epoch = owner.get("epoch") if isinstance(owner, dict) else None
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def _url_of(partition: object) -> str | None:
    """A lookup's data door of one partition (None: none named, or not a URL)."""
    url = partition.get("url") if isinstance(partition, dict) else None
    return url if isinstance(url, str) and url.startswith(("http://", "https://")) else None
