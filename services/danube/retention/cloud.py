"""Cloud retention of one partition: delete the objects past the topic's retention policy.

Per object, oldest first: the **descriptor** goes first, in a transaction compared on its mod
revision (it is still the one that was judged) and on the retention election key (this node
still leads), then the **object**. A reader therefore never finds a descriptor whose object was
deleted on purpose; it may at worst hold a descriptor it read just before, and then find the
object gone (docs/retention.md says what a reader does then). An object whose delete failed
after its descriptor went is remembered (bounded) and deleted again on the next pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from danube.meta import DeposedError, InvalidNameError, KeyValue, MetaStore, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import RetentionPolicy, RetentionTally
from danube.retention import metrics
from danube.retention.policy import (
    NOTHING,
    Dropped,
    Limits,
    StoredObject,
    acked_prefix,
    plan_object_expiry,
)
from danube.retention.tally import TallyCell, added
from danube.storage import ObjectDescriptor, ObjectStore, StorageError

log = logging.getLogger(__name__)

DESCRIPTOR_PAGE_KEYS = 256
"""Descriptors read per etcd request (each may be up to 1 MiB with its index)."""
DESCRIPTORS_MAX = 100_000
"""Descriptors one pass reads per partition; a longer list is judged by its oldest part."""
ORPHANS_MAX = 10_000
"""Objects remembered for another delete; past this, the newest failures are only logged."""


@dataclass(frozen=True, slots=True)
class Fence:
    """The leader's term: deletes succeed only while ``election_key`` has this create revision."""

    election_key: str
    revision: int


@dataclass(frozen=True, slots=True)
class Listed:
    """One descriptor as read: its etcd key and revision, the object key, what the plan needs."""

    key: str
    mod_revision: int
    object_key: str
    item: StoredObject


@dataclass(frozen=True, slots=True)
class CloudOutcome:
    """What one partition's cloud pass deleted, and what it kept (``kept_*``: the
    partition's objects listed and not deleted, for the cloud-tier size metrics)."""

    objects: int
    size_bytes: int
    kept_objects: int = 0
    kept_bytes: int = 0
    messages: int = 0
    acked: Dropped = NOTHING  # the part every subscription had acknowledged (queue retention)


async def list_objects(store: MetaStore, partition: TopicName) -> tuple[list[Listed], bool]:
    """The partition's descriptors in offset order, and whether that is all of them.

    The list ends early (``False``) at :data:`DESCRIPTORS_MAX`, at a descriptor that cannot be
    read, or before two that overlap: nothing from there on can be judged, so nothing after it
    may go either.
    """
    prefix = meta_keys.object_descriptors_prefix(partition)
    listed: list[Listed] = []
    start_key: str | None = None
    while True:
        page = await store.snapshot(prefix, limit=DESCRIPTOR_PAGE_KEYS, start_key=start_key)
        for kv in page.kvs:
            if len(listed) == DESCRIPTORS_MAX:
                return listed, False
            entry = _decode(kv, partition)
            if entry is None:
                return listed, False
            if listed and entry.item.first_offset <= listed[-1].item.last_offset:
                log.warning("descriptor %s overlaps the one before it; keeping both", kv.key)
                metrics.RUN_ERRORS.labels("descriptor").inc()
                return listed[:-1], False
            listed.append(entry)
        if not page.more or not page.kvs:
            return listed, True
        start_key = page.kvs[-1].key + "\0"


def _decode(kv: KeyValue, partition: TopicName) -> Listed | None:
    try:
        descriptor = ObjectDescriptor.from_bytes(kv.value)
        owner, start = meta_keys.parse_object_descriptor_key(kv.key)
    except (StorageError, InvalidNameError) as exc:
        log.warning("unreadable object descriptor %s: %s; keeping it and all after it", kv.key, exc)
        metrics.RUN_ERRORS.labels("descriptor").inc()
        return None
    if owner != partition or start != descriptor.first_offset:
        log.warning("descriptor %s describes offsets from %d", kv.key, descriptor.first_offset)
        metrics.RUN_ERRORS.labels("descriptor").inc()
        return None
    item = StoredObject(
        descriptor.first_offset,
        descriptor.last_offset,
        descriptor.size_bytes,
        descriptor.created_ms,
        descriptor.message_count,
    )
    return Listed(kv.key, kv.mod_revision, descriptor.key, item)


