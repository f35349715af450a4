"""The node lease as an ingest node holds it through etcd outages (docs/replication.md,
"Serving through an etcd outage").

The session replaces a lost lease with a new one once etcd answers again
(danube.runtime.service.NodeSession.renewed); the replicas read :attr:`NodeLease.current`
each time they write under it, and the leaders of this node ask :attr:`NodeLease.alive`
whether they still hold it or must fall back to the leaseless rule (their in-sync
followers confirming their epoch).
"""

from __future__ import annotations

import time

from danube.meta import Lease


class NodeLease:
    """This node's current lease, and since when it has been without one."""

    def __init__(self, lease: Lease) -> None:
        self.current = lease
        self._lost_at: float | None = None  # time.monotonic() the current lease was lost
        lease.on_lost(self._on_lost)

    @property
    def alive(self) -> bool:
        """Whether the current lease holds (its local deadline not passed)."""
        return self.current.alive

    def renew(self, lease: Lease) -> None:
        """A new lease replaces the lost one."""
        self.current = lease
        self._lost_at = None
        lease.on_lost(self._on_lost)

    def leaseless_s(self) -> float:
        """Seconds this node has been without a lease (0 while it holds one)."""
        if self.current.alive:
            return 0.0
        now = time.monotonic()
        if self._lost_at is None:  # its deadline passed; the keep-alive has not said so yet
            self._lost_at = now
        return now - self._lost_at

    def _on_lost(self, lease: Lease) -> None:
        if lease is self.current and self._lost_at is None:
            self._lost_at = time.monotonic()
