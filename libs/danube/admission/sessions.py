"""Producer sessions and access modes (docs/producers.md), enforced cluster-wide through etcd.

A session is an etcd lease of ``discovery.producer_session_ttl_s`` and the key
``producers/<ns>/<t>/<scope>_<producer_id>`` on it (scope ``all``: the whole topic; ``p<N>``:
its partition N, as Danube's clients produce); an exclusive session also holds
``producers/<ns>/<t>/x_<scope>`` (value: its id) on the same lease. A topic and its
partitions share one prefix, and both keys are written in one transaction that refuses:

- an **exclusive** session while any producer reaches its scope (on the whole topic: any
  session of the topic or a partition; on a partition: a session of the whole topic or of
  that partition): ``producer_exists``, or ``exclusive_producer`` when one is exclusive;
- a **shared** session while an exclusive producer reaches its scope: ``exclusive_producer``.

No instance keeps anything alive: the client refreshes the lease by id through whichever
instance it reaches (:meth:`ProducerSessions.keepalive`), closing revokes it, and when the
client goes silent etcd drops both keys after the TTL.

etcd stays off the produce path: each instance keeps a view of the exclusive holders of
every topic (danube.admission.exclusive: read once at start and then fed by a watch on
``producers/``, as any door's process does), so :meth:`ProducerSessions.check` is a dict
lookup. The price is a window: once an exclusive session is created, an instance that has
not yet received the watch event (typically a few milliseconds) still accepts a produce
from another producer. The opening instance updates its own view at once.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

from prometheus_client import Counter

from danube.admission.core import PolicySource
from danube.admission.exclusive import ExclusiveHolders, covers
from danube.errors import ConflictError
from danube.meta import MetaError, MetaStore, TopicName, decode_model, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import AccessMode, ProducerRecord
from danube.meta.txn import Txn

log = logging.getLogger(__name__)

# 16 hex digits: unguessable enough to keep one client from closing another's session by
# chance, short enough for a URL segment.
PRODUCER_ID_BYTES = 8
SESSIONS_LISTED_MAX = 10_000
_OPEN_TRIES = 5  # opens racing others under a max_producers limit


def new_producer_id() -> str:
    """A fresh producer id: 16 lowercase hex digits (a valid key segment)."""
    return secrets.token_hex(PRODUCER_ID_BYTES)


def refusal(requested: AccessMode, holder_exclusive: bool) -> ConflictError:
    """The error that answers a session the topic's producers refuse."""
    if holder_exclusive:
        return ConflictError(
            "the topic has an exclusive producer; retry once it closes or its session expires",
            code="exclusive_producer",
        )
    assert requested == "exclusive", "a shared session is refused only by an exclusive one"
    return ConflictError(
        "the topic has producers; an exclusive producer needs it to have none",
        code="producer_exists",
    )


@dataclass(frozen=True, slots=True)
class ProducerSession:
    """A session just opened: what its client needs to keep it alive."""

    topic: TopicName
    producer_id: str
    name: str
    access_mode: AccessMode
    ttl_s: float
    created_ms: int


