"""What every replica of a node shares (:class:`NodeContext`: settings, the bus, etcd, the
node lease, the catch-up throttle, the bus watch) and the follower-contact window derived
from the settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from danube.bus import Bus
from danube.config import DanubeSettings
from danube.ingest.buswatch import BusWatch
from danube.ingest.nodelease import NodeLease
from danube.ingest.replica_link import ReplicaLinks
from danube.ingest.throttle import TokenBucket
from danube.ingest.wal import FileOps
from danube.meta import Lease, MetaStore
from danube.runtime.liveness import GoneNodes


@dataclass(frozen=True)
class NodeContext:
    """What every replica of a node shares."""

    settings: DanubeSettings
    node_id: str
    bus: Bus
    store: MetaStore
    leases: NodeLease  # the current node lease: replaced after an etcd outage
    file_ops: FileOps
    on_fatal: Callable[[], None]
    catchup: TokenBucket  # the node's catch-up throttle (ingest.catchup_bytes_s)
    bus_watch: BusWatch | None = None  # the node's bus link (danube.ingest.buswatch)
    # Leaders provably gone (killed), found by their followers: their leases ended at once
    # rather than waited out (danube.runtime.liveness; None: never ended early).
    gone_leaders: GoneNodes | None = None
    # Followers' fetches straight to their leaders' data doors, and the door this node
    # offers as a leader (danube.ingest.replica_link; nothing offered until its door listens).
    links: ReplicaLinks = field(default_factory=ReplicaLinks)

    @property
    def bus_lost(self) -> bool:
        """No bus round trip succeeded for the watch's grace: lead nothing, claim nothing."""
        return self.bus_watch is not None and self.bus_watch.lost

    def bus_fresh(self) -> bool:
        """A recent bus round trip succeeded: a leader may blame its followers' silence
        on them (shrink its ISR)."""
        return self.bus_watch is None or self.bus_watch.fresh()

    @property
    def lease(self) -> Lease:
        """The node lease now (claims and owner keys are written under it)."""
        return self.leases.current

    @property
    def contact_s(self) -> float:
        """How recently a follower must have fetched to count as confirming its leader's
        epoch: two long polls and a margin (docs/replication.md, "Serving through an
        etcd outage")."""
        return contact_s(self.settings)

    @property
    def reclaim_grace_s(self) -> float:
        """How long followers keep following a leader whose owner key lapsed while it
        still answers them, before one may claim: time for it to take a new lease and
        write its key again once etcd is back."""
        return 2.0 * self.settings.ingest.lease_ttl_s


def contact_s(settings: DanubeSettings) -> float:
    """See :attr:`NodeContext.contact_s`."""
    return max(1.0, 2 * settings.ingest.replica_fetch_wait_s + 0.5)
