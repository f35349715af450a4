"""What one discovery instance serves with, built once by the app (danube.discovery.app) and
handed to each door: the HTTP API (danube.discovery.doors.http) and Danube's gRPC API
(danube.discovery.doors.grpc) both read it; neither door imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from danube.admission import Admission
from danube.admission.last_good import LastGood
from danube.admission.sessions import ProducerSessions
from danube.bus import Bus
from danube.discovery.catalog.catalog import Catalog
from danube.discovery.catalog.topic_lists import TopicLists
from danube.discovery.produce.producer import Producer
from danube.discovery.schemas.registry import SchemaRegistry
from danube.meta import MetaStore
from danube.runtime.held import Slots
from danube.security.gate import SecurityGate
from danube.storage import ObjectStore
from danube.wire.dispatcher.client import DispatcherClient


class ControllerView(Protocol):
    """The part of the controller the API reads (``GET /v1/cluster``)."""

    @property
    def is_leader(self) -> bool:
        """Whether this instance leads the cluster right now."""
        ...

    async def leader(self) -> str | None:
        """The node id of the current leader, if any."""
        ...


@dataclass(frozen=True)
class Services:
    """One discovery instance's connections and logic."""

    node_id: str
    bus: Bus
    store: MetaStore
    catalog: Catalog
    producer: Producer
    controller: ControllerView
    dispatcher: DispatcherClient
    # Producer sessions and access modes; every front door checks a produce against them.
    producers: ProducerSessions
    # The schema registry and topic bindings (docs/schemas.md).
    schemas: SchemaRegistry
    # What every produce door decides before storing: RBAC, producer sessions, limits,
    # policies, schemas (danube.admission).
    admission: Admission
    # Object storage, to delete a deleted topic's objects (None: leave them).
    objects: ObjectStore | None = None
    objects_root: str = ""  # wal_cloud.uploader.root_prefix: where topics' objects live
    ready_timeout_s: float = 2.0
    # Open consumer streams (WebSocket), up to discovery.max_streams.
    streams: Slots = field(default_factory=lambda: Slots(1024))
    # A stream with no credits still tells the dispatcher its consumer is alive this often,
    # well within dispatcher.consumer_session_timeout_s.
    stream_keepalive_s: float = 20.0
    # Many-topics streams (doors/http/multi_stream.py): the topics one stream joins at most, and
    # how often it lists its namespace's topics to join new ones (docs/http-api.md).
    stream_topics_max: int = 256
    stream_topics_refresh_s: float = 2.0
    # The namespaces' topic lists those streams read, shared by all of them (None: each
    # stream lists through the catalog itself).
    topic_lists: TopicLists | None = None
    # Authentication and authorization of both front doors (off: everything allowed).
    security: SecurityGate = field(default_factory=SecurityGate.disabled)
    # The last lookups answered, by door and name, to answer with while etcd is out of
    # reach (danube.admission.last_good).
    lookups: LastGood[tuple[str, ...], Any] = field(default_factory=LastGood)
