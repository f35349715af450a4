"""The data door of an ingest node (DESIGN §10, docs/http-api.md "Direct produce"): the
binary produce of the partitions this node leads, stored here with no hop through discovery
or the bus.

``POST /v1/topics/{ns}/{topic}/messages`` with ``Content-Type: application/vnd.danube.records``
(the body and its query parameters are discovery's binary produce: danube.wire.produce_binary),
where ``{topic}`` is a partition this node leads (``orders-part-3``) or an unpartitioned
topic. The answer is discovery's too: the runs of offsets, and the topic's partition count.

The checks, in order (the first refusal answers; nothing is stored):

1. the path, the method, the body's type and size (404, 405, 415, 413 ``body_too_large``);
2. who asks: a bearer token or the client certificate (401), with security on;
3. whether this node leads the partition: 421 ``not_leader`` naming the leader's data URL
   (the ``Danube-Leader-Url`` header) when etcd knows it, 503 ``no_owner`` when nobody leads
   it now — the producer looks the topic up again and follows; a partitioned topic's own
   name is 400 ``partition_required``;
4. the body's frames (400 with the frame error's code, 413 ``too_many_messages``);
5. admission (danube.admission: RBAC, the exclusive-producer fence, sequences, limits, the
   topic's policies, its schema), the same decision discovery's doors make;
6. the partition's share of the topic's publish rate and backlog quota, then the append
   (danube.ingest.handlers: the bus's path shares it from here on).

The door also answers the fetches of the partitions' followers,
``POST /v1/replicas/{ns}/{partition}/fetch`` with the leadership term's ticket
(danube.ingest.replica_link): 401 without it, 421 where this node does not lead.

At most ``ingest.data_max_inflight`` connections have a produce in progress, counted by the
listener from its head (the next: 429 at once, before its body is read); each has
``ingest.data_timeout_s`` from its head's arrival to be answered (its body's arrival
included). The listener is danube.runtime.data_listener (HTTP/1.1 without an ASGI server:
the limits of the node's other listeners, TLS as its ``tls`` section says).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Protocol

import orjson

from danube.admission import Admission, AdmissionCounters, FramesMessages, build
from danube.admission.payloads import stamped_frames
from danube.admission.refresh import Refresher
from danube.admission.sequences import PARTITION_REQUIRED
from danube.config import DanubeSettings
from danube.errors import (
    BadRequestError,
    DanubeError,
    NotFoundError,
    NotLeaderError,
    UnavailableError,
    UnsupportedMediaTypeError,
)
from danube.frame.batch import FrameBatch
from danube.ingest import leadership, metrics
from danube.ingest.handlers import PartitionHandlers
from danube.ingest.node import Node
from danube.ingest.replica_link import CONTENT_TYPE, TICKET_HEADER
from danube.meta import MetaStore, TopicName
from danube.meta.doors import node_door
from danube.names import produce_topic
from danube.runtime.data_listener import DataListener, DoorLimits, DoorRequest
from danube.runtime.door import (
    DOOR_START_S,
    DOOR_STOP_S,
    JSON,
    Answer,
    Authenticator,
    body_too_large,
    error_answer,
    principal_of,
)
from danube.runtime.http import advertised_url
from danube.runtime.service import NodeSession
from danube.security.tls import ServerTls
from danube.tasks import TaskSet
from danube.wire import codes
from danube.wire.limits import for_partition
from danube.wire.produce_binary import RECORDS_TYPE, parse_binary_params, runs_answer, scan_body

log = logging.getLogger(__name__)

_PRODUCE_PATH = re.compile(r"/v1/topics/([^/]+)/([^/]+)/messages")
_REPLICA_PATH = re.compile(r"/v1/replicas/([^/]+)/([^/]+)/fetch")
_ACTION = "produce (data door)"
_BODY_SETTING = "ingest.data_body_bytes_max"
# Admission's refusals on this process: danube_ingest_policy_refusals_total and the like.
ADMISSION_COUNTERS = AdmissionCounters.register("danube_ingest")


class Leaders(Protocol):
    """The partitions this node leads (danube.ingest.node.Node)."""

    def leader_of(self, name: TopicName) -> PartitionHandlers | None:
        """The handlers of ``name`` while this node leads it."""
        ...


class DataDoor:
    """What an ingest node's data listener answers (danube.runtime.data_listener.DoorApp)."""

    def __init__(
        self, leaders: Leaders, admission: Admission, security: Authenticator, store: MetaStore
    ) -> None:
        self.leaders = leaders
        self.admission = admission
        self.security = security
        self.store = store

    async def __call__(self, request: DoorRequest) -> Answer:
        try:
            return await self._answer(request)
        except Exception as exc:
            return refusal(exc)

    async def _answer(self, request: DoorRequest) -> Answer:
        match = _PRODUCE_PATH.fullmatch(request.path)
        replica = None if match is not None else _REPLICA_PATH.fullmatch(request.path)
        if match is None and replica is None:
            raise NotFoundError(f"no route {request.path} on an ingest data door")
        if request.method != "POST":
            body = orjson.dumps(_code("method_not_allowed", "POST only"))
            return 405, body, JSON, {"Allow": "POST"}
        if replica is not None:
            return await self.replica_fetch(request, TopicName(replica[1], replica[2]))
        assert match is not None
        _check_headers(request.headers)
        return await self.produce(request, match[1], match[2])

    async def produce(self, request: DoorRequest, ns: str, topic: str) -> Answer:
        """One binary produce to a partition this node leads (the module's docstring has
        the order of its checks)."""
        name = produce_topic(ns, topic)
        who = principal_of(self.security, request.header(b"authorization"), request.tls_principal)
        handlers = self.leaders.leader_of(name)
        if handlers is None:
            raise await self._not_leader(name)
        params = parse_binary_params(request.query)
        body = request.body
        limits = self.admission.limits
        frames = scan_body(
            body, max_messages=limits.messages_max, max_payload_bytes=limits.payload_bytes_max
        )
        admitted = await self.admission.produce(
            who,
            name,
            FramesMessages(frames),
            producer_id=params.producer_id,
            schema_version=params.schema_version,
            action=_ACTION,
        )
        config = admitted.config  # read with the policies: no second cache lookup
        if config is None:
            raise NotFoundError(f"topic {name} does not exist", code=codes.TOPIC_NOT_FOUND)
        stamp = admitted.stamp
        if stamp is not None:
            frames = stamped_frames(frames, stamp.schema_id, stamp.version)
        reply = await handlers.append(
            FrameBatch.of_frames(frames.body, frames.starts, frames.ends),
            frames.runs,
            for_partition(admitted.policies, config.partitions),
        )
        metrics.DOOR_MESSAGES.inc(reply.messages)
        count = len(frames)
        offsets = [reply.offset(i) for i in range(count)]
        duplicates = [reply.duplicate_at(i) for i in range(count)]
        answer = runs_answer([name], [0] * count, offsets, duplicates, config.partitions)
        return 200, answer, JSON, None

    async def replica_fetch(self, request: DoorRequest, name: TopicName) -> Answer:
        """A follower's fetch over its link (danube.ingest.replica_link): answered as on
        the bus, for the partition's leader and the term's ticket only."""
        handlers = self.leaders.leader_of(name)
        if handlers is None:
            raise NotLeaderError(f"this node does not lead {name}")
        ticket = request.header(TICKET_HEADER.encode("ascii"))
        answer = await handlers.link_fetch(ticket, request.body)  # its long poll is shorter
        metrics.REPLICA_LINK_FETCHES.inc()
        return 200, answer, CONTENT_TYPE, None

    async def _not_leader(self, name: TopicName) -> DanubeError:
        """The refusal of a produce to a partition this node does not lead: where its
        leader is, if etcd says (one read of the owner and one of its registration)."""
        if name.partition is None:
            config, _ = await self.admission.policies.effective_policies(name)
            if config is not None and config.partitions > 0:
                return BadRequestError(
                    f"{name} has {config.partitions} partitions: a data door takes one of "
                    f"them, {name.partition_name(0)} and on",
                    code=PARTITION_REQUIRED,
                )
        view = await leadership.read(self.store, name)
        owner = view.owner
        if owner is None:
            return UnavailableError(f"{name} has no leader now; look it up again", code="no_owner")
        url = await node_door(self.store, "ingest", owner.node_id)
        return NotLeaderError(f"this node does not lead {name}; its leader does", leader_url=url)


