"""The last answer read from etcd for a key, kept to answer with while etcd is out of reach.

A lookup reads etcd each time (an owner may change at any moment). When etcd does not answer
within :data:`~danube.admission.refresh.STALE_WAIT_S` or fails with a
:class:`~danube.meta.MetaError` (:func:`~danube.admission.refresh.read_or_stale`, the rule of
the produce path's caches), a key answered before is answered again from its last copy, if
that is at most ``max_age_s`` old: an owner named there that no longer owns costs the client
one redirect (the node answers ``not_leader``), while no answer at all stops a client that
looks up before it sends. A key never answered waits for etcd as long as the read does. Any
other error (the topic is gone, a bad name) is raised as is. At most ``max_entries`` keys are
kept, the one answered longest ago dropped first. The caller does the read.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from danube.admission.refresh import StaleError, read_or_stale

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
        """``read()``'s answer, kept for ``key``, and None; or, when etcd did not answer in
        time, the last answer kept for ``key`` and its age in seconds. With none kept (or
        one older than ``max_age_s``), whatever ``read()`` raises."""
        kept = self._kept.get(key)
        if kept is not None and self._clock() - kept[1] > self.max_age_s:
            del self._kept[key]
            kept = None
        try:
            value = await read_or_stale(read, has_stale=kept is not None)
        except StaleError:
            assert kept is not None
            return kept[0], self._clock() - kept[1]
        self._kept[key] = (value, self._clock())
        self._kept.move_to_end(key)
        while len(self._kept) > self.max_entries:
            self._kept.popitem(last=False)
        return value, None
