"""Who may write a partition, and which offsets it may hand out.

Two etcd keys per partition (docs/metadata.md):

- ``partitions/<ns>/<p>/owner`` — ``Owner(node_id, epoch)``, attached to the owner's node
  lease, so it vanishes when the node dies;
- ``partitions/<ns>/<p>/reservation`` — ``OffsetReservation(node_id, epoch, end_offset)``,
  not leased: the owner of ``epoch`` may assign offsets below ``end_offset`` only.

A claim raises the epoch by one and writes both keys in one transaction, compared on the
revisions it read, so of two claimants exactly one wins. A new owner starts at the old
reservation's end: whatever the old owner acknowledged lies below it, so no offset is
ever handed out twice, even when the old owner's WAL is gone. One exception keeps
restarts exact: the same node, resuming the same epoch (its local ``owner.json`` says
so), in ``fsync`` durability, continues right after its own WAL: everything it ever
acknowledged under that epoch is in that WAL, and nobody else wrote since.

The reservation is extended ahead of use (a block at a time, in the background once half
of it is used), so etcd is not on the produce path.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from danube.errors import DanubeError
from danube.meta import Lease, MetaStore, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import OffsetReservation, Owner

log = logging.getLogger(__name__)

RESERVATION_BLOCK = 100_000  # offsets reserved per etcd write
_CLAIM_ATTEMPTS_MAX = 5


class OwnershipError(DanubeError):
    """This node does not (or no longer) own the partition; ask the owner instead."""

    code = "not_owner"
    retriable = True


@dataclass(frozen=True)
class LocalState:
    """What the node's own disk says about a partition, read before claiming it."""

    next_offset: int  # the WAL's next offset
    epoch: int | None  # the epoch recorded in owner.json, if any
    exact_resume_safe: bool  # True only for fsync durability (acks imply the WAL has them)


@dataclass
class Claim:
    """A won claim: the epoch, where offsets start, and how far they are reserved."""

    partition: TopicName
    epoch: int
    start_offset: int
    reserved_end: int
    reservation_revision: int  # the reservation key's mod revision: extensions compare on it


async def claim(
    store: MetaStore, node_id: str, lease: Lease, partition: TopicName, local: LocalState
) -> Claim:
    """Take ownership of ``partition``; OwnershipError if another live node holds it."""
    owner_key = meta_keys.partition_owner_key(partition)
    reservation_key = meta_keys.offset_reservation_key(partition)
    for _ in range(_CLAIM_ATTEMPTS_MAX):
        lease.ensure_alive()
        owner = await store.get_model_kv(owner_key, Owner)
        if owner is not None and owner[0].node_id != node_id:
            raise OwnershipError(f"{partition} is owned by {owner[0].node_id}")
        reservation = await store.get_model_kv(reservation_key, OffsetReservation)
        previous = reservation[0] if reservation is not None else None
        epoch = max(previous.epoch if previous else 0, owner[0].epoch if owner else 0) + 1
        start = start_offset(node_id, previous, local)
        end = max(start + RESERVATION_BLOCK, previous.end_offset if previous else 0)
        txn = store.txn()
        if owner is None:
            txn.if_absent(owner_key)
        else:
            txn.if_mod_revision(owner_key, "==", owner[1].mod_revision)
        if reservation is None:
            txn.if_absent(reservation_key)
        else:
            txn.if_mod_revision(reservation_key, "==", reservation[1].mod_revision)
        now_ms = int(time.time() * 1000)
        txn.then_put(
            owner_key,
            encode_model(Owner(node_id=node_id, epoch=epoch, assigned_ms=now_ms)),
            lease=lease,
        )
        txn.then_put(
            reservation_key,
            encode_model(OffsetReservation(node_id=node_id, epoch=epoch, end_offset=end)),
        )
        result = await txn.commit()
        if result.succeeded:
            log.info(
                "claimed %s: epoch %d, offsets from %d, reserved below %d",
                partition,
                epoch,
                start,
                end,
            )
            return Claim(partition, epoch, start, end, result.revision)
    raise OwnershipError(f"{partition}: lost {_CLAIM_ATTEMPTS_MAX} claim races in a row")


def start_offset(node_id: str, previous: OffsetReservation | None, local: LocalState) -> int:
    """Where a new epoch starts handing out offsets (see the module docstring)."""
    if previous is None:
        return local.next_offset
    resumes_own_epoch = (
        previous.node_id == node_id and local.epoch == previous.epoch and local.exact_resume_safe
    )
    if resumes_own_epoch:
        return local.next_offset
    return max(local.next_offset, previous.end_offset)


async def extend(store: MetaStore, node_id: str, claim_: Claim, needed_end: int) -> None:
    """Move the reservation's end past ``needed_end``; OwnershipError if it changed hands."""
    new_end = max(needed_end, claim_.reserved_end) + RESERVATION_BLOCK
    key = meta_keys.offset_reservation_key(claim_.partition)
    value = OffsetReservation(node_id=node_id, epoch=claim_.epoch, end_offset=new_end)
    result = await (
        store.txn()
        .if_mod_revision(key, "==", claim_.reservation_revision)
        .then_put(key, encode_model(value))
        .commit()
    )
    if not result.succeeded:
        raise OwnershipError(f"{claim_.partition}: the offset reservation changed hands")
    claim_.reserved_end = new_end
    claim_.reservation_revision = result.revision


async def release(store: MetaStore, node_id: str, partition: TopicName) -> None:
    """Delete the owner key if it is still ours (a clean shutdown hands the partition on)."""
    key = meta_keys.partition_owner_key(partition)
    owner = await store.get_model_kv(key, Owner)
    if owner is not None and owner[0].node_id == node_id:
        await store.compare_and_delete(key, expected_mod_revision=owner[1].mod_revision)


async def owned_by(store: MetaStore, node_id: str) -> list[TopicName]:
    """The partitions whose owner key names ``node_id`` (a restarted node takes them back)."""
    found = []
    for kv in await store.range(meta_keys.partitions_prefix()):
        partition, record = meta_keys.parse_partition_key(kv.key)
        if record == "owner" and Owner.model_validate_json(kv.value).node_id == node_id:
            found.append(partition)
    return found