def _check_headers(headers: list[tuple[bytes, bytes]]) -> None:
    """The body's type and encoding (its size is the listener's to bound)."""
    content_type = None
    for header, value in headers:
        if header == b"content-type":
            content_type = value.decode("latin-1").lower()
        elif header == b"content-encoding" and value.lower() != b"identity":
            raise UnsupportedMediaTypeError(
                "a data door takes bodies as they are (frames compress their payloads)",
                code="unsupported_content_encoding",
            )
    if content_type != RECORDS_TYPE:
        raise UnsupportedMediaTypeError(f"a data door takes {RECORDS_TYPE} bodies only")


def _code(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


def refusal(exc: Exception) -> Answer:
    """The answer to a request that raised ``exc``, counted in the door's refusals."""
    return error_answer(exc, "data door", metrics.DOOR_REFUSALS)


class DoorAdmission:
    """The admission of a node's doors (this data door and the gRPC door,
    danube.ingest.grpc_door): one per process, its views of etcd loaded before the doors
    open and followed while they serve, its caches refreshed ahead."""

    def __init__(self, settings: DanubeSettings, store: MetaStore) -> None:
        self.refresher = Refresher()
        self.parts = build(
            settings,
            store,
            refresher=self.refresher,
            cache_ttl_s=settings.ingest.data_cache_ttl_s,
            counters=ADMISSION_COUNTERS,
        )
        self._tasks = TaskSet("door admission")

    async def open(self) -> None:
        """Load the views (MetaError when etcd fails: the node does not serve without
        them), then follow them."""
        await self.parts.load()
        self._tasks.spawn(self.parts.follow(), name="admission-views")

    async def close(self) -> None:
        """Stop following; close the caches' refresher."""
        await self._tasks.close(timeout_s=DOOR_STOP_S)
        await self.refresher.close()


async def open_door(
    settings: DanubeSettings, node: Node, session: NodeSession, admission: DoorAdmission
) -> DataListener:
    """Listen on ``ingest.data_port`` with the section's limits and TLS (``admission``
    opened first); advertise the door's URL in the node's registration (lookups name it)."""
    ingest = settings.ingest
    parts = admission.parts
    door = DataDoor(node, parts.admission, parts.security, session.store)
    listener = DataListener(
        door,
        refusal,
        lambda: body_too_large(ingest.data_body_bytes_max, _BODY_SETTING),
        DoorLimits.of(
            ingest, ingest.data_body_bytes_max, ingest.data_timeout_s, ingest.data_max_inflight
        ),
        # loads the files now: a bad path fails the start, clearly
        tls=ServerTls(ingest.tls) if ingest.tls.enabled else None,
    )
    async with asyncio.timeout(DOOR_START_S):
        await listener.start(ingest.host, ingest.data_port)
    url = ingest.data_advertised_url or advertised_url(ingest, listener.port)
    node.ctx.links.serve_at(url)  # followers fetch here (danube.ingest.replica_link)
    await session.advertise(url)
    log.info("ingest %s: data door at %s", node.node_id, url)
    return listener
