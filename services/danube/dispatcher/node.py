"""The subscriptions this dispatcher owns: claiming, serving, fencing and releasing them,
and serving them on through a lost node lease (an etcd outage) until they are reclaimed
(docs/dispatcher.md, "Through an etcd outage")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from functools import partial

from danube.bus import Bus, Message, Responder
from danube.config import DanubeSettings
from danube.dispatcher import metrics
from danube.dispatcher.balance import BalancePolicy, Balancer
from danube.dispatcher.census import CensusCounts
from danube.dispatcher.claims import decode_notice, encode_notice, fences
from danube.dispatcher.fanout import FanoutRuntime
from danube.dispatcher.handlers import SubscriptionHandlers
from danube.dispatcher.runtime import SubscriptionRuntime
from danube.dispatcher.served import ServedSubscription
from danube.dispatcher.store import NotOwnerError, OwnerClaim, SubscriptionStore
from danube.dispatcher.takeover import end_lease_if_gone
from danube.meta import Lease, MetaError, MetaStore, TopicName, WatchEvent
from danube.meta import keys as meta_keys
from danube.meta.follow import follow_prefix
from danube.meta.records import Owner, TopicConfig
from danube.runtime.owned import Owned
from danube.storage import ObjectStore
from danube.tasks import TaskSet, TaskSetClosedError
from danube.wire.dispatcher.errors import ClaimRefusedError

log = logging.getLogger(__name__)

_Key = tuple[TopicName, str]

# One count of the cluster (three ranges) gets this long before the round is skipped.
_CENSUS_TIMEOUT_S = 10.0
# A refused claim asks for a count now (the refusal may rest on a stale one: a dispatcher
# that just left still counted as live), at most this often.
_RECOUNT_MIN_S = 0.5
# A claim refused on a count older than this is decided again on a new one.
_FRESH_CENSUS_S = 0.25
# How often the time served without the lease is looked at (the gauge, the bound).
_LEASELESS_CHECK_S = 0.5
# How long a stop waits for hand-overs under way: each drains its responder (10 s at most),
# then writes cursors and releases the owner key under etcd's request deadline.
_HAND_OVER_WAIT_S = 30.0
# Subscriptions a stop hands over at once.
_STOPS_AT_ONCE = 8


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
        # Delay snapshots go to the mesh's object storage (no I/O until the first one).
        self.objects = ObjectStore.from_config(settings.wal_cloud.cloud)
        # Fenced by this node's own rule on a lost lease (_lease_lost), not by Owned's.
        self._served: Owned[_Key, _Served] = Owned(
            None, fence=lambda served, reason: served.runtime.fail(reason)
        )
        self.leaseless_since: float | None = None  # monotonic; None while the lease holds
        self.data_url: str | None = None  # the consume door's (danube.dispatcher.door)
        lease.on_lost(self._lease_lost)
        # Three kinds of task, each stopped in its turn by close(). Their failures are
        # their own, logged: a hand-over's caller hears of it too; a reclaim that broke
        # leaves subscriptions leaseless, which watch_leaseless bounds; a retiring
        # subscription is no longer served whatever its stop met.
        self._handing_over = TaskSet(f"dispatcher {node_id} hand-overs")
        self._reclaiming = TaskSet(f"dispatcher {node_id} reclaims")
        self._retiring = TaskSet(f"dispatcher {node_id} retirements")
        self._recount = asyncio.Event()
        config = settings.dispatcher
        self.balancer: Balancer[_Key] = Balancer(
            node_id,
            BalancePolicy(
                slack=config.balance_slack,
                moves_max=config.balance_moves_max,
                holdoff_s=config.balance_holdoff_s,
            ),
        )
        self._counts = CensusCounts(store, self.balancer, timeout_s=_CENSUS_TIMEOUT_S)

    @property
    def subscriptions(self) -> list[_Key]:
        """``(topic, subscription)`` of every subscription served."""
        return self._served.served()

    def runtimes(self) -> list[ServedSubscription]:
        """The runtime of every subscription served."""
        return [served.runtime for served in self._served.values()]

    def owned(self, topic: TopicName, sub: str) -> ServedSubscription | None:
        """The runtime of ``sub`` of ``topic`` while this dispatcher serves it."""
        served = self._served.get((topic, sub))
        return None if served is None else served.runtime

    async def ensure_serving(self, topic: TopicName, sub: str) -> ServedSubscription:
        """Claim ``sub`` of ``topic`` (if not ours yet), resume it and answer its subjects."""
        key = (topic, sub)
        async with self._served.locks.hold(key):
            served = self._served.get(key)
            if served is not None and not served.runtime.failed:
                return served.runtime
            if served is not None:
                await self._stop_serving(key, release=False)
            else:
                await self._check_claim(key)
            self.lease.ensure_alive()
            store = SubscriptionStore(self.store, topic, sub)
            claim = await store.claim_owner(
                self.node_id,
                self.lease,
                end_if_gone=partial(end_lease_if_gone, self.store, self.node_id),
            )
            await self._announce(key, claim)
            config = self.settings.dispatcher
            runtime: ServedSubscription
            if await store.dispatch() == "non_reliable":
                runtime = FanoutRuntime(store, self.bus, config, on_failed=self._on_failed)
            else:
                runtime = SubscriptionRuntime(
                    store, self.bus, config, on_failed=self._on_failed, objects=self.objects
                )
            try:
                await runtime.start()
                handlers = SubscriptionHandlers(runtime, lambda: self.data_url)
                responder = await handlers.serve(self.bus, topic, sub)
            except BaseException:
                await runtime.stop()
                await store.release()
                raise
            self._served.add(key, _Served(runtime, responder))
            if self.leaseless_since is not None:  # the lease went while it was claimed
                runtime.hold_cursors(True)
            metrics.SUBSCRIPTIONS.labels(runtime.dispatch).inc()
            return runtime

    async def _check_claim(self, key: _Key) -> None:
        """ClaimRefusedError (retriable: the claimant asks the queue group again) when the
        balancer will not take ``key`` now (docs/dispatcher.md, Balancing). A refusal on a
        count older than _FRESH_CENSUS_S is decided again on a new count first: the count
        misses the subscriptions nobody owns (a dispatcher that left released them all),
        and each of their claims would otherwise wait for the next round's."""
        if not self.settings.dispatcher.balance_enabled:
            return
        why = self.balancer.refusal(key, len(self._served), time.monotonic())
        if why is not None and self._counts.age_s() >= _FRESH_CENSUS_S:
            with contextlib.suppress(MetaError, TimeoutError):  # no count: the refusal stands
                await asyncio.shield(self._counts.count())
            why = self.balancer.refusal(key, len(self._served), time.monotonic())
        if why is not None:
            metrics.CLAIMS_REFUSED.inc()
            self._recount.set()
            raise ClaimRefusedError(f"{key[0]}/{key[1]}: not claimed here: {why}")

    async def balance(self) -> None:
        """Count the cluster and hand over what is beyond the fair share (everything when
        drained), every ``balance_interval_s`` (jittered ±20 %, the first round at once)
        until cancelled, and soon after a refused claim (at most every 0.5 s). A round
        that cannot count (etcd away) changes nothing."""
        config = self.settings.dispatcher
        if not config.balance_enabled:
            return
        while True:
            self._recount.clear()
            try:
                await self.balance_once()
            except Exception as exc:
                log.warning("dispatcher %s: balancing round failed: %s", self.node_id, exc)
            await asyncio.sleep(_RECOUNT_MIN_S)
            wait_s = config.balance_interval_s * random.uniform(0.8, 1.2) - _RECOUNT_MIN_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait_s, 0.0)):
                    await self._recount.wait()

    async def balance_once(self) -> list[_Key]:
        """One round: count, decide (danube.dispatcher.balance), hand over; what it handed
        over."""
        if not self.lease.alive:
            return []
        census = await asyncio.shield(self._counts.count())  # others may wait for it too
        unacked: dict[_Key, int] = {}
        for key in self._served.served():
            served = self._served.get(key)
            if served is not None and not served.runtime.failed:
                unacked[key] = served.runtime.unacked_count()
        chosen = self.balancer.plan(unacked)
        reason = "drain" if self.balancer.drained else "balance"
        for key in chosen:
            await self.hand_over(key, reason)
        if chosen:
            log.info(
                "dispatcher %s handed over %d subscriptions (%s; %d live, %d drained, %d owned)",
                self.node_id,
                len(chosen),
                reason,
                len(census.live),
                len(census.drained),
                census.total,
            )
        return chosen

    async def hand_over(self, key: _Key, reason: str) -> None:
        """Stop serving ``key`` gracefully and release its owner key, as a clean stop
        does: waiting polls answer, requests under way finish (an ack still waits for its
        cursor write), the cursors are written a last time, then the owner key goes. The
        consumers' next request finds no responder, claims, and the new owner (never this
        one for ``balance_holdoff_s``) answers ``consumer_not_found``, on which clients
        attach again and get the unacked messages again from the stored cursor."""
        # Shielded: a hand-over cut short would leave the subscription neither served nor
        # released (its consumers would wait for the lease); close() waits for it instead.
        task = self._handing_over.spawn(
            self._hand_over(key, reason), name=f"hand over {key[0]}/{key[1]}", on_failure="log"
        )
        await asyncio.shield(task)

    async def _hand_over(self, key: _Key, reason: str) -> None:
        self.balancer.released([key], time.monotonic())  # before: a claim racing it is refused
        async with self._served.locks.hold(key):
            if self._served.get(key) is None:
                return
            await self._stop_serving(key, release=True)
        metrics.HANDED_OVER.labels(reason).inc()

    def _on_failed(self, runtime: ServedSubscription, reason: str) -> None:
        """Stop answering a failed subscription's subjects, so a claim finds a live owner."""
        key = (runtime.store.topic, runtime.store.sub)
        served = self._served.get(key)
        if served is None or served.runtime is not runtime:
            return
        if not runtime.deleted:  # a delete's own request must still get its answer
            served.responder.cancel()
        with contextlib.suppress(TaskSetClosedError):  # closing: close() stops it
            self._retiring.spawn(
                self._retire(key, runtime), name=f"retire {key[0]}/{key[1]}", on_failure="log"
            )

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

    async def watch_topics(self) -> None:
        """Tell a served subscription at once when its topic grows (``PATCH`` of
        ``partitions``, or a Danube client's producer naming a new partition), so it reads
        the new partitions from their first message. Runs until cancelled."""
        await follow_prefix(
            self.store,
            meta_keys.topics_prefix(),
            self._on_topic_event,
            on_resync=self.recheck_topics,
        )

    def _on_topic_event(self, event: WatchEvent) -> None:
        if event.kind == "delete":
            return  # the owner keys go with the topic: watch_owners fences
        topic = meta_keys.parse_topic_key(event.key)
        config = TopicConfig.model_validate_json(event.value)
        for served in self._served.values():
            if served.runtime.store.topic == topic:
                served.runtime.grow(config.partitions)

    async def recheck_topics(self) -> int:
        """After topic changes were lost to the watch: every served topic's count read again."""
        revision = await self.store.ping()
        for topic in {topic for topic, _ in self._served.served()}:
            config = await self.store.get_model(meta_keys.topic_key(topic), TopicConfig)
            for served in self._served.values():
                if config is not None and served.runtime.store.topic == topic:
                    served.runtime.grow(config.partitions)
        return revision

    def _on_subscription_event(self, event: WatchEvent) -> None:
        topic, sub, record = meta_keys.parse_subscription_key(event.key)
        if record == "owner":
            owner = None if event.kind == "delete" else event.value
            self._check_owner((topic, sub), owner, revision=event.mod_revision)

    async def recheck_owners(self) -> int:
        """After owner changes were lost to the watch (etcd compacted them away): every
        served subscription's owner key read again, as the watch would have seen it; the
        revision read at (before the keys: a change after it comes again on the watch)."""
        revision = await self.store.ping()
        for key in self._served.served():
            kv = await self.store.get(meta_keys.subscription_owner_key(*key))
            self._check_owner(key, None if kv is None else kv.value)
        return revision

    def _check_owner(self, key: _Key, owner: bytes | None, *, revision: int | None = None) -> None:
        """Fence ``key`` if it is served here and its owner key (``None``: deleted) no
        longer names this dispatcher. ``revision``: the change's, from the watch; a change
        older than this dispatcher's own claim says nothing of it (a watch that resumes
        after an etcd outage replays the deletion of the owner key with the lost lease
        after the reclaim may already have written it again)."""
        served = self._served.get(key)
        if served is None:
            return
        claim = served.runtime.store.claim
        if revision is not None and claim is not None and revision < claim.revision:
            return
        if owner is None:
            if served.runtime.store.held or (claim is not None and claim.lease_id != self.lease.id):
                return  # it went with our lost lease: the reclaim decides (and sees a delete)
            served.runtime.fail("its owner key was deleted (the topic or subscription went)")
        elif Owner.model_validate_json(owner).node_id != self.node_id:
            served.runtime.fail("another dispatcher owns it now")

    # --- through an etcd outage (docs/dispatcher.md) ----------------------------------------

    def _lease_lost(self, lease: Lease) -> None:
        """The node lease ran out (etcd unreachable): serve on, acks answered from memory
        and cursor writes held there, until the reclaim (or for ``leaseless_serve_max_s``)."""
        if lease is not self.lease:
            return
        if self.settings.dispatcher.leaseless_serve_max_s <= 0:
            self._served.fence_all("node lease lost")
            return
        self.leaseless_since = time.monotonic()
        log.warning(
            "dispatcher %s lost its node lease (%s): serving %d subscriptions on, cursor "
            "writes held until they are reclaimed",
            self.node_id,
            lease.lost_reason,
            len(self._served),
        )
        for served in self._served.values():
            served.runtime.hold_cursors(True)

    def renewed(self, lease: Lease) -> None:
        """A new node lease after a lost one (NodeSession.renewed): reclaim what is served."""
        self.lease = lease
        lease.on_lost(self._lease_lost)
        with contextlib.suppress(TaskSetClosedError):  # closing: nothing left to reclaim
            self._reclaiming.spawn(self.reclaim_all(lease), name="reclaim", on_failure="log")

    async def reclaim_all(self, lease: Lease) -> int:
        """Reclaim every subscription served through the lost lease under ``lease``, one
        fenced transaction each (SubscriptionStore.reclaim), then write its held cursors;
        one that changed meanwhile (another dispatcher claimed it) stops here. How many
        were reclaimed."""
        reclaimed = 0
        for key in self._served.served():
            async with self._served.locks.hold(key):
                served = self._served.get(key)
                if served is None or served.runtime.failed or not lease.alive:
                    continue
                if await self._reclaim(key, served.runtime, lease):
                    reclaimed += 1
        if lease is self.lease and lease.alive:
            self.leaseless_since = None
            metrics.LEASELESS_SECONDS.set(0)
        if reclaimed:
            log.info("dispatcher %s reclaimed %d subscriptions", self.node_id, reclaimed)
        return reclaimed

    async def _reclaim(self, key: _Key, runtime: ServedSubscription, lease: Lease) -> bool:
        store = runtime.store
        claim = store.claim
        if claim is not None and claim.lease_id == lease.id:
            return False  # claimed under this lease already
        try:
            claim = await store.reclaim(self.node_id, lease)
        except Exception as exc:  # changed meanwhile, or etcd away again: give it up
            metrics.RECLAIMS.labels("lost").inc()
            why = "changed meanwhile" if isinstance(exc, NotOwnerError) else repr(exc)
            runtime.fail(f"not reclaimed after the lost lease: {why}")
            return False
        metrics.RECLAIMS.labels("reclaimed").inc()
        runtime.hold_cursors(False)
        await self._announce(key, claim)
        try:
            await runtime.flush_held()
        except Exception as exc:  # fenced: the runtime failed itself; else the tick retries
            log.warning("held cursors of %s/%s not written yet: %s", key[0], key[1], exc)
        return True

    async def _announce(self, key: _Key, claim: OwnerClaim) -> None:
        """Tell every dispatcher that this one claimed ``key`` (best effort: the bound on
        leaseless serving covers a lost notice)."""
        subject = self.bus.subjects.subscription_claimed(*key)
        try:
            await self.bus.publish(subject, encode_notice(self.node_id, claim))
        except Exception as exc:
            log.warning("claim of %s/%s not announced: %s", key[0], key[1], exc)

    async def on_claim_notice(self, message: Message) -> None:
        """Another dispatcher claimed a subscription: stop serving it at once if ours is
        older (claims.fences)."""
        parsed = self.bus.subjects.parse(message.subject)
        if parsed.subscription is None:
            return
        served = self._served.get((parsed.name, parsed.subscription))
        if served is None or served.runtime.failed:
            return
        notice = decode_notice(message.body)
        if fences(notice, self.node_id, served.runtime.store.claim):
            if served.runtime.store.held:
                metrics.FENCED_BY_CLAIM.inc()
            served.runtime.fail(f"dispatcher {notice.node_id} claimed it (heard on the bus)")

    async def watch_leaseless(self) -> None:
        """Keep the leaseless gauge, and stop everything served once this dispatcher has
        been without its lease past ``leaseless_serve_max_s``. Runs until cancelled."""
        limit_s = self.settings.dispatcher.leaseless_serve_max_s
        while True:
            await asyncio.sleep(_LEASELESS_CHECK_S)
            since = self.leaseless_since
            if since is None:
                continue
            elapsed_s = time.monotonic() - since
            metrics.LEASELESS_SECONDS.set(elapsed_s)
            if elapsed_s > limit_s:
                served = [s for s in self._served.values() if not s.runtime.failed]
                if served:
                    metrics.LEASELESS_EXPIRED.inc(len(served))
                    self._served.fence_all(f"no node lease for {elapsed_s:.0f}s")

    def fence_all(self, reason: str) -> None:
        """Stop every subscription at once: no more deliveries or cursor writes."""
        self._served.fence_all(reason)

    async def close(self, *, release: bool) -> None:
        """Stop serving everything; ``release`` hands the subscriptions on (clean stop)."""
        if not await self._handing_over.join(timeout_s=_HAND_OVER_WAIT_S):
            log.warning("dispatcher %s: hand-overs still under way: cancelled", self.node_id)
        await self._handing_over.close()
        await self._reclaiming.close()
        # A few at a time: each waits for its polls to answer (up to their wait_ms) and
        # writes its cursors; one after another, a SIGTERM of a dispatcher serving many
        # kept the last of them waiting for the sum.
        room = asyncio.Semaphore(_STOPS_AT_ONCE)

        async def stop(key: _Key) -> None:
            async with room:
                try:
                    await self._stop_serving(key, release=release)
                except Exception:
                    log.exception("dispatcher %s: stopping %s/%s failed", self.node_id, *key)

        await asyncio.gather(*(stop(key) for key in self._served.served()))
        await self._retiring.close()
