"""Leadership and the in-sync set of a partition, in etcd (docs/replication.md).

Three keys per partition (docs/metadata.md):

- ``assignment`` — ``Assignment(replicas)``: which nodes keep a copy (written when the
  partition is placed, then only by an operator);
- ``state`` — ``PartitionState(leader, leader_epoch, isr)``: changed only by compare-and-swap;
- ``owner`` — ``Owner(node_id, epoch)`` under the leader's node lease: it vanishes when the
  leader dies, which is how the others learn that a new leader is needed.

:func:`claim` makes this node leader with ``leader_epoch + 1``, in one transaction compared on
the three keys' revisions, only if it is in the ISR (so it holds everything committed). A
previous leader that is gone leaves the ISR in the same write: it rejoins once it caught up
again. :func:`update_isr` is the leader's ISR change, compared on the state's revision.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from danube.errors import DanubeError, ErrorKind
from danube.meta import KeyValue, Lease, MetaStore, TopicName, Txn, encode_model, reassign
from danube.meta import keys as meta_keys
from danube.meta.placement import choose_replicas_after, node_loads
from danube.meta.records import Assignment, NodeRecord, Owner, PartitionState
from danube.meta.topics import live_nodes

log = logging.getLogger(__name__)


class NotLeaderError(DanubeError):
    """This node does not (or no longer) lead the partition; ask the leader instead."""

    code = "not_owner"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class NotEnoughReplicasError(DanubeError):
    """Fewer in-sync replicas than the partition's ``min_insync_replicas``, or fewer live
    ingest nodes than its replication factor: nothing was acknowledged."""

    code = "not_enough_replicas"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class PartitionUnavailableError(DanubeError):
    """No replica may lead the partition now (every in-sync replica is gone): it stays so
    until one returns or an operator moves the partition."""

    code = "partition_unavailable"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class LeaderPendingError(DanubeError):
    """The partition has no leader yet, but an eligible replica is alive: one is coming
    (a claim under way, a slow start); asking again soon is worth it."""

    code = "no_leader_yet"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


@dataclass(frozen=True)
class PartitionView:
    """The three keys of a partition as read at one moment (values and revisions)."""

    assignment: Assignment | None
    assignment_rev: int
    state: PartitionState | None
    state_rev: int
    owner: Owner | None
    owner_rev: int


@dataclass
class Term:
    """A won claim: this node leads ``epoch``; ``state_rev`` fences its ISR writes."""

    partition: TopicName
    epoch: int
    isr: tuple[str, ...]
    replicas: tuple[str, ...]
    min_insync: int
    state_rev: int
    epoch_start: int
    owner_rev: int = 0  # the owner key's revision (written with the claim)


def _rev(found: tuple[object, KeyValue] | None) -> int:
    return 0 if found is None else found[1].mod_revision


async def read(store: MetaStore, partition: TopicName) -> PartitionView:
    """The partition's assignment, state and owner, as etcd holds them now."""
    assignment = await store.get_model_kv(meta_keys.partition_assignment_key(partition), Assignment)
    state = await store.get_model_kv(meta_keys.partition_state_key(partition), PartitionState)
    owner = await store.get_model_kv(meta_keys.partition_owner_key(partition), Owner)
    return PartitionView(
        None if assignment is None else assignment[0],
        _rev(assignment),
        None if state is None else state[0],
        _rev(state),
        None if owner is None else owner[0],
        _rev(owner),
    )


def _compare(txn: Txn, key: str, revision: int) -> None:
    if revision == 0:
        txn.if_absent(key)
    else:
        txn.if_mod_revision(key, "==", revision)


