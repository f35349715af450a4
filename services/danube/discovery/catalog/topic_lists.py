"""The topic names of a namespace, listed from etcd at most once per ``max_age_s`` however
many many-topics streams of this instance ask (doors/http/multi_stream.py): a thousand streams
over one namespace cost etcd one range read per ``max_age_s``, not a thousand."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from danube.aio import awaited_task

# Namespaces remembered at once (least recently asked forgotten first).
NAMESPACES_MAX = 1024

Lister = Callable[[str], Awaitable[list[str]]]


class TopicLists:
    """Cached, single-flight listings of ``list_topics(namespace)`` (``Catalog.list_topics``).

    A listing runs in a task of its own that every asker awaits (shielded): one asker's
    stream ending does not cancel the listing the others wait for. It ends within the etcd
    client's deadline.
    """

    def __init__(self, list_topics: Lister, max_age_s: float) -> None:
        self._list = list_topics
        self.max_age_s = max_age_s
        self._listed: OrderedDict[str, tuple[float, list[str]]] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[list[str]]] = {}

    async def names(self, namespace: str) -> list[str]:
        """The namespace's topic names, listed at most ``max_age_s`` ago; what
        ``list_topics`` raises (NotFoundError when the namespace does not exist)."""
        hit = self._listed.get(namespace)
        if hit is not None and time.monotonic() - hit[0] < self.max_age_s:
            self._listed.move_to_end(namespace)
            return hit[1]
        task = self._inflight.get(namespace)
        if task is None:
            task = awaited_task(self._fetch(namespace), name=f"list topics {namespace}")
            self._inflight[namespace] = task
            task.add_done_callback(lambda done: self._done(namespace, done))
        return await asyncio.shield(task)

    async def _fetch(self, namespace: str) -> list[str]:
        listed_at = time.monotonic()
        names = await self._list(namespace)
        self._listed[namespace] = (listed_at, names)
        self._listed.move_to_end(namespace)
        while len(self._listed) > NAMESPACES_MAX:
            self._listed.popitem(last=False)
        return names

    def _done(self, namespace: str, task: asyncio.Task[list[str]]) -> None:
        if self._inflight.get(namespace) is task:
            del self._inflight[namespace]
