"""Admin and lookup routes: cluster, namespaces, topics (create, describe, delete), lookup."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Body, Response

from danube.bus import Bus, BusError
from danube.discovery import metrics
from danube.discovery.doors.bodies.api import NamespacePatch, NamespaceSpec, TopicSpec
from danube.discovery.doors.bodies.policies import PoliciesSpec, TopicPatch, check_message_size
from danube.discovery.doors.http.params import Namespace, Topic
from danube.discovery.doors.http.producers import producers_of
from danube.discovery.doors.http.state import Services, ServicesDep
from danube.discovery.doors.http.subscriptions import list_subscriptions
from danube.meta import MetaDecodeError, MetaStore, TopicName, decode_model
from danube.meta import keys as meta_keys
from danube.meta.doors import owner_door
from danube.meta.records import (
    NamespacePolicy,
    NodeRecord,
    Owner,
    Policies,
    RetentionTally,
    TopicConfig,
    UploaderCheckpoint,
)
from danube.names import user_topic, validate_segment
from danube.storage import StorageError, topic_prefix
from danube.wire.api.catalog import (
    ClusterOut,
    ControllerOut,
    LookupOut,
    LookupPartitionOut,
    NamespaceList,
    NamespaceOut,
    NodeOut,
    OffsetsOut,
    OwnerOut,
    PartitionDetail,
    SubscriptionLookupOut,
    TopicConfigOut,
    TopicDetail,
    TopicList,
    TopicOut,
)

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

# Describe asks each partition's owner for its WAL offsets; an owner that does not answer
# in this time is shown with null offsets rather than failing the whole answer.
STATS_TIMEOUT_S = 1.0
STATS_CONCURRENCY = 32


def _namespace_out(name: str, policy: NamespacePolicy) -> NamespaceOut:
    return NamespaceOut(
        name=name,
        max_topics=policy.max_topics,
        retention=policy.retention,
        created_ms=policy.created_ms,
        replication_factor=policy.replication_factor,
        min_insync_replicas=policy.min_insync_replicas,
        policies=policy.policies,
    )


def _config_out(config: TopicConfig, namespace: Policies | None = None) -> TopicConfigOut:
    return TopicConfigOut(
        partitions=config.partitions,
        dispatch=config.dispatch,
        durability=config.durability,
        retention=config.retention,
        created_ms=config.created_ms,
        replication_factor=config.replication_factor,
        min_insync_replicas=config.min_insync_replicas,
        policies=config.policies,
        effective_policies=config.policies.over(namespace),
    )


def _check_policies(services: Services, policies: PoliciesSpec | None) -> None:
    check_message_size(policies, services.admission.limits.payload_bytes_max)


async def _namespace_policies(services: Services, namespace: str) -> Policies | None:
    found = await services.catalog.cached_namespace(namespace)
    return None if found is None else found.policies


async def _topic_out(services: Services, name: TopicName, config: TopicConfig) -> TopicOut:
    namespace = await _namespace_policies(services, name.namespace)
    return TopicOut(name=str(name), config=_config_out(config, namespace))


async def _owners(
    store: MetaStore, topic: TopicName, names: Sequence[TopicName]
) -> list[OwnerOut | None]:
    """The owner of each partition, read in one range (the topic's partitions share the
    prefix ``partitions/<ns>/<topic>``; other topics caught by it are filtered out)."""
    wanted = {meta_keys.partition_owner_key(name): i for i, name in enumerate(names)}
    owners: list[OwnerOut | None] = [None] * len(names)
    prefix = meta_keys.partitions_prefix(topic.namespace) + topic.topic
    for kv in await store.range(prefix):
        index = wanted.get(kv.key)
        if index is not None:
            owner = decode_model(kv, Owner)
            owners[index] = OwnerOut(node_id=owner.node_id, epoch=owner.epoch)
    return owners


async def _offsets(
    bus: Bus, store: MetaStore, name: TopicName, gate: asyncio.Semaphore
) -> OffsetsOut:
    async with gate:
        found: dict[str, Any] = {}
        try:
            reply = await bus.request(bus.subjects.wal_stats(name), b"", timeout_s=STATS_TIMEOUT_S)
            doc = orjson.loads(reply.body)
            wal = doc["wal"]
            found = {
                "wal_start": int(wal["start_offset"]),
                "next_offset": int(doc["high_watermark"]),
                "leader_end": int(wal["durable_next"]),
                "leader_epoch": int(doc["leader_epoch"]),
                "replicas": list(doc["replicas"]),
                "isr": list(doc["isr"]),
                "followers": dict(doc["followers"]),
            }
        except (BusError, KeyError, ValueError, TypeError):
            pass  # no leader right now, or a slow one: shown as unknown
        checkpoint = await store.get_model(
            meta_keys.uploader_checkpoint_key(name), UploaderCheckpoint
        )
        found["retention_dropped"] = await _retention_dropped(store, name)
    uploaded = None
    if checkpoint is not None and checkpoint.uploaded_through >= 0:
        uploaded = checkpoint.uploaded_through
    if checkpoint is not None:
        damaged = checkpoint.damaged
        found["upload_damaged"] = None if damaged is None else damaged.model_dump()
        found["upload_skipped_offsets"] = checkpoint.skipped_offsets
    found.setdefault("wal_start", None)
    found.setdefault("next_offset", None)
    return OffsetsOut.model_validate({**found, "uploaded_through": uploaded})


async def _retention_dropped(store: MetaStore, name: TopicName) -> dict[str, Any] | None:
    """The partition's retention tally without its time; ``None`` when it has none (or one
    that does not decode: retention counts that and starts it again)."""
    try:
        tally = await store.get_model(meta_keys.retention_tally_key(name), RetentionTally)
    except MetaDecodeError:
        return None
    return None if tally is None else tally.model_dump(exclude={"updated_ms"})


# --- cluster -------------------------------------------------------------------------


@router.get("/cluster", response_model=ClusterOut)
async def cluster(services: ServicesDep) -> ClusterOut:
    """Registered nodes by service kind (ingest nodes an operator drained say so), and the
    controller's leader."""
    nodes: dict[str, list[NodeOut]] = {kind: [] for kind in meta_keys.SERVICE_KINDS}
    drains = meta_keys.drains_prefix()
    drained = {kv.key[len(drains) :] for kv in await services.store.range(drains)}
    for kv in await services.store.range(meta_keys.nodes_prefix()):
        record = decode_model(kv, NodeRecord)
        nodes[record.kind].append(
            NodeOut(
                node_id=record.node_id,
                address=record.address,
                started_ms=record.started_ms,
                drained=f"{record.kind}/{record.node_id}" in drained,
            )
        )
    leader = await services.controller.leader()
    return ClusterOut(nodes=nodes, controller=ControllerOut(leader=leader))


