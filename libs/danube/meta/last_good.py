"""The last answer read from etcd for a key, kept to answer with while etcd is out of reach.

A lookup reads etcd each time (an owner may change at any moment). When etcd does not answer
(:class:`~danube.meta.errors.MetaTimeoutError`, :class:`~danube.meta.errors.MetaUnavailableError`),
a key answered before is answered again from its last copy, if that is at most ``max_age_s``
old: an owner named there that no longer owns costs the client one redirect (the node answers
``not_leader``), while no answer at all stops a client that looks up before it sends. Any
other error (the topic is gone, a bad name) is raised as is. At most ``max_entries`` keys are
kept, the one answered longest ago dropped first. Pure logic; the caller does the read.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from danube.meta.errors import MetaTimeoutError, MetaUnavailableError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MAX_ENTRIES = 10_000
MAX_AGE_S = 600.0


class LastGood(Generic[K, V]):
    """Answers read from etcd, by key, to fall back on while etcd does not answer."""

    def __init__(
        self,
        *,
        max_entries: int = MAX_ENTRIES,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self._clock = clock
        self._kept: OrderedDict[K, tuple[V, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    async def read(self, key: K, read: Callable[[], Awaitable[V]]) -> tuple[V, float | None]:
        """``read()``'s answer, kept for ``key``, and None; or, when etcd did not answer, the
        last answer kept for ``key`` and its age in seconds (the error raised when none is
        kept, or it is older than ``max_age_s``)."""
        try:
            value = await read()
        except (MetaTimeoutError, MetaUnavailableError):
            kept = self._kept.get(key)
            if kept is None:
                raise
            age_s = self._clock() - kept[1]
            if age_s > self.max_age_s:
                del self._kept[key]
                raise
            return kept[0], age_s
        self._kept[key] = (value, self._clock())
        self._kept.move_to_end(key)
        while len(self._kept) > self.max_entries:
            self._kept.popitem(last=False)
        return value, None
