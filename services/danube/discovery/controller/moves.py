"""An operator moves a partition to other ingest nodes (``POST
/v1/partitions/{ns}/{partition}/move``, ``danube admin partitions move``; docs/replication.md).

Replicas never move on their own: a partition whose every in-sync replica is gone stays
unavailable (503 ``partition_unavailable``) until one returns. Moving it to other nodes then
gives up whatever only those replicas held, so it is an explicit, **unclean** move:

- the new replica set and a ``restart_at`` offset are written to the partition's keys in one
  transaction, compared on their revisions and on there being no leader (``owner`` absent);
- ``restart_at`` is past every offset the mesh knows was handed out: the cloud tier's end,
  the start of the last leader's epoch, and every subscription's acknowledged position. So no
  offset a consumer saw is ever reused; offsets from the cloud tier's end up to ``restart_at``
  are a gap readers skip;
- the new replicas start an empty log at ``restart_at`` and one of them claims the next epoch
  (danube.ingest.roles ``RESTART``). The answer reports the range given up.

A partition that never had a leader (or a non-reliable one: memory only) holds nothing to
give up: its assignment is simply rewritten, no ``unclean`` needed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from danube.discovery.errors import BadRequestError, ConflictError, NotFoundError
from danube.meta import MetaStore, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import (
    Assignment,
    Owner,
    PartitionState,
    SubscriptionCursor,
    TopicConfig,
    UploaderCheckpoint,
)
from danube.meta.topics import live_nodes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveResult:
    """What a move did: the new replica set, and (unclean) where the log continues and
    which offsets were given up: ``[cloud_end, restart_at)`` for sure, and whatever the lost
    replicas acknowledged at or past ``restart_at`` (unknowable once they are gone)."""

    partition: TopicName
    previous_replicas: tuple[str, ...]
    replicas: tuple[str, ...]
    unclean: bool
    cloud_end: int
    restart_at: int | None


async def _acked_end(store: MetaStore, partition: TopicName) -> int:
    """The highest offset any subscription acknowledged in ``partition``, plus one."""
    end = 0
    prefix = meta_keys.subscriptions_prefix(partition.parent)
    suffix = "/cursors/" + partition.topic
    for kv in await store.range(prefix):
        if kv.key.endswith(suffix):
            cursor = SubscriptionCursor.model_validate_json(kv.value)
            end = max(end, cursor.next_offset, *(o + 1 for o in cursor.acked_beyond))
    return end


async def move_partition(
    store: MetaStore,
    partition: TopicName,
    config: TopicConfig,
    replicas: tuple[str, ...],
    *,
    unclean: bool,
) -> MoveResult:
    """Move ``partition`` (of a topic with ``config``) to ``replicas`` (see the module
    docstring). BadRequestError for nodes that are not live ingest nodes; ConflictError
    ``partition_available`` while it has a leader, ``unclean_required`` when it would give
    up data and ``unclean`` is False, ``conflict`` when its keys changed meanwhile."""
    await _check_live(store, replicas)
    a_key = meta_keys.partition_assignment_key(partition)
    s_key = meta_keys.partition_state_key(partition)
    o_key = meta_keys.partition_owner_key(partition)
    assignment = await store.get_model_kv(a_key, Assignment)
    state = await store.get_model_kv(s_key, PartitionState)
    owner = await store.get_model_kv(o_key, Owner)
    if owner is not None:
        raise ConflictError(
            f"{partition} has a leader ({owner[0].node_id}, epoch {owner[0].epoch}): a move "
            "only applies to a partition none of whose in-sync replicas is left",
            code="partition_available",
        )
    previous = () if assignment is None else assignment[0].replicas
    min_insync = 1 if assignment is None else assignment[0].min_insync_replicas
    now_ms = int(time.time() * 1000)
    new_assignment = Assignment(
        replicas=replicas, min_insync_replicas=min(min_insync, len(replicas)), assigned_ms=now_ms
    )
    cloud_end = await _cloud_end(store, partition)
    holds_data = state is not None and config.dispatch == "reliable"
    restart_at: int | None = None
    txn = store.txn()
    if assignment is None:
        txn.if_absent(a_key)
    else:
        txn.if_mod_revision(a_key, "==", assignment[1].mod_revision)
    txn.if_absent(o_key)
    txn.then_put(a_key, encode_model(new_assignment))
    if state is None:
        txn.if_absent(s_key)
    else:
        txn.if_mod_revision(s_key, "==", state[1].mod_revision)
    if holds_data:
        assert state is not None
        if not unclean:
            raise ConflictError(
                f"moving {partition} from {', '.join(previous)} gives up every offset from "
                f"{cloud_end} on that only those replicas held: repeat with unclean",
                code="unclean_required",
            )
        restart_at = max(cloud_end, state[0].epoch_start or 0, await _acked_end(store, partition))
        restarted = state[0].model_copy(
            update={"isr": replicas, "restart_at": restart_at, "updated_ms": now_ms}
        )
        txn.then_put(s_key, encode_model(restarted))
    elif state is not None:
        txn.then_delete(s_key)  # nothing held: the new set starts like a new partition
    if not (await txn.commit()).succeeded:
        raise ConflictError(f"{partition} changed during the move: try again", code="conflict")
    log.warning(
        "%s moved from %s to %s%s",
        partition,
        ", ".join(previous) or "nowhere",
        ", ".join(replicas),
        "" if restart_at is None else f" (unclean: continues at {restart_at})",
    )
    return MoveResult(partition, previous, replicas, holds_data, cloud_end, restart_at)


async def _check_live(store: MetaStore, replicas: tuple[str, ...]) -> None:
    """BadRequestError ``node_not_live`` naming the ``replicas`` that are not live ingest
    nodes."""
    live = await live_nodes(store, "ingest")
    missing = [node for node in replicas if node not in live]
    if missing:
        raise BadRequestError(
            f"not live ingest nodes: {', '.join(missing)} (live: {', '.join(sorted(live))})",
            code="node_not_live",
        )


async def _cloud_end(store: MetaStore, partition: TopicName) -> int:
    """The first offset of ``partition`` the cloud tier does not hold."""
    checkpoint = await store.get_model(
        meta_keys.uploader_checkpoint_key(partition), UploaderCheckpoint
    )
    return 0 if checkpoint is None else checkpoint.uploaded_through + 1


def check_partition(partition: TopicName, config: TopicConfig) -> None:
    """NotFoundError unless ``partition`` is one of its topic's partitions."""
    index = partition.partition
    if (config.partitions == 0) != (index is None) or (
        index is not None and index >= config.partitions
    ):
        raise NotFoundError(
            f"{partition} is not a partition of its topic", code="partition_not_found"
        )
