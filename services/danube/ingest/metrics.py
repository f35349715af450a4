"""Prometheus metrics of the ingest service (process-wide, no per-partition labels)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

APPENDED_MESSAGES = Counter("danube_ingest_appended_messages", "Messages made durable")
APPENDED_BYTES = Counter("danube_ingest_appended_bytes", "Payload bytes made durable")
PRODUCE_ERRORS = Counter("danube_ingest_produce_errors", "Produce requests refused", ["code"])
# The data door (danube.ingest.door): messages it stored, and its answers other than 200.
DOOR_MESSAGES = Counter(
    "danube_ingest_door_messages", "Messages acknowledged through the data door (resends too)"
)
GRPC_MESSAGES = Counter(
    "danube_ingest_grpc_messages",
    "Messages acknowledged through the gRPC door (Danube's SendMessage)",
)
DOOR_REFUSALS = Counter(
    "danube_ingest_door_refusals", "Data door produce requests refused, by code", ["code"]
)
FSYNC_SECONDS = Histogram(
    "danube_ingest_fsync_seconds",
    "Latency of one WAL fdatasync",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
)
# A produce's time in ingest, by step (docs/operations.md, "Where a produce spends its
# time"): the whole commit, and the write and the fdatasync of its group commit inside it;
# what is left is the wait in the group-commit queue (and, at replication factor > 1, for
# the in-sync followers).
COMMIT_SECONDS = Histogram(
    "danube_ingest_commit_seconds",
    "From a produce handed to its partition to its records durable (on the in-sync "
    "replicas): group-commit wait, write, fdatasync, replication",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
)
WRITE_SECONDS = Histogram(
    "danube_ingest_write_seconds",
    "Latency of one WAL write system call (the frames of a group commit)",
    buckets=(0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1),
)
BATCH_MESSAGES = Histogram(
    "danube_ingest_batch_messages",
    "Messages per group commit",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
)
SEGMENTS = Gauge("danube_ingest_segments", "WAL segment files on disk")
PARTITIONS = Gauge("danube_ingest_partitions", "Partitions this node owns")
LIVE_DROPPED = Counter(
    "danube_ingest_live_dropped_messages", "Live messages not published: the live queue was full"
)
FOLLOWING = Gauge("danube_ingest_following_partitions", "Partitions this node follows")
UNDER_REPLICATED = Gauge(
    "danube_ingest_under_replicated_partitions",
    "Partitions led here whose in-sync set is smaller than their replica set",
)
FOLLOWER_LAG_MAX = Gauge(
    "danube_ingest_follower_lag_max_messages",
    "The largest follower lag (messages behind the leader's end) over partitions led here",
)
LEADER_ELECTIONS = Counter(
    "danube_ingest_leader_elections", "Leadership claims this node won (new leader epochs)"
)
ISR_CHANGES = Counter("danube_ingest_isr_changes", "In-sync set changes written", ["change"])
TRUNCATED_MESSAGES = Counter(
    "danube_ingest_truncated_messages",
    "Messages cut from a follower's log where it diverged from its new leader",
)
REPLICATED_MESSAGES = Counter(
    "danube_ingest_replicated_messages", "Messages a follower copied from its leader"
)
OPEN_SEGMENT_FILES = Gauge(
    "danube_ingest_open_segment_files",
    "WAL segment descriptors open now (at most ingest.open_segments_max, plus busy ones)",
)
SEGMENT_FILE_REOPENS = Gauge(
    "danube_ingest_segment_file_reopens",
    "Segment descriptors reopened after being closed for room (a counter, since start)",
)
WAL_DISK_FULL = Gauge(
    "danube_ingest_wal_disk_full",
    "1 while appends are refused for lack of space in the WAL directory",
    ["wal_dir"],
)

# Per topic (a partitioned topic's partitions summed), the label capped by metrics.topics_max
# (danube.runtime.topic_metrics): publish rate is rate(danube_topic_messages_in_total).
TOPIC_MESSAGES_IN = Counter(
    "danube_topic_messages_in", "Messages made durable on the partitions this node leads", ["topic"]
)
TOPIC_BYTES_IN = Counter(
    "danube_topic_bytes_in",
    "Payload bytes made durable on the partitions this node leads",
    ["topic"],
)
WAL_DISK_FREE = Gauge(
    "danube_ingest_wal_disk_free_bytes",
    "Free bytes on the file system of the WAL directory (read at each scrape)",
    ["wal_dir"],
)
# Elasticity (docs/replication.md, "Moving partitions").
CATCHUP_BYTES = Counter(
    "danube_ingest_catchup_bytes",
    "Frame bytes this node's leaders sent to replicas catching up outside the ISR",
)
CATCHUP_THROTTLED_SECONDS = Counter(
    "danube_ingest_catchup_throttled_seconds",
    "Time catch-up fetches waited for the throttle (ingest.catchup_bytes_s)",
)
TRANSFERS = Counter(
    "danube_ingest_leader_transfers",
    "Controlled leadership transfers this node's leaders began, by outcome",
    ["outcome"],
)
TRANSFER_PAUSE_SECONDS = Histogram(
    "danube_ingest_leader_transfer_pause_seconds",
    "From a leader stopping its appends to its hand-over written (the produce pause's "
    "first part; the new leader's claim is the rest)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
REASSIGNMENTS_COMPLETED = Counter(
    "danube_ingest_reassignments_completed",
    "Reassignments this node's leaders completed (the target set in sync and leading)",
)
RETIRED_COPIES = Counter(
    "danube_ingest_retired_copies",
    "Local copies of partitions deleted after a reassignment moved them away",
)
RANGES_REPAIRED = Counter(
    "danube_ingest_damaged_ranges_repaired",
    "Damaged ranges of this node's copies rewritten from an intact in-sync copy",
)
REPAIRED_MESSAGES = Counter(
    "danube_ingest_repaired_messages",
    "Messages of those ranges (from the first bad frame to the segment's end)",
)
READS_AROUND_DAMAGE = Counter(
    "danube_ingest_reads_around_damage",
    "Reads of a damaged range of this node's copy answered from another in-sync copy",
)
MESSAGES_AROUND_DAMAGE = Counter(
    "danube_ingest_messages_read_around_damage",
    "Messages those reads answered",
)
DAMAGED_COPIES = Gauge(
    "danube_ingest_damaged_copies",
    "Partitions whose copy on this node holds a damaged range not repaired yet",
)
# Serving through an etcd outage (docs/replication.md).
LEASELESS_SECONDS = Gauge(
    "danube_ingest_leaseless_seconds",
    "Seconds this node has been without its node lease (0 while it holds one): its leaders "
    "acknowledge meanwhile only while their in-sync followers confirm their epoch",
)
LEASELESS_ACKS = Counter(
    "danube_ingest_leaseless_acks",
    "Produces acknowledged while this node had no node lease (confirmed by the followers)",
)
LEASELESS_FENCES = Counter(
    "danube_ingest_leaseless_fences",
    "Leaders without a lease that stopped because an in-sync follower stopped confirming",
)
DEAD_LEADER_LEASES_ENDED = Counter(
    "danube_ingest_dead_leader_leases_ended",
    "Leases of killed leaders this node's followers ended instead of waiting out their TTL "
    "(registered under the lease, door refusing connections: danube.runtime.liveness)",
)
RECLAIMS = Counter(
    "danube_ingest_reclaims",
    "Owner keys written again under a new node lease by a leader that served through an "
    "etcd outage (its epoch unchanged)",
)
BUS_LOST_RESIGNATIONS = Counter(
    "danube_ingest_bus_lost_resignations",
    "Leaderships given up because this node made no bus round trip for its lease TTL "
    "(its partitions fenced, their owner keys deleted: an in-sync follower claims)",
)
# Idempotent producers (docs/client.md, "Exactly once into the log").
DUPLICATES = Counter(
    "danube_ingest_duplicate_messages",
    "Messages of idempotent producers' resends answered with their stored offsets, not appended",
)
PRODUCER_STATES = Gauge(
    "danube_ingest_producer_states",
    "Idempotent producers' states held, over every partition copy on this node",
)
PRODUCER_STATES_EXPIRED = Counter(
    "danube_ingest_producer_states_expired",
    "Idempotent producers' states dropped: idle past ingest.producer_idle_s (idle), or the "
    "least recently used past ingest.producer_states_max (evicted)",
    ["reason"],
)
PRODUCER_STATE_REBUILD_SECONDS = Histogram(
    "danube_ingest_producer_state_rebuild_seconds",
    "Rebuilding a partition copy's producers' states at open: its snapshot and the log after it",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
)
# Followers' fetches straight to their leader's data door (danube.ingest.replica_link).
REPLICA_LINK_FETCHES = Counter(
    "danube_ingest_replica_link_fetches",
    "Follower fetches this node answered, as a leader, on its data door (not over the bus)",
)
REPLICA_LINK_FAILURES = Counter(
    "danube_ingest_replica_link_failures",
    "Links to a leader's data door this node's followers gave up on (refused, cut, not 200); "
    "they fetch over the bus for a while",
)
REPLICA_LINKS_HELD = Gauge(
    "danube_ingest_replica_links", "Links this node's followers hold to their leaders' doors"
)
