"""The policies in effect for a topic, as every produce door reads them (docs/policies.md):
the topic's config and its namespace's policy, each cached ``cache_ttl_s``
(``discovery.topic_cache_ttl_s``) so etcd stays off the produce path, read again ahead of
expiry in the background (danube.admission.refresh), and, while etcd stalls or fails,
answered from the entry known a moment ago.

A topic's policies are its own over its namespace's (:meth:`PolicyCache.effective_policies`).
Reads only: discovery's catalog (danube.discovery.catalog.catalog) extends :class:`PolicyCache` with
the writes of namespaces and topics, and puts what it writes in the cache at once, so the
instance that wrote a change sees it at once and the others within the TTL.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from danube.admission.refresh import Refresher, StaleError, read_or_stale, refresh_at
from danube.meta import MetaStore, TopicName, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.follow import follow_prefix
from danube.meta.records import NamespacePolicy, Policies, TopicConfig

TOPIC_CACHE_ENTRIES_MAX = 10_000
NAMESPACES_CACHED_MAX = 10_000
_NO_POLICIES = Policies()  # a topic not created yet: nothing of its own


@dataclass(frozen=True, slots=True)
class _Cached:
    config: TopicConfig
    expires_at: float
    refresh_at: float  # a hit from then on reads it again in the background (refresh.py)


@dataclass(frozen=True, slots=True)
class _CachedNamespace:
    policy: NamespacePolicy | None
    expires_at: float
    refresh_at: float


class PolicyCache:
    """Topic configs and namespace policies of one cluster (one ``MetaStore``), cached."""

    def __init__(
        self,
        store: MetaStore,
        *,
        cache_ttl_s: float,
        refresher: Refresher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refresher``: refresh-ahead of the produce path's entries (None: an entry is
        read again only once expired, inline)."""
        self.store = store
        self._cache_ttl_s = cache_ttl_s
        self._refresher = refresher
        self._clock = clock
        self._cache: OrderedDict[TopicName, _Cached] = OrderedDict()
        self._namespaces: dict[str, _CachedNamespace] = {}  # bounded: NAMESPACES_CACHED_MAX
        # The last merge of each topic's policies over its namespace's, while both are the
        # objects it was made from (bounded: TOPIC_CACHE_ENTRIES_MAX): a produce merges
        # nothing while the cached entries stand.
        self._merged: dict[TopicName, tuple[Policies, Policies | None, Policies]] = {}
        self._lock = asyncio.Lock()  # serialises cache fills only, never an etcd write

    async def effective_policies(self, topic: TopicName) -> tuple[TopicConfig | None, Policies]:
        """The topic's config (``None`` before it exists) and the policies in effect for it:
        its own over its namespace's, both from the caches (the produce path's view)."""
        config = await self.cached_topic(topic.parent)
        namespace = await self.cached_namespace(topic.namespace)
        fallback = None if namespace is None else namespace.policies
        own = _NO_POLICIES if config is None else config.policies
        merged = self._merged.get(topic)
        if merged is not None and merged[0] is own and merged[1] is fallback:
            return config, merged[2]
        effective = own.over(fallback)
        if len(self._merged) >= TOPIC_CACHE_ENTRIES_MAX:
            self._merged.clear()  # rare: merged again on the next produce of each
        self._merged[topic] = (own, fallback, effective)
        return config, effective

    async def cached_namespace(self, name: str) -> NamespacePolicy | None:
        """The namespace's policy from the cache while fresh, else etcd (else, when etcd
        fails, the stale one); ``None`` if it does not exist."""
        hit = self._namespaces.get(name)
        now = self._clock()
        if hit is not None and hit.expires_at > now:
            if hit.refresh_at <= now and self._refresher is not None:
                self._refresher.start(("namespace", name), lambda: self._refresh_ns(name, hit))
            return hit.policy
        key = ("namespace", name)
        try:
            found = await read_or_stale(
                lambda: self.store.get_model(meta_keys.namespace_key(name), NamespacePolicy),
                has_stale=hit is not None,
                stalled=self._stalled(key),
            )
        except StaleError:  # etcd stalls or fails: the policy known a moment ago
            assert hit is not None
            if self._refresher is not None:  # replaces the entry once etcd answers
                self._refresher.start(key, lambda: self._refresh_ns(name, hit))
            return hit.policy
        self._remember_namespace(name, found)
        return found

    async def _refresh_ns(self, name: str, hit: _CachedNamespace) -> None:
        found = await self.store.get_model(meta_keys.namespace_key(name), NamespacePolicy)
        if self._namespaces.get(name) is hit:  # else replaced meanwhile: keep the newer
            self._remember_namespace(name, found)

    def _remember_namespace(self, name: str, policy: NamespacePolicy | None) -> None:
        if len(self._namespaces) >= NAMESPACES_CACHED_MAX and name not in self._namespaces:
            self._namespaces.clear()  # rare: a cache refills from etcd
        now = self._clock()
        self._namespaces[name] = _CachedNamespace(
            policy, now + self._cache_ttl_s, refresh_at(now, self._cache_ttl_s)
        )

    async def cached_topic(self, topic: TopicName) -> TopicConfig | None:
        """The topic's config for the produce path: from the cache while fresh, else etcd
        (else, when etcd fails, the stale cached one); ``None`` if the topic does not exist
        (absence is not cached)."""
        hit = self._cache.get(topic)
        now = self._clock()
        if hit is not None and hit.expires_at > now:
            if hit.refresh_at <= now and self._refresher is not None:
                self._refresher.start(("topic", topic), lambda: self._refresh_topic(topic, hit))
            return hit.config
        key = ("topic", topic)
        try:
            found = await read_or_stale(
                lambda: self._locked_get_topic(topic),
                has_stale=hit is not None,
                stalled=self._stalled(key),
            )
        except StaleError:
            assert hit is not None
            if self._refresher is not None:  # replaces the entry once etcd answers
                self._refresher.start(key, lambda: self._refresh_topic(topic, hit))
            # etcd stalls or fails: the config known a moment ago still routes the produce (a
            # topic deleted meanwhile is fenced at ingest, whose owner key went with it).
            return hit.config
        if found is None:
            self._cache.pop(topic, None)
            return None
        self._remember(topic, found)
        return found

    async def follow_changes(self) -> None:
        """Forget a cached topic config or namespace policy as soon as etcd says it changed
        (the next read takes it from etcd): an instance that did not write a change — an
        ingest node's door, another discovery — sees it within a watch's delay rather than
        the TTL (a topic grown, a policy set). Runs until cancelled (danube.meta.follow:
        a broken watch resumes where it stopped; the TTL bounds what a compaction skips)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(
                follow_prefix(self.store, meta_keys.topics_prefix(), self._topic_changed)
            )
            tasks.create_task(
                follow_prefix(self.store, meta_keys.NAMESPACES_PREFIX, self._namespace_changed)
            )

    def _topic_changed(self, event: WatchEvent) -> None:
        self._cache.pop(meta_keys.parse_topic_key(event.key), None)

    def _namespace_changed(self, event: WatchEvent) -> None:
        self._namespaces.pop(event.key.removeprefix(meta_keys.NAMESPACES_PREFIX), None)

    def _stalled(self, key: tuple[str, object]) -> bool:
        """Whether the entry's background refresh is stuck or failed (etcd is away)."""
        return self._refresher is not None and self._refresher.stalled(key)

    async def _locked_get_topic(self, topic: TopicName) -> TopicConfig | None:
        async with self._lock:
            return await self.store.get_model(meta_keys.topic_key(topic), TopicConfig)

    async def _refresh_topic(self, topic: TopicName, hit: _Cached) -> None:
        found = await self.store.get_model(meta_keys.topic_key(topic), TopicConfig)
        if self._cache.get(topic) is not hit:
            return  # replaced meanwhile (an update or a delete here): keep the newer
        if found is None:
            self._cache.pop(topic, None)
        else:
            self._remember(topic, found)

    def _remember(self, topic: TopicName, config: TopicConfig) -> None:
        now = self._clock()
        self._cache[topic] = _Cached(
            config, now + self._cache_ttl_s, refresh_at(now, self._cache_ttl_s)
        )
        self._cache.move_to_end(topic)
        while len(self._cache) > TOPIC_CACHE_ENTRIES_MAX:
            self._cache.popitem(last=False)
