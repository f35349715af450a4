"""The subscriptions this dispatcher owns: claiming, serving, fencing and releasing them."""

from __future__ import annotations

import asyncio
import logging

from danube.bus import Bus, Responder
from danube.config import DanubeSettings
from danube.dispatcher import metrics
from danube.dispatcher.fanout import FanoutRuntime
from danube.dispatcher.handlers import SubscriptionHandlers
from danube.dispatcher.runtime import SubscriptionRuntime
from danube.dispatcher.served import ServedSubscription
from danube.dispatcher.store import SubscriptionStore
from danube.meta import Lease, MetaStore, TopicName, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.follow import follow_prefix
from danube.meta.records import Owner
from danube.runtime.owned import Owned

log = logging.getLogger(__name__)

_Key = tuple[TopicName, str]


class _Served:
    def __init__(self, runtime: ServedSubscription, responder: Responder) -> None:
        self.runtime = runtime
        self.responder = responder


class DispatcherNode:
    """Owns subscriptions on behalf of one dispatcher process."""

    def __init__(
        self, settings: DanubeSettings, *, node_id: str, bus: Bus, store: MetaStore, lease: Lease
    ) -> None:
        self.settings = settings
        self.node_id = node_id
        self.bus = bus
        self.store = store
        self.lease = lease
        self._served: Owned[_Key, _Served] = Owned(
            lease, fence=lambda served, reason: served.runtime.fail(reason)
        )
        self._retiring: set[asyncio.Task[None]] = set()

    @property
    def subscriptions(self) -> list[_Key]:
        """``(topic, subscription)`` of every subscription served."""
        return self._served.served()

    def runtimes(self) -> list[ServedSubscription]:
        """The runtime of every subscription served."""
        return [served.runtime for served in self._served.values()]

    async def ensure_serving(self, topic: TopicName, sub: str) -> ServedSubscription:
        """Claim ``sub`` of ``topic`` (if not ours yet), resume it and answer its subjects."""
        key = (topic, sub)
        async with self._served.locks.hold(key):
            served = self._served.get(key)
            if served is not None and not served.runtime.failed:
                return served.runtime
            if served is not None:
                await self._stop_serving(key, release=False)
            self.lease.ensure_alive()
            store = SubscriptionStore(self.store, topic, sub)
            await store.claim_owner(self.node_id, self.lease)
            config = self.settings.dispatcher
            runtime: ServedSubscription
            if await store.dispatch() == "non_reliable":
                runtime = FanoutRuntime(store, self.bus, config, on_failed=self._on_failed)
            else:
                runtime = SubscriptionRuntime(store, self.bus, config, on_failed=self._on_failed)
            try:
                await runtime.start()
                responder = await SubscriptionHandlers(runtime).serve(self.bus, topic, sub)
            except BaseException:
                await runtime.stop()
                await store.release()
                raise
            self._served.add(key, _Served(runtime, responder))
            metrics.SUBSCRIPTIONS.labels(runtime.dispatch).inc()
            return runtime

    def _on_failed(self, runtime: ServedSubscription, reason: str) -> None:
        """Stop answering a failed subscription's subjects, so a claim finds a live owner."""
        key = (runtime.store.topic, runtime.store.sub)
        served = self._served.get(key)
        if served is None or served.runtime is not runtime:
            return
        if not runtime.deleted:  # a delete's own request must still get its answer
            served.responder.cancel()
        task = asyncio.get_running_loop().create_task(self._retire(key, runtime))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, key: _Key, runtime: ServedSubscription) -> None:
        async with self._served.locks.hold(key):
            served = self._served.get(key)
            if served is not None and served.runtime is runtime:
                await self._stop_serving(key, release=self.lease.alive)

    async def _stop_serving(self, key: _Key, *, release: bool) -> None:
        served = self._served.pop(key)
        if served is None:
            return
        metrics.SUBSCRIPTIONS.labels(served.runtime.dispatch).dec()
        served.runtime.begin_stop()
        await served.responder.drain()
        await served.runtime.stop()
        if release and self.lease.alive:
            try:
                await served.runtime.store.release()
            except Exception as exc:
                log.warning("could not release %s/%s: %s", key[0], key[1], exc)

    async def watch_owners(self) -> None:
        """Fence a served subscription the moment its owner key goes (its topic or itself
        was deleted) or names another dispatcher, instead of at its next cursor write, which
        an idle subscription may never make: it would be kept, reading, for good. Runs
        until cancelled; a broken watch resumes where it stopped."""
        await follow_prefix(
            self.store,
            meta_keys.SUBSCRIPTIONS_PREFIX,
            self._on_subscription_event,
            on_resync=self.recheck_owners,
        )

    def _on_subscription_event(self, event: WatchEvent) -> None:
        topic, sub, record = meta_keys.parse_subscription_key(event.key)
        if record == "owner":
            self._check_owner((topic, sub), None if event.kind == "delete" else event.value)

    async def recheck_owners(self) -> int:
        """After owner changes were lost to the watch (etcd compacted them away): every
        served subscription's owner key read again, as the watch would have seen it; the
        revision read at (before the keys: a change after it comes again on the watch)."""
        revision = await self.store.ping()
        for key in self._served.served():
            kv = await self.store.get(meta_keys.subscription_owner_key(*key))
            self._check_owner(key, None if kv is None else kv.value)
        return revision

    def _check_owner(self, key: _Key, owner: bytes | None) -> None:
        """Fence ``key`` if it is served here and its owner key (``None``: deleted) no
        longer names this dispatcher."""
        served = self._served.get(key)
        if served is None:
            return
        if owner is None:
            served.runtime.fail("its owner key was deleted (the topic or subscription went)")
        elif Owner.model_validate_json(owner).node_id != self.node_id:
            served.runtime.fail("another dispatcher owns it now")

    def fence_all(self, reason: str) -> None:
        """Stop every subscription at once: no more deliveries or cursor writes."""
        self._served.fence_all(reason)

    async def close(self, *, release: bool) -> None:
        """Stop serving everything; ``release`` hands the subscriptions on (clean stop)."""
        for key in self._served.served():
            await self._stop_serving(key, release=release)
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
