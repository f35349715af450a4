"""The answers of the read-only routes the admin console polls (:mod:`danube.discovery.doors.http.
console`): a topic's live counters, the last messages of a topic, the cluster's partition
placement. Plain data; no logic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from danube.discovery.doors.bodies.api import Encoding


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True)


class PartitionStatsOut(_Response):
    """One partition's counters, as its leader answers them (``null``: it did not, in 1 s)."""

    name: str
    next_offset: int | None
    wal_start: int | None
    # Frame bytes this leader wrote since it opened the WAL: a counter for rates, which
    # starts again at 0 when leadership moves (a reader drops a negative step).
    bytes_written: int | None
    leader: str | None


class TopicStatsOut(_Response):
    """``GET /v1/topics/{ns}/{topic}/stats``: counters a page turns into rates by taking two
    answers apart (``time_ms`` is this instance's clock when it asked)."""

    name: str
    time_ms: int
    partitions: list[PartitionStatsOut]
    messages: int | None  # sum of the partitions' next offsets (null if any is unknown)
    bytes_written: int | None
    backlog: int  # sum of the known backlogs of the topic's subscriptions
    subscriptions: int


class PeekedMessage(_Response):
    """One message read without a subscription: as a poll gives it, without the
    redelivery count (nothing was delivered)."""

    partition: str
    offset: int
    payload: str
    encoding: Encoding
    size_bytes: int
    key: str | None
    attributes: dict[str, str]
    publish_time_ms: int
    producer: str
    schema_id: int | None = None
    schema_version: int | None = None


class PeekOut(_Response):
    """``GET /v1/topics/{ns}/{topic}/peek``: up to ``count`` of the newest messages of the
    WAL tier, newest first. ``unavailable``: partitions whose leader did not answer (or whose
    tail is damaged), left out."""

    name: str
    messages: list[PeekedMessage]
    unavailable: list[str]


class NodePlacementOut(_Response):
    """One ingest node's share of the partitions."""

    node_id: str
    leader_of: int
    replica_of: int


class PlacementOut(_Response):
    """``GET /v1/console/placement``: partitions per ingest node and how many partitions are
    short of in-sync replicas, from etcd (one range read, at most ``limit`` keys)."""

    partitions: int
    under_replicated: int
    without_leader: int
    nodes: list[NodePlacementOut]
    truncated: bool