async def claim(
    store: MetaStore,
    node_id: str,
    lease: Lease,
    partition: TopicName,
    view: PartitionView,
    *,
    log_end: int,
) -> Term | None:
    """Lead ``partition`` under a new epoch from ``log_end`` (this replica's log end);
    ``None`` if ``view`` is stale (read again).

    The caller checked eligibility on ``view``: this node is a replica, in the ISR, and its
    log is whole (or, after an unclean move, empty at ``restart_at``). The transaction only
    makes sure nothing changed since ``view``.
    """
    assignment, state = view.assignment, view.state
    assert assignment is not None
    assert node_id in assignment.replicas
    lease.ensure_alive()
    if state is None:
        epoch, isr = 1, assignment.replicas  # every replica holds the same empty log
    elif state.restart_at is not None:
        # An unclean move: every replica of the new set starts empty at restart_at.
        assert log_end == state.restart_at
        epoch = state.leader_epoch + 1
        isr = tuple(n for n in state.isr if n in assignment.replicas)
    else:
        assert node_id in state.isr
        epoch = state.leader_epoch + 1
        handed_to_me = state.transfer_to == node_id and state.transfer_from_stays
        gone = state.leader if state.leader != node_id and not handed_to_me else None
        isr = tuple(n for n in state.isr if n != gone and n in assignment.replicas)
    now_ms = int(time.time() * 1000)
    new_state = PartitionState(
        leader=node_id, leader_epoch=epoch, isr=isr, updated_ms=now_ms, epoch_start=log_end
    )
    txn = store.txn()
    _compare(txn, meta_keys.partition_assignment_key(partition), view.assignment_rev)
    _compare(txn, meta_keys.partition_state_key(partition), view.state_rev)
    _compare(txn, meta_keys.partition_owner_key(partition), view.owner_rev)
    state_key = meta_keys.partition_state_key(partition)
    txn.then_put(state_key, encode_model(new_state))
    owner = Owner(node_id=node_id, epoch=epoch, assigned_ms=now_ms)
    txn.then_put(meta_keys.partition_owner_key(partition), encode_model(owner), lease=lease)
    result = await txn.commit()
    if not result.succeeded:
        return None
    log.info("%s: leading epoch %d, in sync: %s", partition, epoch, ", ".join(isr))
    return Term(
        partition,
        epoch,
        isr,
        assignment.replicas,
        assignment.min_insync_replicas,
        result.revision,
        log_end,
        result.revision,
    )


async def reclaim(
    store: MetaStore, node_id: str, lease: Lease, term: Term, view: PartitionView
) -> bool:
    """Write this leader's owner key again, same epoch, under ``lease`` (a new node lease):
    the old one lapsed with the lease in an etcd outage this leader served through. One
    transaction compared on the state's revision as this term last wrote it (nobody claimed,
    moved or changed the ISR since) and on the owner key as ``view`` read it (absent);
    whether it won (False: the term is over or ``view`` is stale)."""
    lease.ensure_alive()
    state_key = meta_keys.partition_state_key(term.partition)
    owner_key = meta_keys.partition_owner_key(term.partition)
    owner = Owner(node_id=node_id, epoch=term.epoch, assigned_ms=int(time.time() * 1000))
    txn = store.txn().if_mod_revision(state_key, "==", term.state_rev)
    _compare(txn, owner_key, view.owner_rev)
    txn.then_put(owner_key, encode_model(owner), lease=lease)
    result = await txn.commit()
    if result.succeeded:
        term.owner_rev = result.revision
        log.info(
            "%s: owner key of epoch %d written again under a new lease", term.partition, term.epoch
        )
    return result.succeeded


def _term_state(
    node_id: str, term: Term, isr: tuple[str, ...], *, transfer_to: str | None = None
) -> PartitionState:
    """The state this leader writes during ``term``: ``isr``, and a transfer if any."""
    now_ms = int(time.time() * 1000)
    return PartitionState(
        leader=node_id,
        leader_epoch=term.epoch,
        isr=isr,
        updated_ms=now_ms,
        epoch_start=term.epoch_start,
        transfer_to=transfer_to,
        transfer_ms=None if transfer_to is None else now_ms,
    )


