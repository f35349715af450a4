"""Taking over from a killed dispatcher without waiting out its lease (docs/dispatcher.md,
"Taking over from a killed dispatcher"): a claimant that finds a subscription's owner key
held by a dispatcher that is provably gone (danube.runtime.liveness) ends that lease."""

from __future__ import annotations

import logging

from danube.dispatcher import metrics
from danube.meta import MetaError, MetaStore
from danube.meta.kv import KeyValue
from danube.meta.records import Owner
from danube.runtime import liveness

log = logging.getLogger(__name__)


async def end_lease_if_gone(store: MetaStore, me: str, owner: Owner, kv: KeyValue) -> bool:
    """Revoke the lease holding a subscription's owner key (``kv``, naming ``owner``) when
    that dispatcher is provably gone (its door refuses connections) rather than wait out its
    TTL: its registration and every owner key it held go at once, and their claims go
    through now. True when the key may be free now (``me``: the claimant, for the log)."""
    try:
        ended = await liveness.end_lease_if_gone(store, "dispatcher", owner.node_id, kv.lease_id)
    except MetaError as exc:  # etcd away: the claim waits for the lease as before
        log.info("dispatcher %s: %s's lease not ended: %s", me, owner.node_id, exc)
        return False
    if ended is None:
        return False
    door, revoked = ended  # not revoked: another claimant was first
    if revoked:
        metrics.DEAD_OWNERS_ENDED.inc()
        log.warning(
            "dispatcher %s: %s's door %s refuses connections: ended its lease",
            me,
            owner.node_id,
            door,
        )
    return True