class ProducerSessions:
    """Open, keep alive, close and list producer sessions; check produces against them.
    ``policies``: where a topic's ``max_producers`` is read; ``refusals``: admission's
    counter of refusals (by reason). A door whose topics can be created by an open
    overrides :meth:`_ensure_topic` (discovery's); here the topic must exist already."""

    def __init__(
        self,
        store: MetaStore,
        policies: PolicySource,
        *,
        ttl_s: int,
        refusals: Counter,
        holders: ExclusiveHolders | None = None,
    ) -> None:
        self.store = store
        self.policies = policies
        self.ttl_s = ttl_s
        self.refusals = refusals
        # The exclusive holders of every topic, loaded before serving and followed
        # (danube.admission.build runs them; ``holders``: the ones an admission already
        # follows); a session opened here is seen at once.
        self.holders = ExclusiveHolders(store) if holders is None else holders
        self.view = self.holders.view

    # --- sessions ----------------------------------------------------------------------

    async def open(
        self, topic: TopicName, name: str, *, access_mode: AccessMode
    ) -> ProducerSession:
        """Open a session; ConflictError (409) ``producer_exists`` or ``exclusive_producer``
        when the topic's producers refuse it, ``too_many_producers`` at the topic's
        ``max_producers``; first :meth:`_ensure_topic`."""
        await self._ensure_topic(topic)
        for _ in range(_OPEN_TRIES):
            session = await self._try_open(topic, name, access_mode)
            if session is not None:
                return session
        raise ConflictError(f"{topic}: producers kept changing; retry", code="conflict")

    async def _try_open(
        self, topic: TopicName, name: str, access_mode: AccessMode
    ) -> ProducerSession | None:
        """One attempt of :meth:`open`; ``None`` when another session was opened between
        the count and the transaction (count again)."""
        limit, counted = await self._producer_room(topic)
        producer_id = new_producer_id()
        record = ProducerRecord(
            name=name, access_mode=access_mode, created_ms=int(time.time() * 1000)
        )
        lease_id, ttl_s = await self.store.grant_bare_lease(self.ttl_s)
        txn = _open_txn(self.store.txn(), topic, access_mode)
        if counted is not None:  # the count read still holds when this commits
            txn.if_prefix_unchanged_since(meta_keys.producer_scope_prefix(topic), counted)
        if access_mode == "exclusive":
            txn.then_put(
                meta_keys.exclusive_producer_key(topic), producer_id.encode(), lease=lease_id
            )
        key = meta_keys.producer_key(topic, producer_id)
        txn.then_put(key, encode_model(record), lease=lease_id)
        txn.else_get(meta_keys.exclusive_producers_prefix(topic), prefix=True)
        try:
            result = await txn.commit()
        except BaseException:
            await self._revoke(lease_id)  # its keys may be written: let them go at once
            raise
        if not result.succeeded:
            await self._revoke(lease_id)
            holders = [meta_keys.parse_producer_key(kv.key)[0] for kv in result.responses[0].kvs]
            in_the_way = any(covers(holder, topic) for holder in holders)
            if in_the_way or access_mode == "exclusive" or limit is None:
                raise refusal(access_mode, holder_exclusive=in_the_way)
            return None  # another session opened meanwhile: the limit may be reached now
        if access_mode == "exclusive":
            self.view.claimed(topic, producer_id, result.revision)
        log.info("producer %s (%s, %s) opened on %s", producer_id, name, access_mode, topic)
        return ProducerSession(topic, producer_id, name, access_mode, ttl_s, record.created_ms)

    async def _producer_room(self, topic: TopicName) -> tuple[int | None, int | None]:
        """The topic's ``max_producers`` (docs/policies.md) and the etcd revision the
        sessions of ``topic`` (its scope: the whole topic, or one partition) were counted
        at; ConflictError ``too_many_producers`` when they are at the limit."""
        _, policies = await self.policies.effective_policies(topic)
        limit = policies.max_producers
        if limit is None:
            return None, None
        snapshot = await self.store.snapshot(meta_keys.producer_scope_prefix(topic))
        if len(snapshot.kvs) >= limit:
            self.refusals.labels("too_many_producers").inc()
            raise ConflictError(
                f"{topic} has {len(snapshot.kvs)} producers, its max_producers is {limit}",
                code="too_many_producers",
            )
        return limit, snapshot.revision

    async def keepalive(self, topic: TopicName, producer_id: str) -> bool:
        """Refresh the session's lease; ``False`` when the session is gone (expired,
        closed, or removed with its topic)."""
        kv = await self.store.get(meta_keys.producer_key(topic, producer_id))
        if kv is None or kv.lease_id == 0:
            return False
        return await self.store.refresh_lease(kv.lease_id) > 0

    async def close(self, topic: TopicName, producer_id: str) -> None:
        """Close the session (its keys vanish at once); nothing to do if it is gone."""
        kv = await self.store.get(meta_keys.producer_key(topic, producer_id))
        if kv is not None and kv.lease_id != 0:
            await self.store.revoke_lease(kv.lease_id)
            log.info("producer %s closed on %s", producer_id, topic)

    async def list_sessions(self, topic: TopicName) -> list[tuple[TopicName, str, ProducerRecord]]:
        """The open sessions of a topic (and of its partitions), or of one partition:
        ``(topic or partition, producer id, record)``."""
        kvs = await self.store.range(meta_keys.producers_prefix(topic), limit=SESSIONS_LISTED_MAX)
        listed = []
        for kv in kvs:
            scoped, producer_id = meta_keys.parse_producer_key(kv.key)
            if producer_id is not None and (topic.partition is None or scoped == topic):
                listed.append((scoped, producer_id, decode_model(kv, ProducerRecord)))
        return listed

    async def check(self, topic: TopicName, producer_id: str | None) -> None:
        """Refuse (409 ``producer_fenced``) a produce from anyone but the exclusive holder,
        from this instance's view: no etcd round trip (``async`` only to match the other
        front doors' calls). A ``producer_id`` is otherwise not checked."""
        self.view.check(topic, producer_id)

    async def _ensure_topic(self, topic: TopicName) -> None:
        """Make sure ``topic`` exists before a session is opened on it; nothing here (the
        caller checked it: an ingest leader leads it)."""
        return None

    async def _revoke(self, lease_id: int) -> None:
        try:
            await self.store.revoke_lease(lease_id)
        except MetaError as exc:  # it expires after its TTL anyway
            log.warning("could not revoke producer lease %x: %s", lease_id, exc)


def _open_txn(txn: Txn, topic: TopicName, access_mode: AccessMode) -> Txn:
    """The compares of a session's open (docs/producers.md, Sessions): an exclusive session
    needs no producer that reaches ``topic``; a shared one, no exclusive producer that does."""
    if topic.partition is None:
        if access_mode == "exclusive":  # nobody on the topic nor on any of its partitions
            return txn.if_prefix_empty(meta_keys.producers_prefix(topic))
        return txn.if_prefix_empty(meta_keys.exclusive_producers_prefix(topic))
    whole = topic.parent
    txn.if_absent(meta_keys.exclusive_producer_key(whole))
    txn.if_absent(meta_keys.exclusive_producer_key(topic))
    if access_mode == "exclusive":  # no session of the whole topic, nor of this partition
        txn.if_prefix_empty(meta_keys.producer_scope_prefix(whole))
        txn.if_prefix_empty(meta_keys.producer_scope_prefix(topic))
    return txn