class CloudRetention:
    """Deletes expired objects; remembers objects whose delete must be tried again."""

    def __init__(self, store: MetaStore, objects: ObjectStore) -> None:
        self._store = store
        self._objects = objects
        self._orphans: dict[str, None] = {}  # insertion-ordered set of object keys

    @property
    def orphans(self) -> list[str]:
        """Objects whose descriptor is gone but whose delete failed, oldest first."""
        return list(self._orphans)

    async def retry_orphans(self) -> int:
        """Delete the remembered objects again; return how many are gone now."""
        gone = 0
        for key in list(self._orphans):
            try:
                await self._objects.delete(key)
            except StorageError as exc:
                log.warning("object %s still not deleted: %s", key, exc)
                metrics.RUN_ERRORS.labels("object_delete").inc()
                continue
            del self._orphans[key]
            gone += 1
        return gone

    async def enforce(
        self,
        partition: TopicName,
        policy: RetentionPolicy,
        *,
        fence: Fence,
        now_ms: int,
        ack_floor: int | None = None,
    ) -> CloudOutcome:
        """Delete the partition's objects that the topic's retention ``policy`` lets go, and
        (queue retention) those wholly below ``ack_floor``."""
        limits = Limits.of(policy.time_minutes, policy.size_mb)
        # Listed even with no limit: the kept objects are the topic's cloud-tier size.
        listed, complete = await list_objects(self._store, partition)
        count = plan_object_expiry(
            [entry.item for entry in listed],
            complete=complete,
            limits=limits,
            now_ms=now_ms,
            ack_floor=ack_floor,
        )
        acked_count = acked_prefix((entry.item.last_offset for entry in listed[:count]), ack_floor)
        total, acked = NOTHING, NOTHING
        tally = await TallyCell.read(self._store, partition) if count else None
        for index, entry in enumerate(listed[:count]):
            assert tally is not None
            item = entry.item
            gone = Dropped(1, item.message_count, item.size_bytes)
            gone_acked = gone if index < acked_count else NOTHING
            counted = added(tally.value, "cloud", gone, gone_acked, now_ms)
            if not await self._delete_descriptor(entry, fence, tally, counted):
                break  # it changed under us: judge it again next pass, and all after it
            total, acked = total.plus(gone), acked.plus(gone_acked)
            metrics.OBJECTS_DELETED.inc()
            metrics.OBJECT_BYTES_DELETED.inc(item.size_bytes)
            # Counted with its descriptor: an object whose delete fails is an orphan, gone
            # from the topic all the same.
            metrics.count_dropped(
                partition,
                "cloud",
                gone.messages,
                gone.size_bytes,
                gone_acked.messages,
                gone_acked.size_bytes,
            )
            await self._delete_object(entry.object_key)
        if total.units:
            log.info(
                "deleted objects",
                extra={
                    "partition": str(partition),
                    "objects": total.units,
                    "bytes": total.size_bytes,
                    "acked_objects": acked.units,
                    "first_kept": listed[total.units].item.first_offset
                    if total.units < len(listed)
                    else None,
                },
            )
        kept = listed[total.units :]
        kept_bytes = sum(entry.item.size_bytes for entry in kept)
        return CloudOutcome(
            total.units, total.size_bytes, len(kept), kept_bytes, total.messages, acked
        )

    async def _delete_descriptor(
        self, entry: Listed, fence: Fence, tally: TallyCell, counted: RetentionTally
    ) -> bool:
        """Delete the descriptor and write ``counted`` as the partition's tally, if both it
        and the tally are unchanged and this node still leads."""
        result = await (
            self._store.txn()
            .if_mod_revision(entry.key, "==", entry.mod_revision)
            .if_create_revision(fence.election_key, "==", fence.revision)
            .if_mod_revision(tally.key, "==", tally.mod_revision)
            .then_delete(entry.key)
            .then_put(tally.key, encode_model(counted))
            .else_get(fence.election_key)
            .commit()
        )
        if result.succeeded:
            tally.value, tally.mod_revision = counted, result.revision
            return True
        election = result.first_kv(0)
        if election is None or election.create_revision != fence.revision:
            raise DeposedError(f"retention leadership (revision {fence.revision}) ended")
        log.info("descriptor %s (or the tally) changed since it was read; kept", entry.key)
        return False

    async def _delete_object(self, key: str) -> None:
        try:
            await self._objects.delete(key)
        except StorageError as exc:
            metrics.RUN_ERRORS.labels("object_delete").inc()
            if len(self._orphans) < ORPHANS_MAX:
                log.warning("object %s not deleted (%s); trying again next pass", key, exc)
                self._orphans[key] = None
            else:
                log.error("object %s not deleted (%s) and too many to remember: leaked", key, exc)
