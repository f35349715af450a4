"""What a node serves under its node lease, by key: the one registry of owned things.

An ingest node keeps replicas of partitions, a dispatcher serves subscriptions; both claim
each under the node lease, serve it while they own it, and must stop all of it the moment
the lease is lost (another node may own it from then on). :class:`Owned` is that map: one
claim or release at a time per key (``locks``), fencing of everything on lease loss, and a
count for the node's gauge. What serving and releasing mean stays with the service.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from danube.aio import KeyedLocks
from danube.meta import Lease

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Owned(Generic[K, V]):
    """The things (``V``) a node serves, by key (``K``), under ``lease``.

    ``fence(thing, reason)`` stops a thing serving at once (no I/O: it is called from the
    lease's loss callback); every thing is fenced when the lease is lost. ``on_count`` is
    told the number of things after every change (a gauge). ``lease=None``: the service
    fences its things by its own rule on a lost lease (ingest leaders serve through an etcd
    outage while their followers confirm them: docs/replication.md).
    """

    def __init__(
        self,
        lease: Lease | None,
        *,
        fence: Callable[[V, str], None],
        on_count: Callable[[int], object] | None = None,
    ) -> None:
        self._things: dict[K, V] = {}
        self._fence = fence
        self._on_count = on_count
        self.locks: KeyedLocks[K] = KeyedLocks()
        """Held while a key is claimed, replaced or released: one at a time per key."""
        if lease is not None:
            lease.on_lost(lambda _: self.fence_all("node lease lost"))

    def __len__(self) -> int:
        return len(self._things)

    def __contains__(self, key: K) -> bool:
        return key in self._things

    def get(self, key: K) -> V | None:
        """The thing served under ``key``, if any."""
        return self._things.get(key)

    def served(self) -> list[K]:
        """The keys served now (a copy: safe to iterate while things come and go)."""
        return list(self._things)

    def values(self) -> list[V]:
        """The things served now (a copy)."""
        return list(self._things.values())

    def add(self, key: K, thing: V) -> None:
        """Serve ``thing`` under ``key``; ValueError if the key is served already (release
        or :meth:`pop` the old one first)."""
        if key in self._things:
            raise ValueError(f"{key!r} is served already")
        self._things[key] = thing
        self._counted()

    def pop(self, key: K) -> V | None:
        """Stop counting ``key`` as served; the thing it was, if any."""
        thing = self._things.pop(key, None)
        if thing is not None:
            self._counted()
        return thing

    def discard(self, key: K, thing: V) -> bool:
        """Forget ``key`` only if ``thing`` is still what it serves (a newer claim may have
        replaced it meanwhile); whether it was."""
        if self._things.get(key) is not thing:
            return False
        return self.pop(key) is not None

    def fence_all(self, reason: str) -> None:
        """Fence every thing served: none may go on as if it were still owned."""
        for thing in list(self._things.values()):
            self._fence(thing, reason)

    def _counted(self) -> None:
        if self._on_count is not None:
            self._on_count(len(self._things))
