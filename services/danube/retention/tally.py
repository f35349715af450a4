"""The retention tally of a partition (``storage/<ns>/<p>/dropped``, ``RetentionTally``):
what left each tier, by reason, added up in etcd so that it survives leaders and restarts
and discovery can show it (``GET /v1/topics/{ns}/{topic}``).

The cloud step adds each object in the transaction that deletes its descriptor (exact:
the count and the delete are one write); the WAL step adds a drop once ingest answered it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from danube.meta import MetaStore, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import RetentionTally
from danube.retention import metrics
from danube.retention.policy import Dropped

log = logging.getLogger(__name__)

Tier = Literal["wal", "cloud"]
WAL_TALLY_TRIES = 5
"""Compare-and-swap attempts of a WAL drop's count (only a deposed leader races it)."""


def added(
    tally: RetentionTally, tier: Tier, total: Dropped, acked: Dropped, now_ms: int
) -> RetentionTally:
    """``tally`` with ``total`` more left ``tier``, ``acked`` of it for the queue reason."""
    fields = {
        f"{tier}_acked": getattr(tally, f"{tier}_acked").plus(acked.messages, acked.size_bytes),
        f"{tier}_limits": getattr(tally, f"{tier}_limits").plus(
            total.messages - acked.messages, total.size_bytes - acked.size_bytes
        ),
        "updated_ms": max(now_ms, tally.updated_ms),
    }
    return tally.model_copy(update=fields)


@dataclass
class TallyCell:
    """A partition's tally as last read or written, with its mod revision (0: absent)."""

    key: str
    value: RetentionTally
    mod_revision: int

    @classmethod
    async def read(cls, store: MetaStore, partition: TopicName) -> TallyCell:
        """The partition's tally now; a zero tally when it has none (or it does not decode:
        counted, and then replaced by the next write's count from zero)."""
        key = meta_keys.retention_tally_key(partition)
        kv = await store.get(key)
        if kv is None:
            return cls(key, RetentionTally(), 0)
        try:
            value = RetentionTally.model_validate_json(kv.value)
        except ValueError as exc:
            log.warning("unreadable retention tally %s: %s; counting from zero", key, exc)
            metrics.RUN_ERRORS.labels("tally").inc()
            value = RetentionTally()
        return cls(key, value, kv.mod_revision)


async def add_wal_drop(
    store: MetaStore, partition: TopicName, total: Dropped, acked: Dropped, now_ms: int
) -> bool:
    """Add a WAL drop to the partition's tally; ``False`` when every try lost a race (the
    drop then stays uncounted there, logged and counted as an error)."""
    for _ in range(WAL_TALLY_TRIES):
        cell = await TallyCell.read(store, partition)
        result = await (
            store.txn()
            .if_mod_revision(cell.key, "==", cell.mod_revision)
            .then_put(cell.key, encode_model(added(cell.value, "wal", total, acked, now_ms)))
            .commit()
        )
        if result.succeeded:
            return True
    log.warning("WAL drop of %s not added to its tally: it kept changing", partition)
    metrics.RUN_ERRORS.labels("tally").inc()
    return False