# --- namespaces ------------------------------------------------------------------------


@router.get("/namespaces", response_model=NamespaceList)
async def list_namespaces(services: ServicesDep) -> NamespaceList:
    """Every namespace."""
    return NamespaceList(namespaces=await services.catalog.list_namespaces())


@router.get("/namespaces/{ns}", response_model=NamespaceOut)
async def get_namespace(ns: Namespace, services: ServicesDep) -> NamespaceOut:
    """One namespace and its policy."""
    validate_segment("namespace", ns)
    return _namespace_out(ns, await services.catalog.get_namespace(ns))


@router.put(
    "/namespaces/{ns}",
    response_model=NamespaceOut,
    status_code=201,
    responses={200: {"model": NamespaceOut, "description": "It exists with the same policy"}},
)
async def put_namespace(
    ns: Namespace,
    services: ServicesDep,
    response: Response,
    spec: NamespaceSpec | None = Body(default=None),  # noqa: B008 (FastAPI's idiom)
) -> NamespaceOut:
    """Create a namespace: 201 when created, 200 when it exists with the same policy."""
    validate_segment("namespace", ns)
    spec = spec or NamespaceSpec()
    _check_policies(services, spec.policies)
    policy, created = await services.catalog.create_namespace(ns, spec.stored())
    response.status_code = 201 if created else 200
    return _namespace_out(ns, policy)


