"""Where a node's doors are, as etcd says (DESIGN §10): the URL a node advertised in its
registration (``NodeRecord.data_url``, ``grpc_url``), and the door of whoever owns a key (a
partition's leader, a subscription's dispatcher). Read at each call: a stale answer would
send a client to a node that no longer owns."""

from __future__ import annotations

from typing import Literal

from danube.meta import keys as meta_keys
from danube.meta.keys import ServiceKind
from danube.meta.records import NodeRecord, Owner
from danube.meta.store import MetaStore

Door = Literal["data_url", "grpc_url"]


async def node_door(
    store: MetaStore, kind: ServiceKind, node_id: str, door: Door = "data_url"
) -> str | None:
    """The door ``node_id`` advertises (one read); None when it is not registered or
    advertises none."""
    record = await store.get_model(meta_keys.node_key(kind, node_id), NodeRecord)
    return None if record is None else getattr(record, door)


async def owner_door(
    store: MetaStore, owner_key: str, kind: ServiceKind, door: Door = "data_url"
) -> tuple[Owner | None, str | None]:
    """Who owns ``owner_key`` and the door it advertises (two reads); ``(None, None)``
    when nobody owns it."""
    owner = await store.get_model(owner_key, Owner)
    if owner is None:
        return None, None
    return owner, await node_door(store, kind, owner.node_id, door)
