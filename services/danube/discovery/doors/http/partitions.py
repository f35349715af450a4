"""Partition operations: an operator's move of a partition to other ingest nodes, and the
skip of a damaged WAL range that stops its uploads."""

from __future__ import annotations

from fastapi import APIRouter

from danube.discovery.controller.moves import check_partition, move_partition
from danube.discovery.doors.bodies.api import MoveRequest, SkipUploadRequest
from danube.discovery.doors.http.params import Namespace, Partition
from danube.discovery.doors.http.state import ServicesDep
from danube.discovery.errors import ConflictError
from danube.meta import TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import UploaderCheckpoint
from danube.names import validate_segment
from danube.wire.api.catalog import MoveOut, SkipUploadOut

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


@router.post("/partitions/{ns}/{partition}/uploads/skip", response_model=SkipUploadOut)
async def skip_upload(
    ns: str, partition: str, body: SkipUploadRequest, services: ServicesDep
) -> SkipUploadOut:
    """Let the partition's uploads go on past the damaged WAL range they stopped at: its
    checkpoint moves past it (compared on its revision, so it never overwrites an upload
    that landed meanwhile). The range is never uploaded; retention may then drop it."""
    validate_segment("namespace", ns)
    name = TopicName(ns, partition)
    check_partition(name, await services.catalog.get_topic(name.parent))
    key = meta_keys.uploader_checkpoint_key(name)
    found = await services.store.get_model_kv(key, UploaderCheckpoint)
    damaged = None if found is None else found[0].damaged
    if found is None or damaged is None:
        raise ConflictError(f"the uploads of {name} are not stopped at damage", code="not_damaged")
    checkpoint, kv = found
    start = checkpoint.uploaded_through + 1
    end = damaged.to_offset if body.to_offset is None else body.to_offset
    if end <= start:
        raise ConflictError(f"uploads of {name} already go on from {start}", code="skip_backwards")
    value = checkpoint.model_copy(
        update={
            "uploaded_through": end - 1,
            "pending_end": None,
            "damaged": None,
            "skipped_offsets": checkpoint.skipped_offsets + end - start,
        }
    )
    txn = services.store.txn().if_mod_revision(key, "==", kv.mod_revision)
    result = await txn.then_put(key, encode_model(value)).commit()
    if not result.succeeded:
        raise ConflictError(f"the upload checkpoint of {name} changed; ask again", code="conflict")
    return SkipUploadOut(partition=str(name), from_offset=start, to_offset=end, skipped=end - start)