@router.patch("/namespaces/{ns}", response_model=NamespaceOut)
async def patch_namespace(
    ns: Namespace, patch: NamespacePatch, services: ServicesDep
) -> NamespaceOut:
    """Change a namespace's policy: the fields given replace the stored ones. Topics that
    set no retention (or replication) of their own follow the namespace's."""
    validate_segment("namespace", ns)
    _check_policies(services, patch.policies)
    updated = await services.catalog.update_namespace(ns, patch.applied_to, changed=patch.changed())
    return _namespace_out(ns, updated)


@router.delete("/namespaces/{ns}", status_code=204)
async def delete_namespace(ns: Namespace, services: ServicesDep) -> Response:
    """Delete an empty namespace (never ``default``)."""
    validate_segment("namespace", ns)
    await services.catalog.delete_namespace(ns)
    return Response(status_code=204)


@router.get("/namespaces/{ns}/topics", response_model=TopicList)
async def list_topics(ns: Namespace, services: ServicesDep) -> TopicList:
    """The topics of a namespace."""
    validate_segment("namespace", ns)
    return TopicList(namespace=ns, topics=await services.catalog.list_topics(ns))


# --- topics ------------------------------------------------------------------------------


@router.put(
    "/topics/{ns}/{topic}",
    response_model=TopicOut,
    status_code=201,
    responses={200: {"model": TopicOut, "description": "It exists with the same config"}},
)
async def put_topic(
    ns: Namespace,
    topic: Topic,
    services: ServicesDep,
    response: Response,
    spec: TopicSpec | None = Body(default=None),  # noqa: B008 (FastAPI's idiom)
) -> TopicOut:
    """Create a topic: 201 when created, 200 when it exists with the same config, 409 when
    it exists with another."""
    name = user_topic(ns, topic)
    spec = spec or TopicSpec()
    _check_policies(services, spec.policies)
    config, created = await services.catalog.create_topic(name, spec.stored())
    if created:
        await services.producer.place(name, config.partitions)
    response.status_code = 201 if created else 200
    return await _topic_out(services, name, config)


@router.patch("/topics/{ns}/{topic}", response_model=TopicOut)
async def patch_topic(
    ns: Namespace, topic: Topic, patch: TopicPatch, services: ServicesDep
) -> TopicOut:
    """Change a topic's policies in place (docs/policies.md): the fields given replace the
    stored ones, ``null`` unsets one (the namespace's applies again). ``partitions`` grows
    the topic (never shrinks it): the new partitions are placed as a new topic's are."""
    name = user_topic(ns, topic)
    _check_policies(services, patch.policies)
    before, after = await services.catalog.update_topic(name, patch.change(name))
    if after.partitions > before.partitions:
        await services.producer.place(name, after.partitions, first=before.partitions)
    return await _topic_out(services, name, after)


@router.get("/topics/{ns}/{topic}", response_model=TopicDetail)
async def describe_topic(ns: Namespace, topic: Topic, services: ServicesDep) -> TopicDetail:
    """Config, partitions, owners and offsets of a topic, and its subscriptions with their
    backlog."""
    name = user_topic(ns, topic)
    config = await services.catalog.get_topic(name)
    names = name.partitions(config.partitions)
    owners = await _owners(services.store, name, names)
    gate = asyncio.Semaphore(STATS_CONCURRENCY)
    offsets = await asyncio.gather(
        *(_offsets(services.bus, services.store, p, gate) for p in names)
    )
    partitions = [
        PartitionDetail(name=str(p), owner=owner, offsets=offset)
        for p, owner, offset in zip(names, owners, offsets, strict=True)
    ]
    ends = {p: offset.next_offset for p, offset in zip(names, offsets, strict=True)}
    subs = await list_subscriptions(services, name, names, ends)
    namespace = await services.catalog.get_namespace(name.namespace)
    return TopicDetail(
        name=str(name),
        config=_config_out(config, namespace.policies),
        partitions=partitions,
        subscriptions=subs,
        producers=await producers_of(services.producers, name),
    )


