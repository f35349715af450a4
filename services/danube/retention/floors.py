"""The ack floor of a partition under queue retention: the lowest offset that some
subscription reading it has not acknowledged, read from the cursors dispatchers store.

A dispatcher stores a subscription's cursor (``subscriptions/<ns>/<t>/<sub>/cursors/<p>``,
``SubscriptionCursor``) before it answers an ack, and every offset below its ``next_offset``
is acknowledged (docs/dispatcher.md, "Cursor") — except delayed messages, acked in the cursor
when read but delivered at their time: those not delivered yet lie at or above the cursor's
``delay_from``, read again from the log after a restart, so a cursor holds the lower of the
two (docs/dispatcher.md, "Delayed delivery"). The floor is the lowest such offset over
every subscription of the partition: those of the whole topic and those of the partition
alone (Danube's clients subscribe to one partition, under the partition's own name). Anything
below the floor has been acknowledged by every subscription that exists now.

Every doubt keeps data: a subscription with a config but no cursor for the partition yet (it
has not read it), or a cursor that does not decode, has floor 0. No subscription at all gives
``None``: queue retention then drops nothing, and only the time and size limits apply.
"""

from __future__ import annotations

import logging

from danube.meta import KeyValue, MetaDecodeError, MetaStore, TopicName, decode_model
from danube.meta import keys as meta_keys
from danube.meta.records import SubscriptionCursor
from danube.names import InvalidNameError
from danube.retention import metrics

log = logging.getLogger(__name__)

_CONFIG_RECORD = "config"
_CURSOR_RECORD = "cursors/"


async def ack_floor(store: MetaStore, partition: TopicName) -> int | None:
    """The partition's ack floor (see the module docstring); ``None`` when no subscription
    reads it."""
    scopes = [partition.parent]
    if partition != partition.parent:
        scopes.append(partition)
    floors: dict[str, int] = {}  # "<scope>/<sub>" -> its floor in this partition
    cursor_record = _CURSOR_RECORD + partition.topic
    for scope in scopes:
        for kv in await store.range(meta_keys.subscriptions_prefix(scope)):
            try:
                _, sub, record = meta_keys.parse_subscription_key(kv.key)
            except InvalidNameError as exc:
                log.warning("queue retention: unreadable subscription key %s: %s", kv.key, exc)
                metrics.RUN_ERRORS.labels("cursor").inc()
                return 0
            name = f"{scope.topic}/{sub}"
            if record == _CONFIG_RECORD:
                floors.setdefault(name, 0)  # until its cursor is found: it holds everything
            elif record == cursor_record:
                floors[name] = _held_from(kv)
    return min(floors.values()) if floors else None


def _held_from(kv: KeyValue) -> int:
    """The lowest offset the cursor still needs: its next offset, or its delayed messages'
    ``delay_from`` when lower."""
    try:
        cursor = decode_model(kv, SubscriptionCursor)
    except MetaDecodeError as exc:
        log.warning("queue retention: unreadable cursor %s: %s; it holds everything", kv.key, exc)
        metrics.RUN_ERRORS.labels("cursor").inc()
        return 0
    if cursor.delay_from is not None:
        return min(cursor.next_offset, cursor.delay_from)
    return cursor.next_offset
