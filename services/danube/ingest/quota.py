"""The backlog quota with policy ``refuse``, at a partition's leader (docs/policies.md).

A produce that carries a quota is refused (``backlog_quota_exceeded``, retriable) while some
subscription of the partition has that many messages or more unacknowledged: the backlog of
each subscription is counted exactly (:func:`danube.wire.limits.backlog`) between its stored
cursor and the partition's committed end. Cursors are read from etcd, at most every
``CURSORS_FRESH_S`` (etcd stays off the produce path but for that read, and only for
topics with a quota); a dispatcher stores a cursor before it answers an ack, so producers
resume at most that long after consumers catch up.
"""

from __future__ import annotations

import contextlib
import logging
import time

from danube.errors import DanubeError, ErrorKind
from danube.meta import MetaError, MetaStore, TopicName, decode_model
from danube.meta import keys as meta_keys
from danube.meta.errors import MetaDecodeError
from danube.meta.records import SubscriptionCursor
from danube.names import InvalidNameError
from danube.wire.limits import BACKLOG_QUOTA_EXCEEDED, backlog

log = logging.getLogger(__name__)

CURSORS_FRESH_S = 0.25
_CURSOR_RECORD = "cursors/"


class BacklogQuotaError(DanubeError):
    """A subscription of the partition is at its backlog quota: retry once it catches up."""

    code = BACKLOG_QUOTA_EXCEEDED
    kind = ErrorKind.OVER_LIMIT
    retriable = True


class BacklogGuard:
    """The cursors of one partition's subscriptions, read from etcd when stale."""

    def __init__(self, store: MetaStore, partition: TopicName) -> None:
        self.store = store
        self.partition = partition
        self._cursors: dict[str, SubscriptionCursor] = {}
        self._read_s: float | None = None

    async def check(self, quota: int, end_offset: int) -> None:
        """BacklogQuotaError when a subscription has ``quota`` or more messages unacked
        below ``end_offset``. When etcd cannot be read, the cursors read last are used."""
        now_s = time.monotonic()
        if self._read_s is None or now_s - self._read_s >= CURSORS_FRESH_S:
            with contextlib.suppress(MetaError):
                self._cursors = await self._read()
                self._read_s = now_s
        for sub, cursor in self._cursors.items():
            behind = backlog(cursor.next_offset, cursor.acked_beyond, end_offset) or 0
            if behind >= quota:
                raise BacklogQuotaError(
                    f"subscription {sub} of {self.partition} has {behind} messages unacked, "
                    f"at its backlog quota of {quota}; retry once consumers catch up"
                )

    async def _read(self) -> dict[str, SubscriptionCursor]:
        # Subscriptions of the whole topic keep one cursor per partition; a subscription of
        # one partition (Danube's clients) lives under the partition's own name.
        scopes = {self.partition.parent, self.partition}
        found: dict[str, SubscriptionCursor] = {}
        for scope in scopes:
            for kv in await self.store.range(meta_keys.subscriptions_prefix(scope)):
                try:
                    _, sub, record = meta_keys.parse_subscription_key(kv.key)
                    if record != _CURSOR_RECORD + self.partition.topic:
                        continue
                    found[f"{scope.topic}/{sub}"] = decode_model(kv, SubscriptionCursor)
                except (InvalidNameError, MetaDecodeError) as exc:
                    log.debug("backlog quota: skipping %s: %s", kv.key, exc)
        return found
