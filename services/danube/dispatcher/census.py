"""The counts balancing needs, read from etcd (danube.dispatcher.balance decides on them):
live dispatchers (``nodes/dispatcher/``), drained ones (``drains/dispatcher/``) and the owner
of every owned subscription (``subscriptions/<ns>/<t>/<sub>/owner``)."""

from __future__ import annotations

from collections import Counter

from danube.dispatcher.balance import Census
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Owner
from danube.meta.topics import live_nodes


async def read_census(store: MetaStore) -> Census:
    """One count. The subscriptions prefix holds configs and cursors too; only owner keys
    count (a range of it all is what etcd offers without a secondary index)."""
    live = await live_nodes(store, "dispatcher")
    prefix = meta_keys.drains_prefix("dispatcher")
    drained = frozenset(kv.key[len(prefix) :] for kv in await store.range(prefix))
    owned: Counter[str] = Counter()
    for kv in await store.range(meta_keys.SUBSCRIPTIONS_PREFIX):
        if kv.key.endswith("/owner") and meta_keys.parse_subscription_key(kv.key)[2] == "owner":
            owned[Owner.model_validate_json(kv.value).node_id] += 1
    return Census(live=frozenset(live), drained=drained, owned=dict(owned))