@router.delete("/topics/{ns}/{topic}", status_code=204)
async def delete_topic(ns: Namespace, topic: Topic, services: ServicesDep) -> Response:
    """Delete a topic: its config and its partitions' records first (which fences the owning
    ingest nodes and uploaders), then every ingest node drops its WAL of those partitions, and
    the partitions' objects are deleted from object storage."""
    name = user_topic(ns, topic)
    config = await services.catalog.delete_topic(name)
    bus = services.bus
    partitions = name.partitions(config.partitions)
    for partition in partitions:
        await bus.publish(bus.subjects.wal_delete(partition), b"")
    await bus.flush()
    await _delete_objects(services, partitions)
    return Response(status_code=204)


async def _delete_objects(services: Services, partitions: list[TopicName]) -> None:
    # The topic is gone once its metadata is: objects that cannot be deleted now (storage
    # down) are logged and left behind rather than failing the delete.
    objects = services.objects
    if objects is None:
        return
    for partition in partitions:
        prefix = topic_prefix(services.objects_root, partition.namespace, partition.topic)
        try:
            keys = await objects.list(prefix)
            for key in keys:
                await objects.delete(key)
        except StorageError as exc:
            log.warning("objects of deleted %s left under %s: %s", partition, prefix, exc)
            continue
        if keys:
            log.info("deleted %d objects of %s", len(keys), partition)


@router.get("/lookup/{ns}/{topic}", response_model=LookupOut)
async def lookup(
    ns: Namespace,
    topic: Topic,
    services: ServicesDep,
    response: Response,
    subscription: str | None = None,
) -> LookupOut:
    """Partitions, dispatch mode and the owner of each partition; with ``subscription``,
    that subscription's owner and consume door too. While etcd does not answer, the last
    answer given for the same question (at most ten minutes old), with its age in ``Age``."""
    name = user_topic(ns, topic)
    if subscription is not None:
        validate_segment("subscription", subscription)
    key = ("http", str(name), subscription or "")
    answer, age_s = await services.lookups.read(key, lambda: _lookup(services, name, subscription))
    if age_s is not None:
        metrics.LOOKUPS_FROM_LAST_GOOD.labels("http").inc()
        log.info("lookup of %s answered from %.1f s ago: etcd does not answer", name, age_s)
        response.headers["age"] = str(int(age_s))
    assert isinstance(answer, LookupOut)
    return answer


async def _lookup(services: Services, name: TopicName, subscription: str | None) -> LookupOut:
    config = await services.catalog.get_topic(name)
    names = name.partitions(config.partitions)
    owners = await _owners(services.store, name, names)
    urls = await _data_urls(services.store) if any(owners) else {}
    found = None
    if subscription is not None:
        found = await _subscription_owner(services.store, name, subscription)
    return LookupOut(
        name=str(name),
        dispatch=config.dispatch,
        partitions=[
            LookupPartitionOut(name=str(p), owner=o, url=None if o is None else urls.get(o.node_id))
            for p, o in zip(names, owners, strict=True)
        ],
        subscription=found,
    )


async def _subscription_owner(
    store: MetaStore, topic: TopicName, sub: str
) -> SubscriptionLookupOut:
    """The dispatcher owning ``sub`` now and its consume door (two reads)."""
    key = meta_keys.subscription_owner_key(topic, sub)
    owner, url = await owner_door(store, key, "dispatcher")
    return SubscriptionLookupOut(name=sub, owner=None if owner is None else owner.node_id, url=url)


async def _data_urls(store: MetaStore) -> dict[str, str]:
    """The data door of every registered ingest node, by node id (one range read)."""
    urls: dict[str, str] = {}
    for kv in await store.range(meta_keys.nodes_prefix("ingest")):
        with contextlib.suppress(MetaDecodeError):
            record = decode_model(kv, NodeRecord)
            if record.data_url is not None:
                urls[record.node_id] = record.data_url
    return urls
