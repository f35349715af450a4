"""The typed shape of ``danube.yml``: every section, key, unit and default.

The ``wal_cloud`` section accepts Danube's own keys exactly as its docs give
them (``wal``, ``uploader``, ``cloud``, ``metadata``: :mod:`danube.config.wal_cloud`);
the other top-level sections, here, configure the bus and each service of the mesh.
Units are in the key names (``_ms``, ``_bytes``, ``_mb``); every model forbids unknown
keys (:mod:`danube.config.section`) so a typo fails at start instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from danube.config.section import Credentials, MiB, Section

# --- the mesh: bus and services --------------------------------------------------------


class BusConfig(Credentials):
    """The NATS connection every service opens.

    ``user`` with ``password``/``password_file``: NATS user/password authentication; the
    reply inbox of requests is then ``_INBOX.<user>`` (danube.bus.permissions), so that
    one user's replies are out of another's reach."""

    servers: list[str] = Field(default_factory=lambda: ["nats://127.0.0.1:4222"], min_length=1)
    connect_timeout_s: Annotated[float, Field(gt=0, le=60)] = 5.0
    request_timeout_s: Annotated[float, Field(gt=0, le=300)] = 5.0
    reconnect_wait_s: Annotated[float, Field(gt=0, le=60)] = 1.0
    max_reconnect_attempts: Annotated[int, Field(ge=-1)] = -1  # -1: forever
    # A server that stops answering (frozen, cut off) with the TCP connection still up is
    # noticed by pings: after ``max_outstanding_pings`` unanswered ones, ping_interval_s
    # apart, the client reconnects to another server (nats-py's default is 120 s).
    ping_interval_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    max_outstanding_pings: Annotated[int, Field(ge=1, le=100)] = 2
    # Publishes and requests made while reconnecting wait in this buffer and go out on the
    # new connection; past it they fail at once with not_connected (retriable).
    reconnect_buffer_bytes: Annotated[int, Field(ge=0, le=1024 * MiB)] = 8 * MiB
    drain_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    subject_prefix: str = Field(default="danube", pattern=r"^[A-Za-z0-9_-]+$")


ClientAuthMode = Literal["none", "optional", "required"]


class TlsConfig(Section):
    """TLS on a service's listeners (docs/security.md#tls): off unless ``cert_file`` is set.

    The certificate chain and key are PEM files, re-read when their modification time
    changes (checked at most every ``reload_check_interval_s``, on a new connection), so a
    renewed certificate is served without a restart. With ``client_ca_file``, client
    certificates are checked against it: ``client_auth`` ``required`` refuses a client
    without one, ``optional`` lets it in unauthenticated; a verified certificate's subject
    is the connection's transport principal (danube.security.tls)."""

    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    client_auth: ClientAuthMode = "none"
    reload_check_interval_s: Annotated[float, Field(ge=0, le=3600)] = 5.0  # 0: every handshake

    @model_validator(mode="after")
    def _complete(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both, or neither")
        if self.cert_file is None and self.client_ca_file is not None:
            raise ValueError("client_ca_file needs cert_file and key_file (TLS is off without)")
        if self.client_auth != "none" and self.client_ca_file is None:
            raise ValueError(f"client_auth {self.client_auth!r} needs client_ca_file")
        if self.client_auth == "none" and self.client_ca_file is not None:
            raise ValueError("client_ca_file is set but client_auth is 'none': say which")
        return self

    @property
    def enabled(self) -> bool:
        """Whether the listeners speak TLS."""
        return self.cert_file is not None


class ServiceConfig(Section):
    """What every service process has: where it serves health and metrics."""

    host: str = "127.0.0.1"
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 0  # 0: pick a free port
    # The node lease: its keys (registration, ownership) vanish this long after a crash.
    lease_ttl_s: Annotated[int, Field(ge=2, le=300)] = 10
    # Every HTTP listener (health/metrics; discovery's API): a connection must send a whole
    # request head within header_timeout_s (slow-header clients cannot pin descriptors), may
    # idle keep_alive_timeout_s between requests, and at most max_connections are open at once,
    # at most max_connections_per_client of them from one client address (the next is
    # closed at accept; the lower of the two applies): one client cannot take them all.
    header_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    keep_alive_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    max_connections: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    max_connections_per_client: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    # TLS on every listener of the process (health/metrics; discovery's HTTP and gRPC APIs).
    tls: TlsConfig = TlsConfig()


# The schema registry's compatibility modes (danube.schemas.compat says what each checks).
CompatibilityModeName = Literal[
    "none",
    "backward",
    "forward",
    "full",
    "backward_transitive",
    "forward_transitive",
    "full_transitive",
]


AdvertisedUrl = Annotated[str, Field(pattern=r"^https?://[A-Za-z0-9._:\[\]-]{1,253}$")]
"""Where clients reach a listener: scheme, host and port, nothing after."""


class DiscoveryConfig(ServiceConfig):
    port: Annotated[int, Field(ge=1, le=65535)] = 8080  # the HTTP API
    # Danube's gRPC client API (docs/grpc-api.md): served on grpc_port (0: a free port),
    # unless grpc_enabled is false. Lookups answer grpc_advertised_url — the address clients
    # reach this instance (or the load balancer in front of all of them) by; None:
    # http://<host>:<grpc_port>.
    grpc_enabled: bool = True
    grpc_port: Annotated[int, Field(ge=0, le=65535)] = 6650
    grpc_advertised_url: AdvertisedUrl | None = None
    # TopicLookup answers Redirect to the leader's gRPC door (ingest.grpc_enabled) when the
    # topic or partition exists and its leader serves one; off: always Connect with proxy,
    # this instance (for clients that reach only one address: a load balancer).
    grpc_redirect: bool = True
    # gRPC calls one instance works on at once (the next gets RESOURCE_EXHAUSTED), and the
    # idle time after which a producer or consumer this instance created is forgotten (its
    # HealthCheck answers CLOSE: the client looks up and re-creates it).
    grpc_max_concurrent_rpcs: Annotated[int, Field(ge=1, le=100_000)] = 4096
    # ... and that one client address has in progress at once (the next gets
    # RESOURCE_EXHAUSTED; the lower of the two applies). grpcio cannot see connections at
    # accept, so per client it is calls, not connections, that are limited. A quarter of
    # the instance: a consumer's open stream is a call, and its acks are calls too.
    grpc_max_concurrent_rpcs_per_client: Annotated[int, Field(ge=1, le=100_000)] = 1024
    grpc_client_idle_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    # Producers and consumers one instance keeps for gRPC clients at once.
    grpc_max_clients: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    auto_create_topics: bool = True
    # The schema registry's compatibility mode for subjects that set none (docs/schemas.md).
    schema_compatibility: CompatibilityModeName = "backward"
    # A produce body (JSON, base64 inflates payloads by 4/3) is refused past this many bytes.
    max_body_bytes: Annotated[int, Field(ge=4096, le=256 * MiB)] = 16 * MiB
    # Messages in one HTTP produce request (split into bus requests of at most
    # ingest.max_batch_messages each).
    max_produce_messages: Annotated[int, Field(ge=1, le=100_000)] = 10_000
    # Produce requests one instance works on at once; the next one gets 429.
    max_inflight_produce: Annotated[int, Field(ge=1, le=100_000)] = 256
    # The whole produce, owner claims and retries included, within this deadline (else 503).
    produce_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    # Topic configs are cached this long on the produce path (etcd stays off the hot path);
    # a topic deleted or re-created by another instance is seen at most this late.
    topic_cache_ttl_s: Annotated[float, Field(ge=0, le=300)] = 2.0
    # A producer session (docs/producers.md) ends this long after its client's last
    # keep-alive; the client refreshes it about three times per TTL.
    producer_session_ttl_s: Annotated[int, Field(ge=1, le=3600)] = 15
    # Consumer streams (WebSocket) one instance holds open; the next one is closed at once
    # (error too_many_streams). Each has at most one poll waiting on a dispatcher.
    max_streams: Annotated[int, Field(ge=1, le=100_000)] = 1024
    # A many-topics stream (GET /v1/namespaces/{ns}/subscriptions/{sub}/stream) joins at
    # most this many topics (a consumer and a waiting poll each; 409 too_many_topics past
    # it), and lists its namespace's topics this often to join those created later.
    stream_topics_max: Annotated[int, Field(ge=1, le=10_000)] = 256
    stream_topics_refresh_s: Annotated[float, Field(ge=0.1, le=60)] = 2.0
    # The names a request's Host header may carry (port aside), so that a web page whose DNS
    # name was rebound to this address cannot drive the API: other hosts get 400
    # host_not_allowed. None: localhost, 127.0.0.1, ::1 and `host` (unless it binds every
    # address); "*" allows any (behind a proxy that checks it).
    allowed_hosts: list[Annotated[str, Field(pattern=r"^(\*|[A-Za-z0-9._:-]{1,253})$")]] | None = (
        None
    )
    # The controller's balancer (docs/controller.md): spreads ingest replicas and preferred
    # leaders over the live, undrained nodes every balance_interval_s and when nodes come
    # and go; at most balance_moves_max reassignments under way at once; a node is only
    # relieved when it holds at least balance_slack more replicas than the least loaded.
    balance_enabled: bool = True
    balance_interval_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    balance_moves_max: Annotated[int, Field(ge=1, le=1000)] = 4
    balance_slack: Annotated[int, Field(ge=1, le=1000)] = 2

    def hosts_allowed(self) -> frozenset[str] | None:
        """The Host names allowed, lowercase; None when any is."""
        if self.allowed_hosts is None:
            hosts = {"localhost", "127.0.0.1", "::1"}
            if self.host not in ("0.0.0.0", "::", ""):
                hosts.add(self.host.strip("[]"))
            return frozenset(h.lower() for h in hosts)
        if "*" in self.allowed_hosts:
            return None
        return frozenset(h.lower() for h in self.allowed_hosts)


# --- security ---------------------------------------------------------------------


class SecurityConfig(Section):
    """Authentication and authorization of the front doors (docs/security.md). Off by
    default: every request is served as before, anonymous."""

    enabled: bool = False
    # Tokens must carry these as ``iss`` and ``aud``; tokens issued here carry them too.
    issuer: str = Field(default="danube", min_length=1, max_length=256)
    audience: str = Field(default="danube", min_length=1, max_length=256)
    # Ed25519 keys, one file per key id: <kid>.pem (private) or <kid>.pub.pem (public).
    keys_dir: Path | None = None
    # The key that signs tokens issued for API keys (default: the greatest private key id).
    signing_kid: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # Principals that every permission is granted to (bootstrap, break-glass).
    super_admins: list[Annotated[str, Field(min_length=1, max_length=255)]] = Field(
        default_factory=list, max_length=100
    )
    # Tokens issued for API keys live this long, and no longer than the maximum.
    token_ttl_s: Annotated[int, Field(ge=10, le=31 * 86_400)] = 3600
    token_max_ttl_s: Annotated[int, Field(ge=10, le=366 * 86_400)] = 86_400
    # A verified token is trusted this long without checking its signature again (never
    # past its expiry); bounded by token_cache_entries.
    token_cache_s: Annotated[float, Field(ge=0, le=300)] = 30.0
    token_cache_entries: Annotated[int, Field(ge=0, le=1_000_000)] = 10_000
    # keys_dir is looked at this often: keys added, replaced or removed there take effect
    # without a restart (0: read at start only).
    keys_reload_s: Annotated[float, Field(ge=0, le=3600)] = 10.0


class DataDoorSettings(Section):
    """The data door of a node (DESIGN §10): its own listener, with the limits and TLS of
    the node's section, serving what this node owns (an ingest node: the produce of the
    partitions it leads, docs/http-api.md "Direct produce"; a dispatcher: the consume of the
    subscriptions it owns, "Direct consume"). Lookups and attaches name data_advertised_url —
    the address clients reach this node by (None: http(s)://<host>:<data_port>)."""

    # On data_port (0: a free port). Off: only through discovery.
    data_enabled: bool = True
    data_port: Annotated[int, Field(ge=0, le=65535)] = 0
    data_advertised_url: AdvertisedUrl | None = None
    # A body larger than this is refused (413 body_too_large); past this many requests in
    # progress the next is answered 429 at once.
    data_body_bytes_max: Annotated[int, Field(ge=4096, le=256 * MiB)] = 16 * MiB
    data_max_inflight: Annotated[int, Field(ge=1, le=100_000)] = 256
    # A request on the data door is answered within this (503 timeout past it; a produce's
    # append may still complete, as on discovery's path: docs/http-api.md). A long poll's
    # wait comes on top.
    data_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0


class IngestConfig(ServiceConfig, DataDoorSettings):
    # Topic configs, policies and schema bindings are cached this long by the door's
    # admission (as discovery.topic_cache_ttl_s: a change is seen at most this late).
    data_cache_ttl_s: Annotated[float, Field(ge=0, le=300)] = 2.0
    # The gRPC door (docs/grpc-api.md, "Ingest doors"): Danube's client API for the
    # partitions this node leads, on grpc_port (0: a free port), with this section's TLS;
    # TopicLookup redirects clients to grpc_advertised_url (None: http(s)://<host>:<port>).
    # Its limits are discovery's gRPC limits, here for one node.
    grpc_enabled: bool = True
    grpc_port: Annotated[int, Field(ge=0, le=65535)] = 0
    grpc_advertised_url: AdvertisedUrl | None = None
    grpc_max_message_bytes: Annotated[int, Field(ge=4096, le=256 * MiB)] = 16 * MiB
    grpc_max_concurrent_rpcs: Annotated[int, Field(ge=1, le=100_000)] = 4096
    grpc_max_concurrent_rpcs_per_client: Annotated[int, Field(ge=1, le=100_000)] = 1024
    grpc_client_idle_s: Annotated[float, Field(gt=0, le=3600)] = 60.0
    grpc_max_clients: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000
    # Consumer streams (ReceiveMessages) one node holds open at once.
    # (Producer sessions opened here have discovery.producer_session_ttl_s, as everywhere.)
    grpc_max_streams: Annotated[int, Field(ge=1, le=100_000)] = 1024
    # A produce request travels in one NATS message (max_payload, 1 MiB by default).
    max_message_bytes: Annotated[int, Field(ge=1, le=64 * MiB)] = 512 * 1024
    max_batch_messages: Annotated[int, Field(ge=1, le=100_000)] = 10_000
    # Replication (docs/replication.md): the cluster's defaults for topics and namespaces that
    # set none; a follower that has not caught up with the leader for replica_lag_max_s
    # leaves the in-sync set; a produce waits at most produce_commit_timeout_s for it.
    replication_factor: Annotated[int, Field(ge=1, le=7)] = 1
    min_insync_replicas: Annotated[int, Field(ge=1, le=7)] = 1
    replica_lag_max_s: Annotated[float, Field(gt=0, le=600)] = 5.0
    replica_fetch_wait_s: Annotated[float, Field(gt=0, le=30)] = 0.5
    # Descriptors of WAL segment files kept open over all partitions (least recently used
    # closed beyond it, reopened on use): the process's descriptor use stays bounded.
    open_segments_max: Annotated[int, Field(ge=1, le=1_000_000)] = 256
    # Appends are refused (disk_full, retriable) rather than leave less than this free on
    # the WAL's filesystem: room for checkpoints and new segments, and a prompt error.
    disk_free_min_bytes: Annotated[int, Field(ge=0, le=2**50)] = 64 * MiB
    # Elasticity (docs/replication.md, "Moving partitions"): the bytes/s a leader sends, over
    # all its partitions, to replicas catching up outside the ISR (a reassignment's new
    # copies), so a move never starves produce; a partition's assignment may set less.
    catchup_bytes_s: Annotated[int, Field(ge=1024, le=2**40)] = 32 * MiB
    # A controlled leadership transfer gives the chosen follower this long to hold the
    # leader's whole log (appends wait meanwhile) before it is abandoned.
    transfer_timeout_s: Annotated[float, Field(gt=0, le=60)] = 2.0
    # A preferred leader must have been in sync this long before leadership moves back to it.
    preferred_leader_settle_s: Annotated[float, Field(ge=0, le=3600)] = 2.0
    # Idempotent producers (docs/client.md, "Exactly once into the log"): a producer's state
    # on a partition copy goes after this long without a record of it (a resend after that
    # is stored again), and past this many producers per copy the least recently used goes.
    producer_idle_s: Annotated[float, Field(ge=1, le=7 * 86400)] = 3600.0
    producer_states_max: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000


class UploaderServiceConfig(ServiceConfig):
    pass


class RetentionServiceConfig(ServiceConfig):
    # How often the leader checks, in seconds; overrides wal_cloud.wal.retention's
    # check_interval_minutes when set (tests and small deployments want seconds).
    check_interval_s: Annotated[float, Field(gt=0, le=86_400)] | None = None


class CloudReaderConfig(ServiceConfig):
    chunk_bytes: Annotated[int, Field(ge=4096, le=64 * MiB)] = 1 * MiB


class DispatcherConfig(ServiceConfig, DataDoorSettings):
    """Delivery limits of every subscription (danube.dispatcher.DeliverySettings and the
    cursor FlushPolicy are built from these)."""

    # Room for the receiver queue (1000) and the acks a client has under way (the SDK sends
    # up to 4 batches of up to 1000 at once): a window no larger than one ack batch makes a
    # consumer stop and wait for every batch's ack (docs/performance.md, "Consume").
    max_unacked_per_consumer: Annotated[int, Field(ge=1, le=100_000)] = 5000
    ack_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    redelivery_base_s: Annotated[float, Field(gt=0, le=3600)] = 1.0
    redelivery_max_s: Annotated[float, Field(gt=0, le=86_400)] = 60.0
    max_redeliveries: Annotated[int, Field(ge=0, le=1000)] = 5
    max_held_messages: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    # A delayed message is handed this long before its time to consumers that hold it
    # until then (the SDK's; docs/policies.md, "Delayed delivery"): one due while its
    # dispatcher is replaced is already in their hands. Held to half the ack timeout; 0:
    # never early.
    delay_lookahead_ms: Annotated[int, Field(ge=0, le=10_000)] = 1000
    cursor_flush_acks: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    cursor_flush_interval_s: Annotated[float, Field(gt=0, le=3600)] = 1.0
    dead_letter_suffix: str = Field(default="-dlq", pattern=r"^[A-Za-z0-9_-]{1,32}$")
    # A consumer that neither polls nor acks this long is detached (its unacked messages
    # go back to the subscription).
    consumer_session_timeout_s: Annotated[float, Field(gt=0, le=86_400)] = 60.0
    # Slow consumers (docs/dispatcher.md, "Fair redelivery"): each ack timeout in a row
    # halves a consumer's window down to slow_consumer_window_min messages (0: never
    # shrinks), each ack doubles it back; after slow_consumer_detach_timeouts ack timeouts
    # in a row with no ack it is detached (consumer_detached) while another consumer can
    # take over (0: never detached).
    slow_consumer_window_min: Annotated[int, Field(ge=0, le=100_000)] = 10
    slow_consumer_detach_timeouts: Annotated[int, Field(ge=0, le=1000)] = 5
    # Messages buffered per consumer of a non-reliable subscription; a full buffer drops its
    # oldest message (counted), so a slow consumer slows nobody.
    non_reliable_buffer_messages: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    # Fair share (docs/dispatcher.md, "Balancing, drain and handover"): every
    # balance_interval_s (jittered ±20 %) a dispatcher counts the live, undrained dispatchers
    # and the owned subscriptions; owning more than ceil(total / eligible) + balance_slack, it
    # hands over down to ceil(total / eligible), at most balance_moves_max per round, and
    # refuses (claim_refused, retriable) claims while at its share and, for
    # balance_holdoff_s, claims of what it just handed over. A drained one hands over all.
    balance_enabled: bool = True
    balance_interval_s: Annotated[float, Field(gt=0, le=3600)] = 3.0
    balance_slack: Annotated[int, Field(ge=0, le=1000)] = 1
    balance_moves_max: Annotated[int, Field(ge=1, le=1000)] = 4
    balance_holdoff_s: Annotated[float, Field(ge=0, le=3600)] = 30.0
    # Through an etcd outage (docs/dispatcher.md): a dispatcher whose node lease is lost
    # serves its subscriptions on, cursor writes held in memory, for at most this long, then
    # stops them (0: stops them at once, as before). The bound covers a claim announcement
    # lost on the bus while this dispatcher is cut from etcd alone.
    leaseless_serve_max_s: Annotated[float, Field(ge=0, le=3600)] = 60.0
    # Delayed delivery (docs/dispatcher.md): each shared or key-shared subscription holds at
    # most this many bytes of delayed messages in memory; the farther ones go to files under
    # delayed_spill_dir (null: the system's temporary directory), a node-local cache.
    delayed_memory_bytes_max: Annotated[int, Field(ge=64 * 1024, le=4 * 1024 * MiB)] = 8 * MiB
    delayed_spill_dir: str | None = None
    # Every this many seconds the delayed messages read since the last time are sealed into
    # a snapshot in object storage (wal_cloud.cloud), so a dispatcher taking a subscription
    # over loads them instead of reading the log again (0: none, the default while snapshots
    # are new: a takeover reads the log; 1.0 turns them on).
    delayed_seal_interval_s: Annotated[float, Field(ge=0, le=60)] = 0.0
    # The consume door (DataDoorSettings; docs/http-api.md, "Direct consume"): WebSocket
    # streams it holds open at most (the next is closed with 4429 too_many_streams).
    data_max_streams: Annotated[int, Field(ge=1, le=1_000_000)] = 1024
    # Requests in progress on the consume door: a long poll holds one for up to its wait_ms,
    # so more than a produce door's (each poll-mode consumer keeps one poll open).
    data_max_inflight: Annotated[int, Field(ge=1, le=100_000)] = 1024


class MetricsConfig(Section):
    """Per-topic and per-subscription Prometheus series, with bounded label sets: each
    process labels the first ``topics_max`` topics (and ``subscriptions_max``
    subscriptions) it sees by name; the rest are summed under ``topic="_other"`` (or
    ``subscription="_other"``), so a cluster with a million topics still exports a
    bounded number of series (docs/operations.md, Metrics)."""

    topics_max: Annotated[int, Field(ge=0, le=100_000)] = 100
    subscriptions_max: Annotated[int, Field(ge=0, le=100_000)] = 200
    # How often gauges that need a question to another service (a subscription's backlog,
    # a partition's upload lag) are recomputed; counters move at once.
    sample_interval_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    # `danube up` only: the first of the fixed health/metrics ports it gives its processes,
    # a block of 20 per kind (danube.up.mesh: ingest-0 9400, cloud_reader-0 9420...),
    # so that one Prometheus file scrapes every `make run`; 0: any free ports.
    up_port_base: Annotated[int, Field(ge=0, le=65535 - 20 * 6)] = 9400
