"""Key-shared routing, pure: which consumer owns a message key, and when a key's next
message may go to it. No I/O, no clocks; :mod:`danube.dispatcher.keyed` wires it into the
subscription machine.

- :class:`KeyFilter`: the glob patterns (``fnmatch`` style: ``*``, ``?``, ``[...]``,
  case-sensitive) a consumer attached with; no pattern matches every key.
- :class:`HashRing`: consistent hashing with :data:`POINTS_PER_CONSUMER` virtual points per
  consumer on a 64-bit ring (a stable hash: the same key lands on the same point in every
  process and run). A key belongs to the first point clockwise from its hash whose consumer's
  filter matches it. A consumer joining can only take keys (it adds points), a consumer
  leaving can only give its own keys away: other keys never move.
- :func:`deliverable`: the ordering rule. Of one key's held messages, in offset order, what
  may be handed to a consumer now: nothing while any of them is in flight to another
  consumer; else the messages not yet in flight, up to the first one waiting for a delayed
  redelivery (later messages of the key wait behind it).
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from fnmatch import translate
from typing import Protocol, TypeVar

from danube.wire.opens import FILTER_CHARS_MAX, FILTERS_MAX

POINTS_PER_CONSUMER = 64


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that is the same in every process (unlike ``hash()``)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def check_filters(patterns: Sequence[str]) -> list[str]:
    """``patterns`` if within the limits (at most :data:`FILTERS_MAX`, each 1 to
    :data:`FILTER_CHARS_MAX` characters), else ValueError naming the first problem."""
    if len(patterns) > FILTERS_MAX:
        raise ValueError(f"at most {FILTERS_MAX} key filters, got {len(patterns)}")
    for pattern in patterns:
        if not 1 <= len(pattern) <= FILTER_CHARS_MAX:
            raise ValueError(
                f"a key filter has 1 to {FILTER_CHARS_MAX} characters: {pattern!r:.60}"
            )
    return list(patterns)


class KeyFilter:
    """The keys a consumer accepts: any of its glob patterns, or every key when it has none."""

    __slots__ = ("_regex", "patterns")

    def __init__(self, patterns: Sequence[str] = ()) -> None:
        self.patterns = tuple(check_filters(patterns))
        # One alternation of the translated patterns: one regex call per key.
        joined = "|".join(f"(?:{translate(p)})" for p in self.patterns)
        self._regex = re.compile(joined) if self.patterns else None

    def matches(self, key: str) -> bool:
        """Whether ``key`` is one of this consumer's keys."""
        return self._regex is None or self._regex.match(key) is not None


class HashRing:
    """Consumers on a consistent-hash ring, each with its filter."""

    def __init__(self, points_per_consumer: int = POINTS_PER_CONSUMER) -> None:
        if points_per_consumer < 1:
            raise ValueError("a consumer has at least one point on the ring")
        self.points_per_consumer = points_per_consumer
        self._hashes: list[int] = []  # sorted
        self._owners: list[str] = []  # the consumer of the point at the same index
        self._filters: dict[str, KeyFilter] = {}

    @property
    def consumers(self) -> list[str]:
        """Consumers on the ring, in join order."""
        return list(self._filters)

    def join(self, consumer_id: str, key_filter: KeyFilter | None = None) -> None:
        """Put ``consumer_id`` on the ring (ValueError if it is on it already)."""
        if consumer_id in self._filters:
            raise ValueError(f"consumer {consumer_id!r} is on the ring already")
        self._filters[consumer_id] = key_filter or KeyFilter()
        for index in range(self.points_per_consumer):
            point = stable_hash(f"{consumer_id}#{index}")
            at = bisect.bisect_left(self._hashes, point)
            # Ties (astronomically rare) are broken by consumer id, so the order is stable.
            while at < len(self._hashes) and self._hashes[at] == point:
                if self._owners[at] > consumer_id:
                    break
                at += 1
            self._hashes.insert(at, point)
            self._owners.insert(at, consumer_id)

    def leave(self, consumer_id: str) -> None:
        """Take ``consumer_id`` off the ring (nothing if it is not on it)."""
        if self._filters.pop(consumer_id, None) is None:
            return
        kept = [(h, o) for h, o in zip(self._hashes, self._owners, strict=True) if o != consumer_id]
        self._hashes = [h for h, _ in kept]
        self._owners = [o for _, o in kept]

    def owner(self, key: str) -> str | None:
        """The consumer ``key`` belongs to; ``None`` when no consumer's filter matches it."""
        if not self._hashes:
            return None
        start = bisect.bisect_left(self._hashes, stable_hash(key))
        count = len(self._hashes)
        tried: set[str] = set()
        for step in range(count):
            consumer_id = self._owners[(start + step) % count]
            if consumer_id in tried:
                continue
            if self._filters[consumer_id].matches(key):
                return consumer_id
            tried.add(consumer_id)
            if len(tried) == len(self._filters):
                break
        return None


class Held(Protocol):
    """What :func:`deliverable` reads of a held message."""

    @property
    def state(self) -> str: ...

    @property
    def consumer_id(self) -> str | None: ...


H = TypeVar("H", bound=Held)


def blocked_by(entries: Iterable[Held], consumer_id: str) -> str | None:
    """The consumer, other than ``consumer_id``, one of the key's messages is in flight to
    (the key waits until it is acked or taken back); ``None`` if there is none."""
    for entry in entries:
        if entry.state == "in_flight" and entry.consumer_id != consumer_id:
            return entry.consumer_id
    return None


def deliverable(entries: Sequence[H], consumer_id: str) -> Iterator[H]:
    """Of one key's held messages (``entries``, in offset order), those that may go to
    ``consumer_id`` (the key's owner) now, in order: none while one is in flight to another
    consumer; else those not in flight (``fresh`` or ``ready``), stopping at the first one
    whose redelivery is not yet due (``scheduled``): the key's later messages wait for it."""
    if blocked_by(entries, consumer_id) is not None:
        return
    for entry in entries:
        if entry.state in ("scheduled", "blocked"):  # blocked: a poison message (policy)
            return
        if entry.state != "in_flight":
            yield entry
