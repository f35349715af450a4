"""Exclusive producers as one process sees them (docs/producers.md), kept off the produce
path: :class:`ExclusiveView` answers "who may produce to this topic" from memory, and
:class:`ExclusiveHolders` keeps one current from etcd (read once before serving, then fed by
a watch on ``producers/``).

Sessions are opened, kept alive and closed by the doors that take producers
(danube.admission.sessions: discovery's, and an ingest leader's gRPC door), which write the
keys read here; any door that produces (discovery's proxy doors, an ingest leader's direct
doors) fences with a view of its own. The price is a window: once an
exclusive session is created, a process that has not yet received the watch event
(typically a few milliseconds) still admits a produce from another producer. The opening
instance updates its own view at once (:meth:`ExclusiveView.claimed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from danube.errors import ConflictError
from danube.meta import MetaError, MetaStore, TopicName, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.backoff import backoff_s
from danube.meta.kv import KeyValue
from danube.wire import codes

log = logging.getLogger(__name__)

_RETRY_BASE_S = 0.1
_RETRY_CAP_S = 5.0


def covers(holder: TopicName, topic: TopicName) -> bool:
    """Whether an exclusive producer of ``holder`` excludes others from ``topic``: the whole
    topic covers its partitions, and a producer of the whole topic reaches every partition."""
    if holder.parent != topic.parent:
        return False
    return holder.partition is None or topic.partition in (None, holder.partition)


class ExclusiveView:
    """The exclusive producers of every topic and partition, as this instance has seen them
    (no I/O); keyed by topic, then by scope (``None``: the whole topic, ``N``: partition N).

    ``seen_revision`` is the etcd revision of the last change applied: a local update from
    a transaction at revision R is applied only if the watch has not passed R yet (the
    watch then delivers R and whatever followed, a delete included, in order)."""

    def __init__(self) -> None:
        self._holders: dict[TopicName, dict[int | None, str]] = {}
        self.seen_revision = 0

    def __len__(self) -> int:
        return sum(len(scopes) for scopes in self._holders.values())

    def holder(self, topic: TopicName) -> str | None:
        """The id of the exclusive producer of exactly ``topic`` (or partition), if any."""
        return self._holders.get(topic.parent, {}).get(topic.partition)

    def holders_over(self, topic: TopicName) -> list[str]:
        """The exclusive producers a produce to ``topic`` must come from: for a partition,
        the whole topic's and the partition's; for a whole topic, every one of it."""
        scopes = self._holders.get(topic.parent, {})
        return [h for scope, h in scopes.items() if covers(_scoped(topic, scope), topic)]

    def reset(self, kvs: list[KeyValue], revision: int) -> None:
        """Replace everything with the keys under ``producers/`` read at ``revision``."""
        self._holders = {}
        for kv in kvs:
            with contextlib.suppress(ValueError):  # InvalidNameError: not ours, skipped
                topic, producer_id = meta_keys.parse_producer_key(kv.key)
                if producer_id is None:
                    self._set(topic, kv.value.decode("ascii", errors="replace"))
        self.seen_revision = revision

    def apply(self, event: WatchEvent) -> None:
        """Apply one watched change (session keys only move the revision). A key that does
        not parse raises InvalidNameError (a ValueError)."""
        self.seen_revision = max(self.seen_revision, event.mod_revision)
        topic, producer_id = meta_keys.parse_producer_key(event.key)
        if producer_id is not None:
            return
        if event.kind == "put":
            self._set(topic, event.value.decode("ascii", errors="replace"))
        else:
            scopes = self._holders.get(topic.parent, {})
            scopes.pop(topic.partition, None)
            if not scopes:
                self._holders.pop(topic.parent, None)

    def claimed(self, topic: TopicName, producer_id: str, revision: int) -> None:
        """This instance created the exclusive key at ``revision``: see it before the watch."""
        if revision > self.seen_revision:
            self._set(topic, producer_id)

    def check(self, topic: TopicName, producer_id: str | None) -> None:
        """Refuse (409 ``producer_fenced``) a produce from anyone but the exclusive holders."""
        for holder in self.holders_over(topic):
            if holder != producer_id:
                raise ConflictError(
                    f"{topic} has an exclusive producer; only it may produce",
                    code=codes.PRODUCER_FENCED,
                )

    def _set(self, topic: TopicName, producer_id: str) -> None:
        self._holders.setdefault(topic.parent, {})[topic.partition] = producer_id


def _scoped(topic: TopicName, scope: int | None) -> TopicName:
    base = topic.parent
    return base if scope is None else base.partition_name(scope)


class ExclusiveHolders:
    """An :class:`ExclusiveView` kept current from etcd: :meth:`load` before serving, then
    :meth:`follow` in a task until cancelled."""

    def __init__(self, store: MetaStore, view: ExclusiveView | None = None) -> None:
        self.store = store
        self.view = ExclusiveView() if view is None else view

    async def load(self) -> int:
        """Read every exclusive holder; return the revision read at (watch from after it)."""
        snapshot = await self.store.snapshot(meta_keys.PRODUCERS_PREFIX)
        self.view.reset(snapshot.kvs, snapshot.revision)
        return snapshot.revision

    async def follow(self, revision: int) -> None:
        """Keep the view current until cancelled. Any broken watch (compaction included)
        is followed by a fresh read of the whole prefix, so no change is ever missed."""
        failures = 0
        while True:
            # From the last change applied (events replayed after a break apply the same).
            revision = max(revision, self.view.seen_revision)
            try:
                prefix = meta_keys.PRODUCERS_PREFIX
                async with self.store.watch_prefix(prefix, start_revision=revision + 1) as events:
                    async for event in events:
                        failures = 0
                        try:
                            self.view.apply(event)
                        except ValueError as exc:
                            log.warning("producer watch: %s: %s", event.key, exc)
            except MetaError as exc:
                log.warning("producer watch broke: %s", exc)
            failures += 1
            await asyncio.sleep(backoff_s(failures - 1, base_s=_RETRY_BASE_S, cap_s=_RETRY_CAP_S))
            with contextlib.suppress(MetaError):
                revision = await self.load()
