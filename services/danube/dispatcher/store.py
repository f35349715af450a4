"""Persistence of one subscription in etcd: its config, its owner key and its cursors.

Keys (danube.meta.keys): ``subscriptions/<ns>/<t>/<sub>/config``, ``.../owner`` (an
:class:`Owner` on the dispatcher's node lease) and ``.../cursors/<partition>``. Every cursor
write is a transaction compared on the owner key's mod revision, so a dispatcher that lost the
subscription (its lease expired, another one claimed it) can never move a cursor again.

Without its lease (etcd unreachable) a dispatcher serves on with its cursor writes ``held``
in memory, and once etcd answers it :meth:`SubscriptionStore.reclaim` s the owner key under
the new lease only if nothing under the subscription changed since its own last write
(docs/dispatcher.md, "Through an etcd outage").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from danube.dispatcher import metrics
from danube.dispatcher.cursor import CursorState
from danube.errors import DanubeError, ErrorKind
from danube.meta import Lease, MetaStore, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.errors import MetaError
from danube.meta.kv import KeyValue
from danube.meta.records import Dispatch, Owner, SubscriptionConfig, SubscriptionCursor, TopicConfig
from danube.meta.topics import create_topic_if_absent
from danube.meta.txn import TxnResult
from danube.wire.dispatcher.errors import DispatcherError, PolicyLimitError

log = logging.getLogger(__name__)

# Values kept per cursor key of writes that got no answer (a write is in doubt only around an
# etcd stall: writes are held once the lease is gone).
_IN_DOUBT_MAX = 16


class NotOwnerError(DispatcherError):
    """This dispatcher does not (or no longer) own the subscription; ask again."""

    code = "not_owner"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


@dataclass(frozen=True, slots=True)
class OwnerClaim:
    """A won claim: the epoch, the owner key's mod revision every write is fenced on, and
    the lease the owner key is attached to."""

    epoch: int
    revision: int
    lease_id: int


class CursorsHeldError(DanubeError):
    """Cursor writes are held in memory (no node lease: etcd unreachable); written once the
    subscription is reclaimed. Internal to the dispatcher: it never reaches a client (the
    runtime keeps the cursor dirty), so it is no DispatcherError (no status of its own)."""

    code = "cursors_held"
    retriable = True


def _now_ms() -> int:
    return int(time.time() * 1000)


class SubscriptionStore:
    """The etcd records of one subscription ``sub`` of ``topic`` (the unpartitioned name)."""

    def __init__(self, store: MetaStore, topic: TopicName, sub: str) -> None:
        self.store = store
        self.topic = topic
        self.sub = sub
        self.owner_key = meta_keys.subscription_owner_key(topic, sub)
        self.config_key = meta_keys.subscription_key(topic, sub)
        self.claim: OwnerClaim | None = None
        self.held = False
        """No node lease: cursor writes wait in memory for :meth:`reclaim`."""
        # The revision of our last write under the subscription's prefix (claim, cursors,
        # config): a key there changed after it was written by someone else.
        self.written_revision = 0
        # Cursor writes that got no answer (etcd stalled): each may land yet, so the values
        # each key may hold by our own hand; forgotten at the next write that is answered.
        self._in_doubt: dict[str, set[bytes]] = {}
        self._configured: set[TopicName] = set()  # dead-letter topics known to have a config

    def absent(self) -> str:
        """What a poll or ack of a consumer of this subscription is told when the
        subscription has no config: it was deleted (or never attached). Answered as
        ``consumer_not_found``: a client that attaches again creates it afresh."""
        return (
            f"subscription {self.sub!r} of {self.topic} does not exist (it was deleted, or "
            "no consumer ever attached to it): attach again to create it"
        )

    async def dispatch(self) -> Dispatch:
        """The topic's dispatch mode (``reliable`` when it has no config yet)."""
        config = await self.store.get_model(meta_keys.topic_key(self.topic), TopicConfig)
        return "reliable" if config is None else config.dispatch

    async def ensure_topic_like_ours(self, topic: TopicName) -> None:
        """Give ``topic`` (our dead-letter topic) a config if it has none, with the
        durability and replication of the subscription's topic: a real topic then, listed,
        described and deleted like any other (and its namespace cannot go while it exists)."""
        if topic in self._configured:
            return
        ours = await self.store.get_model(meta_keys.topic_key(self.topic), TopicConfig)
        config = TopicConfig(
            created_ms=int(time.time() * 1000),
            durability="fsync" if ours is None else ours.durability,
            replication_factor=None if ours is None else ours.replication_factor,
            min_insync_replicas=None if ours is None else ours.min_insync_replicas,
        )
        await create_topic_if_absent(self.store, topic, config)
        self._configured.add(topic)

    async def partitions(self) -> list[TopicName]:
        """The partitions the subscription reads: ``-part-0..N-1``, or the topic itself when
        it is unpartitioned or has no config yet (auto-created on first produce)."""
        config = await self.store.get_model(meta_keys.topic_key(self.topic), TopicConfig)
        if config is None or config.partitions == 0:
            return [self.topic]
        return self.topic.partitions(config.partitions)

    async def claim_owner(
        self,
        node_id: str,
        lease: Lease,
        *,
        end_if_gone: Callable[[Owner, KeyValue], Awaitable[bool]] | None = None,
    ) -> OwnerClaim:
        """Create the owner key (epoch + 1) on ``lease``; NotOwnerError if another live
        dispatcher holds it. Re-claiming our own key takes a new epoch as well.
        ``end_if_gone(owner, kv)``: asked when another holds it; True when it ended that
        holder's lease (its process is gone): the key is read again."""
        found = await self.store.get_model_kv(self.owner_key, Owner)
        other = found if found is not None and found[0].node_id != node_id else None
        if other is not None and end_if_gone is not None and await end_if_gone(*other):
            found = await self.store.get_model_kv(self.owner_key, Owner)  # its lease ended
        if found is not None and found[0].node_id != node_id:
            raise NotOwnerError(f"{self.topic}/{self.sub} is owned by {found[0].node_id}")
        epoch = (found[0].epoch if found is not None else 0) + 1
        owner = Owner(node_id=node_id, epoch=epoch, assigned_ms=_now_ms())
        txn = self.store.txn()
        if found is None:
            txn.if_absent(self.owner_key)
        else:
            txn.if_mod_revision(self.owner_key, "==", found[1].mod_revision)
        result = await txn.then_put(self.owner_key, encode_model(owner), lease=lease).commit()
        if not result.succeeded:
            raise NotOwnerError(f"{self.topic}/{self.sub}: lost the claim race")
        self.claim = OwnerClaim(epoch, result.revision, lease.id)
        self.written_revision = result.revision
        log.info("claimed subscription %s/%s: epoch %d", self.topic, self.sub, epoch)
        return self.claim

    async def reclaim(self, node_id: str, lease: Lease) -> OwnerClaim:
        """Write our owner key again under ``lease`` (a new node lease after an etcd
        outage), same epoch, in one transaction that holds only if the subscription's
        config still exists and no key under it was created or changed since our own last
        write: nobody claimed it meanwhile (a claim writes the owner key), and nobody who
        did moved its cursors. NotOwnerError (nothing written) otherwise."""
        if self.claim is None:
            raise NotOwnerError(f"{self.topic}/{self.sub}: not claimed")
        owner = Owner(node_id=node_id, epoch=self.claim.epoch, assigned_ms=_now_ms())
        prefix = meta_keys.subscription_prefix(self.topic, self.sub)

        async def attempt() -> TxnResult:
            return await (
                self.store.txn()
                .if_present(self.config_key)
                .if_prefix_unchanged_since(prefix, self.written_revision)
                .then_put(self.owner_key, encode_model(owner), lease=lease)
                .commit()
            )

        result = await attempt()
        if not result.succeeded and await self._changed_only_by_us(prefix):
            result = await attempt()
        if not result.succeeded:
            raise NotOwnerError(
                f"{self.topic}/{self.sub}: changed while this dispatcher had no lease"
            )
        self.claim = OwnerClaim(self.claim.epoch, result.revision, lease.id)
        self.written_revision = result.revision
        self._in_doubt.clear()
        log.info("reclaimed subscription %s/%s: epoch %d", self.topic, self.sub, owner.epoch)
        return self.claim

    async def _changed_only_by_us(self, prefix: str) -> bool:
        """Whether every key under the subscription written since our last known write holds
        a value of one of our cursor writes that got no answer (it landed when etcd came
        back, after its caller gave up): then it is ours, and so is that revision. Such a
        write is fenced on our owner key, so it landed before anyone else's claim; anyone
        else's write after it is a key it did not write (a claim: the owner key) or a value
        not ours."""
        if not self._in_doubt:
            return False
        newer = [
            kv for kv in await self.store.range(prefix) if kv.mod_revision > self.written_revision
        ]
        if not newer or any(kv.value not in self._in_doubt.get(kv.key, ()) for kv in newer):
            return False
        log.info(
            "%s/%s: %d cursor write(s) that got no answer landed after all",
            self.topic,
            self.sub,
            len(newer),
        )
        self.written_revision = max(kv.mod_revision for kv in newer)
        return True

    async def release(self) -> None:
        """Delete the owner key if it is still ours (a clean stop hands the subscription on)."""
        if self.claim is not None:
            await self.store.compare_and_delete(
                self.owner_key, expected_mod_revision=self.claim.revision
            )
            self.claim = None

    async def delete(self) -> None:
        """Delete every key of the subscription (config, cursors, owner) in one transaction
        fenced on our owner key; NotOwnerError (nothing deleted) if it is no longer ours.
        Once it commits, no cursor write of ours can land (the owner key is gone) and the
        next claimant finds no config: the subscription starts afresh at its next attach."""
        if self.claim is None:
            raise NotOwnerError(f"{self.topic}/{self.sub}: not claimed")
        prefix = meta_keys.subscription_prefix(self.topic, self.sub)
        result = await (
            self.store.txn()
            .if_mod_revision(self.owner_key, "==", self.claim.revision)
            .then_delete(prefix, prefix=True)
            .commit()
        )
        if not result.succeeded:
            raise NotOwnerError(f"{self.topic}/{self.sub}: the owner key changed; fenced")
        self.claim = None
        log.info("deleted subscription %s/%s", self.topic, self.sub)

    async def load_config(self) -> SubscriptionConfig | None:
        """The subscription's config, ``None`` before its first attach."""
        return await self.store.get_model(self.config_key, SubscriptionConfig)

    async def create_config(
        self, config: SubscriptionConfig, *, max_subscriptions: int | None = None
    ) -> SubscriptionConfig:
        """Write ``config`` unless one exists; return the one that is stored. A new one
        that is not among the first ``max_subscriptions`` of its topic by creation is
        deleted again: PolicyLimitError ``too_many_subscriptions`` (two created at once see
        the same order, so exactly the later one is refused)."""
        if await self.store.create_model(self.config_key, config):
            if max_subscriptions is not None:
                await self._check_rank(max_subscriptions)
            return config
        stored = await self.load_config()
        return config if stored is None else stored

    async def _check_rank(self, limit: int) -> None:
        kvs = await self.store.range(meta_keys.subscriptions_prefix(self.topic))
        configs = sorted((kv.create_revision, kv.key) for kv in kvs if kv.key.endswith("/config"))
        rank = next((i for i, (_, key) in enumerate(configs) if key == self.config_key), None)
        if rank is not None and rank >= limit:
            await self.store.delete(self.config_key)
            metrics.POLICY_REFUSALS.labels("too_many_subscriptions").inc()
            raise PolicyLimitError(
                f"{self.topic} has its maximum of {limit} subscriptions (max_subscriptions)",
                code="too_many_subscriptions",
            )

    async def write_config(self, config: SubscriptionConfig) -> None:
        """Replace the stored config (a failure policy changed), fenced on our owner key
        like a cursor write; NotOwnerError (nothing written) if it is no longer ours."""
        if self.claim is None:
            raise NotOwnerError(f"{self.topic}/{self.sub}: not claimed")
        result = await (
            self.store.txn()
            .if_mod_revision(self.owner_key, "==", self.claim.revision)
            .then_put(self.config_key, encode_model(config))
            .commit()
        )
        if not result.succeeded:
            raise NotOwnerError(f"{self.topic}/{self.sub}: the owner key changed; fenced")
        self.written_revision = result.revision

    async def load_cursors(self, partitions: list[TopicName]) -> dict[TopicName, CursorState]:
        """The stored cursor of each partition that has one."""
        found: dict[TopicName, CursorState] = {}
        for partition in partitions:
            key = meta_keys.subscription_cursor_key(self.topic, self.sub, partition)
            cursor = await self.store.get_model(key, SubscriptionCursor)
            if cursor is not None:
                found[partition] = CursorState(
                    next_offset=cursor.next_offset,
                    acked_beyond=cursor.acked_beyond,
                    delay_from=cursor.delay_from,
                    delay_due_ms=cursor.delay_due_ms,
                    delay_snapshots=cursor.delay_snapshots,
                )
        return found

    async def write_cursors(self, states: dict[TopicName, CursorState]) -> None:
        """Write cursors in one transaction fenced on our owner key; NotOwnerError if the
        subscription is no longer ours (nothing is written then); CursorsHeldError (no I/O)
        while writes are :attr:`held`."""
        if self.claim is None:
            raise NotOwnerError(f"{self.topic}/{self.sub}: not claimed")
        if self.held:
            raise CursorsHeldError(f"{self.topic}/{self.sub}: cursor writes held (no lease)")
        claim = self.claim
        txn = self.store.txn().if_mod_revision(self.owner_key, "==", claim.revision)
        written: dict[str, bytes] = {}
        now_ms = _now_ms()
        for partition, state in states.items():
            record = SubscriptionCursor(
                next_offset=state.next_offset,
                acked_beyond=state.acked_beyond,
                updated_ms=now_ms,
                delay_from=state.delay_from,
                delay_due_ms=state.delay_due_ms,
                delay_snapshots=state.delay_snapshots,
            )
            key = meta_keys.subscription_cursor_key(self.topic, self.sub, partition)
            written[key] = encode_model(record)
            txn.then_put(key, written[key])
        try:
            result = await txn.commit()
        except MetaError:  # no answer: it may land yet, when etcd comes back
            for key, value in written.items():
                doubts = self._in_doubt.setdefault(key, set())
                if len(doubts) < _IN_DOUBT_MAX:  # past it, a reclaim fails as it would have
                    doubts.add(value)
            raise
        self._in_doubt.clear()  # answered: whatever landed before, this write came after
        if not result.succeeded:
            if self.held or self.claim is not claim:
                # The lease went while this write waited on etcd (a stall: the owner key
                # went with the lease when etcd came back), or the subscription was
                # reclaimed meanwhile: not a fence. The reclaim judges whether anyone
                # else wrote under the subscription; the cursors stay dirty until then.
                raise CursorsHeldError(
                    f"{self.topic}/{self.sub}: the lease went while the cursors were written"
                )
            raise NotOwnerError(f"{self.topic}/{self.sub}: the owner key changed; fenced")
        self.written_revision = max(self.written_revision, result.revision)