async def update_isr(store: MetaStore, node_id: str, term: Term, isr: tuple[str, ...]) -> None:
    """Write a new ISR for ``term``; NotLeaderError if the state changed hands."""
    key = meta_keys.partition_state_key(term.partition)
    state = _term_state(node_id, term, isr)
    result = await (
        store.txn()
        .if_mod_revision(key, "==", term.state_rev)
        .then_put(key, encode_model(state))
        .commit()
    )
    if not result.succeeded:
        raise NotLeaderError(f"{term.partition}: its state changed; epoch {term.epoch} is over")
    term.isr, term.state_rev = isr, result.revision
    log.info("%s: in sync now: %s", term.partition, ", ".join(isr))


async def hand_over(
    store: MetaStore, node_id: str, term: Term, to: str, *, stays: bool = False
) -> bool:
    """A controlled transfer's one write: name ``to`` in the state and delete this leader's
    owner key, compared on both keys' revisions (this term still holds). ``to``'s claim
    follows (danube.ingest.roles); the other replicas wait for it. ``stays``: this node
    remains a replica and follows, so the claim keeps it in the ISR. False: the term is
    over."""
    state_key = meta_keys.partition_state_key(term.partition)
    state = _term_state(node_id, term, term.isr, transfer_to=to).model_copy(
        update={"transfer_from_stays": stays}
    )
    owner_key = meta_keys.partition_owner_key(term.partition)
    result = await (
        store.txn()
        .if_mod_revision(state_key, "==", term.state_rev)
        .if_mod_revision(owner_key, "==", term.owner_rev)
        .then_put(state_key, encode_model(state))
        .then_delete(owner_key)
        .commit()
    )
    if result.succeeded:
        log.info("%s: leadership of epoch %d handed to %s", term.partition, term.epoch, to)
    return result.succeeded


async def complete_reassignment(
    store: MetaStore, node_id: str, term: Term, assignment: Assignment, assignment_rev: int
) -> Assignment | None:
    """The leader ends a reassignment whose target set is in sync and leads: the replica
    set becomes the target, the nodes that left are ``retired`` (they delete their copies)
    and leave the ISR, in one transaction compared on the assignment's revision and on
    this term's state. The new assignment; None if either changed meanwhile."""
    done = reassign.completed(assignment, now_ms=int(time.time() * 1000))
    isr = tuple(n for n in term.isr if n in done.replicas)
    state = _term_state(node_id, term, isr)
    assignment_key = meta_keys.partition_assignment_key(term.partition)
    state_key = meta_keys.partition_state_key(term.partition)
    result = await (
        store.txn()
        .if_mod_revision(assignment_key, "==", assignment_rev)
        .if_mod_revision(state_key, "==", term.state_rev)
        .then_put(assignment_key, encode_model(done))
        .then_put(state_key, encode_model(state))
        .commit()
    )
    if not result.succeeded:
        return None
    term.isr, term.state_rev = isr, result.revision
    log.info(
        "%s: reassigned to %s (%s left)",
        term.partition,
        ", ".join(done.replicas),
        ", ".join(done.retired),
    )
    return done


async def release(store: MetaStore, node_id: str, partition: TopicName, epoch: int) -> None:
    """Delete the owner key if it is still this leader's (a clean shutdown hands leadership
    to another in-sync replica at once instead of after the lease's TTL)."""
    key = meta_keys.partition_owner_key(partition)
    owner = await store.get_model_kv(key, Owner)
    if owner is not None and (owner[0].node_id, owner[0].epoch) == (node_id, epoch):
        await store.compare_and_delete(key, expected_mod_revision=owner[1].mod_revision)


async def delete_stale_owner(
    store: MetaStore, node_id: str, partition: TopicName, view: PartitionView
) -> None:
    """Delete an owner key naming this node that an earlier incarnation left (this one may
    not lead: its log is gone), so an in-sync replica can take over now."""
    if view.owner is not None and view.owner.node_id == node_id:
        key = meta_keys.partition_owner_key(partition)
        await store.compare_and_delete(key, expected_mod_revision=view.owner_rev)


