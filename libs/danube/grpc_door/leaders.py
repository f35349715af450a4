"""Where a gRPC door sends a client: the gRPC door of a partition's leader (its owner key,
then the owner's registration, ``NodeRecord.grpc_url``), or a discovery instance's (any
topic, in proxy mode). Read from etcd at each lookup: lookups are rare (a client's first,
and one after each retriable failure), and a stale answer would send it to a node that no
longer leads."""

from __future__ import annotations

import contextlib

from danube.meta import MetaDecodeError, MetaStore, TopicName, decode_model
from danube.meta import keys as meta_keys
from danube.meta.doors import owner_door
from danube.meta.records import NodeRecord

DISCOVERY_NODES_READ_MAX = 64


class LeaderDoors:
    """The gRPC doors etcd names."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store

    async def door_of(self, partition: TopicName) -> str | None:
        """The gRPC door of ``partition``'s leader (a partition, or a topic without
        partitions); None when it has no leader now or the leader serves none."""
        key = meta_keys.partition_owner_key(partition)
        _, url = await owner_door(self.store, key, "ingest", "grpc_url")
        return url

    async def discovery_door(self) -> str | None:
        """The gRPC door of a registered discovery instance (the first in key order), or
        None."""
        kvs = await self.store.range(
            meta_keys.nodes_prefix("discovery"), limit=DISCOVERY_NODES_READ_MAX
        )
        for kv in kvs:
            with contextlib.suppress(MetaDecodeError):
                record = decode_model(kv, NodeRecord)
                if record.grpc_url is not None:
                    return record.grpc_url
        return None
