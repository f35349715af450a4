"""A follower's direct link to its leader's data door: the replica fetch without the bus
(docs/replication.md, "The replica link").

Over the bus, a fetch's answer and the follower's next fetch (its durability report) each
went through nats-server: two more processes to wake and two more writes on the path of
every acknowledgement at replication factor > 1 (0.56-0.71 ms a hop measured at factor 3,
against 0.28-0.44 ms straight to the leader's door; docs/performance.md).

**How a link is set up.** The leader answers a follower's ``repl.epochs`` (on the bus, the
mesh's trusted channel) with its data door's URL and a ticket: random per leadership term
(``secrets``). The follower posts its fetches to ``POST /v1/replicas/{ns}/{topic}/fetch`` on
that door with the ticket in ``Danube-Replica-Ticket``; the leader compares it in constant
time (``hmac.compare_digest``), so only a node that heard the leader on the bus can read the
log this way or report what it holds. The body and the answer are the bus's
(danube.wire.ingest.replication): the leader serves both the same way.

**When the bus is used instead.** A door with TLS (nodes hold no trust store for each
other's certificates), no door, a leader that offers no link (an older version), more than
:data:`LINKS_PER_LEADER` partitions followed from one leader (each link's long poll holds
one of the leader door's ``ingest.data_max_inflight``: the rest stays for producers), and
for :data:`RETRY_S` after a link failed (refused, cut, a status other than 200).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

from danube.errors import UnavailableError
from danube.meta import TopicName
from danube.wire.http1 import Http1Pool

TICKET_HEADER = "danube-replica-ticket"
LINKS_PER_LEADER = 16
RETRY_S = 30.0
CONTENT_TYPE = "application/vnd.danube.replica-fetch"
_TICKET_BYTES = 24
_TICKET_CHARS_MAX = 64
_URL_CHARS_MAX = 2048


class LinkError(UnavailableError):
    """A fetch over the link failed: refused, cut, timed out, or answered other than 200
    (the follower fetches over the bus instead)."""

    code = "replica_link_failed"


@dataclass(frozen=True, slots=True)
class LinkOffer:
    """What a leader's ``repl.epochs`` answer offers: its door and the term's ticket."""

    url: str
    ticket: str

    def to_json(self) -> dict[str, str]:
        return {"url": self.url, "ticket": self.ticket}

    @classmethod
    def from_json(cls, value: object) -> LinkOffer | None:
        """The offer in an epochs answer; None when there is none or it is not usable (an
        older leader, a door with TLS, anything malformed)."""
        if not isinstance(value, dict):
            return None
        url, ticket = value.get("url"), value.get("ticket")
        if not isinstance(url, str) or not isinstance(ticket, str):
            return None
        if not 0 < len(ticket) <= _TICKET_CHARS_MAX or len(url) > _URL_CHARS_MAX:
            return None
        try:
            parts = urlsplit(url)
        except ValueError:
            return None
        if parts.scheme != "http" or not parts.hostname:
            return None
        return cls(url, ticket)


def new_ticket() -> str:
    """A leadership term's ticket."""
    return secrets.token_urlsafe(_TICKET_BYTES)


def ticket_matches(expected: str, given: str | None) -> bool:
    """Whether a fetch carries the term's ticket (compared in constant time)."""
    return given is not None and hmac.compare_digest(
        expected.encode("latin-1"), given.encode("latin-1")
    )


def fetch_path(name: TopicName) -> str:
    """The link's path for partition ``name`` on its leader's door."""
    return f"/v1/replicas/{name.namespace}/{name.topic}/fetch"  # the segments need no quoting


class ReplicaLinks:
    """A node's side of the links: the door it offers its followers (set once its data
    door listens) and the links its followers hold, counted per leader."""

    def __init__(self, per_leader: int = LINKS_PER_LEADER) -> None:
        self.door_url: str | None = None
        self.per_leader = per_leader
        self._held: Counter[str] = Counter()

    def serve_at(self, url: str | None) -> None:
        """Offer links at the data door ``url`` (plain HTTP only: see the module); None:
        offer none (the door closes)."""
        self.door_url = url if url is not None and urlsplit(url).scheme == "http" else None

    def offer(self, ticket: str) -> LinkOffer | None:
        """What this node, leading, offers its followers."""
        return None if self.door_url is None else LinkOffer(self.door_url, ticket)

    @property
    def held(self) -> int:
        """Links this node's followers hold now (all leaders)."""
        return sum(self._held.values())

    def open(self, leader: str, offer: LinkOffer, name: TopicName) -> ReplicaLink | None:
        """A link to ``leader`` for partition ``name``; None when this node holds
        :attr:`per_leader` to it already."""
        if self._held[leader] >= self.per_leader:
            return None
        self._held[leader] += 1
        return ReplicaLink(self, leader, offer, fetch_path(name))

    def release(self, leader: str) -> None:
        """A link to ``leader`` is closed: its place is free."""
        self._held[leader] -= 1
        if self._held[leader] <= 0:
            del self._held[leader]


class ReplicaLink:
    """One partition's fetches to its leader's door (one kept-alive connection)."""

    def __init__(self, links: ReplicaLinks, leader: str, offer: LinkOffer, path: str) -> None:
        self._links = links
        self.leader = leader
        self.offer = offer
        self._path = path
        self._pool = Http1Pool(offer.url, ssl_context=None, headers={TICKET_HEADER: offer.ticket})
        self._open = True

    async def fetch(self, body: bytes, timeout_s: float) -> bytes:
        """One fetch (a ``ReplFetchRequest``'s bytes); the leader's answer as the bus's."""
        try:
            async with asyncio.timeout(timeout_s):
                answer = await self._pool.request(
                    "POST", self._path, content_type=CONTENT_TYPE, body=body
                )
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            raise LinkError(f"link to {self.leader} failed: {exc!r}") from exc
        if answer.status != 200:
            raise LinkError(
                f"link to {self.leader} answered {answer.status}: {answer.body[:200]!r}"
            )
        return answer.body

    async def close(self) -> None:
        """Give its place back and close its connection (idempotent)."""
        if not self._open:
            return
        self._open = False
        self._links.release(self.leader)
        with contextlib.suppress(OSError):
            await self._pool.aclose()
