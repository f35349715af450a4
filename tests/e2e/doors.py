"""What the door tests read of a running mesh: each node's registered doors (etcd) and a
metric summed from a /metrics page."""

from __future__ import annotations

from typing import Literal

import httpx

from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.keys import ServiceKind
from danube.meta.records import NodeRecord


async def registered_doors(
    store: MetaStore, kind: ServiceKind, door: Literal["data_url", "grpc_url"] = "data_url"
) -> dict[str, str]:
    """Each ``kind`` node's door as it registered it, by node id (every node has one)."""
    doors = {}
    for kv in await store.range(meta_keys.nodes_prefix(kind)):
        record = NodeRecord.model_validate_json(kv.value)
        url = getattr(record, door)
        assert url is not None, f"{record.node_id} registered no {door}"
        doors[record.node_id] = url
    return doors


async def metric(http: httpx.AsyncClient, url: str, name: str) -> float:
    """The sum of every sample of ``name`` (all its labels) on the page at ``url``."""
    text = (await http.get(url)).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )
