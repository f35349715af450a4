"""Every partition's records (``assignment`` with its revision, ``state``, ``owner``) and
the drained ingest nodes, each read in one range: what the balancer plans from and what the
reassignment and drain routes report."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from danube.meta import InvalidNameError, MetaDecodeError, MetaStore, TopicName, decode_model
from danube.meta import keys as meta_keys
from danube.meta.records import Assignment, Owner, PartitionState

log = logging.getLogger(__name__)


@dataclass
class PartitionRecords:
    """One partition's keys as read (None: absent or unreadable). ``assignment_revision``
    is the mod revision a reassignment compares on."""

    assignment: Assignment | None = None
    assignment_revision: int = 0
    state: PartitionState | None = None
    owner: Owner | None = None


async def read_partition_records(store: MetaStore) -> dict[TopicName, PartitionRecords]:
    """Every partition's records; a key that does not decode is logged and skipped."""
    found: dict[TopicName, PartitionRecords] = {}
    for kv in await store.range(meta_keys.partitions_prefix()):
        try:
            partition, name = meta_keys.parse_partition_key(kv.key)
            if name == "assignment":
                records = found.setdefault(partition, PartitionRecords())
                records.assignment = decode_model(kv, Assignment)
                records.assignment_revision = kv.mod_revision
            elif name == "state":
                found.setdefault(partition, PartitionRecords()).state = decode_model(
                    kv, PartitionState
                )
            elif name == "owner":
                found.setdefault(partition, PartitionRecords()).owner = decode_model(kv, Owner)
        except (MetaDecodeError, InvalidNameError) as exc:
            log.warning("skipping %s: %s", kv.key, exc)
    return found


async def read_drained(store: MetaStore) -> frozenset[str]:
    """The ingest nodes an operator drained."""
    prefix = meta_keys.drains_prefix("ingest")
    return frozenset(kv.key[len(prefix) :] for kv in await store.range(prefix))