async def replace_volatile(store: MetaStore, partition: TopicName, node_id: str) -> bool:
    """A non-reliable partition (memory only: nothing to lose) whose every replica is gone
    moves to ``node_id``: its assignment, state and owner start over in one transaction.
    Returns whether it moved."""
    key = meta_keys.partition_assignment_key(partition)
    found = await store.get_model_kv(key, Assignment)
    if found is None:
        return False
    if await live_nodes(store, "ingest") & set(found[0].replicas):
        return False
    moved = Assignment(replicas=(node_id,), assigned_ms=int(time.time() * 1000))
    result = await (
        store.txn()
        .if_mod_revision(key, "==", found[1].mod_revision)
        .then_put(key, encode_model(moved))
        .then_delete(meta_keys.partition_state_key(partition))
        .commit()
    )
    if result.succeeded:
        log.info("%s (non-reliable) moved to %s: its replicas are gone", partition, node_id)
    return result.succeeded


async def place(
    store: MetaStore, partition: TopicName, *, first: str, factor: int, min_insync: int
) -> Assignment:
    """Write the replica set of a partition that has none yet; return the assignment etcd
    holds afterwards. The nodes and their order (preferred leader first) are chosen by the
    balancer's scores (danube.meta.placement: fewest replicas, then fewest preferred
    leaderships, then bytes/s, then a rotation by the partition's index), after replaying
    the topic's lower partitions not placed yet (so concurrent placements of one topic's
    partitions spread); never a drained node. ``first``, the node answering
    the claim, counts as live even before its key is seen. NotEnoughReplicasError with fewer
    live undrained nodes than ``factor``."""
    key = meta_keys.partition_assignment_key(partition)
    found = await store.get_model(key, Assignment)
    if found is not None:
        return found
    nodes: dict[str, float | None] = {first: None}
    for kv in await store.range(meta_keys.nodes_prefix("ingest")):
        node_id = meta_keys.parse_node_key(kv.key)[1]
        try:
            nodes[node_id] = NodeRecord.model_validate_json(kv.value).load
        except ValueError:
            nodes[node_id] = None
    drains = meta_keys.drains_prefix("ingest")
    drained = {kv.key[len(drains) :] for kv in await store.range(drains)}
    allowed = {node: load for node, load in nodes.items() if node not in drained}
    if len(allowed) < factor:
        raise NotEnoughReplicasError(
            f"{partition}: replication factor {factor} needs {factor} ingest nodes, "
            f"{len(allowed)} are live and not drained"
        )
    replica_sets: list[tuple[str, ...]] = []
    placed: set[TopicName] = set()
    for kv in await store.range(meta_keys.partitions_prefix()):
        if kv.key.endswith("/assignment"):
            try:
                replica_sets.append(Assignment.model_validate_json(kv.value).target)
                placed.add(meta_keys.parse_partition_key(kv.key)[0])
            except ValueError:
                continue
    index = partition.partition or 0
    siblings = partition.parent.partitions(index) if index else []
    unseen = [str(sibling) for sibling in siblings if sibling not in placed]
    loads = node_loads(replica_sets, allowed)
    replicas = choose_replicas_after(str(partition), factor, loads, unseen)
    assignment = Assignment(
        replicas=replicas,
        min_insync_replicas=min(min_insync, factor),
        assigned_ms=int(time.time() * 1000),
    )
    if await store.create_model(key, assignment):
        log.info("%s placed on %s", partition, ", ".join(replicas))
        return assignment
    again = await store.get_model(key, Assignment)
    if again is None:
        raise NotEnoughReplicasError(f"{partition}: its assignment vanished while placing it")
    return again


__all__ = [
    "LeaderPendingError",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "PartitionUnavailableError",
    "PartitionView",
    "Term",
    "claim",
    "complete_reassignment",
    "delete_stale_owner",
    "hand_over",
    "place",
    "read",
    "reclaim",
    "release",
    "update_isr",
]
