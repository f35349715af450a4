"""Partition operations: an operator's move of a partition to other ingest nodes."""

from __future__ import annotations

from fastapi import APIRouter

from danube.discovery.api.params import Namespace, Partition
from danube.discovery.api.state import ServicesDep
from danube.discovery.models import MoveOut, MoveRequest
from danube.discovery.moves import check_partition, move_partition
from danube.meta import TopicName
from danube.meta import keys as meta_keys
from danube.names import validate_segment

router = APIRouter(prefix="/v1")


@router.post("/partitions/{ns}/{partition}/move", response_model=MoveOut)
async def move(
    ns: Namespace, partition: Partition, body: MoveRequest, services: ServicesDep
) -> MoveOut:
    """Give the partition a new replica set. Only while it has no leader; when that gives
    up data the old replicas held, only with ``unclean`` (docs/replication.md)."""
    validate_segment("namespace", ns)
    name = TopicName(ns, partition)
    config = await services.catalog.get_topic(name.parent)
    check_partition(name, config)
    for node in body.replicas:
        meta_keys.validate_node_id(node)
    moved = await move_partition(
        services.store, name, config, tuple(body.replicas), unclean=body.unclean
    )
    return MoveOut(
        partition=str(moved.partition),
        previous_replicas=list(moved.previous_replicas),
        replicas=list(moved.replicas),
        unclean=moved.unclean,
        continues_at=moved.restart_at,
        given_up_from=moved.cloud_end if moved.unclean else None,
    )
