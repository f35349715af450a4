"""How an ingest node follows the controller's assignments (``partitions/<ns>/<p>/assignment``).

For each partition whose assignment concerns this node, one reconcile task brings the node
in line, then ends:

- assigned **here**, not served: claim it (``Node.ensure_serving``) once the owner key is
  absent or ours; while another node's owner key exists, wait: it vanishes when that node's
  lease expires or when that node hands the partition over. The wait wakes on the owner
  key's deletion (seen by the node's partitions watch) and polls as a safety net;
- assigned **elsewhere**, served here: stop serving, then delete our owner key, so the new
  node may claim (``Node.hand_over``);
- assigned elsewhere, not served: delete an owner key that still names us (left by an
  earlier incarnation), for the same reason.

A partition with no assignment is left alone: before any controller runs, ingest claims on
request (``handlers.serve_claims``). The owner key's compare-and-swap is what guarantees one
owner; following assignments only decides who tries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from danube.ingest.ownership import OwnershipError
from danube.meta import MetaDecodeError, MetaStore, TopicName, WatchEvent, decode_model
from danube.meta import keys as meta_keys
from danube.meta.aio import cancel_and_wait
from danube.meta.backoff import backoff_s
from danube.meta.records import Assignment, Owner

if TYPE_CHECKING:
    from danube.ingest.node import Node

log = logging.getLogger(__name__)

# Waiting for another node's owner key to go: poll this often at most (the watch usually
# wakes us first), so a claim follows a vanished owner within about this long.
_POLL_BASE_S = 0.05
_POLL_CAP_S = 0.5


class AssignmentFollower:
    """The assignments of one node, and the reconcile tasks that follow them.

    The tasks are owned here: :meth:`close` cancels them (the node closes it before it stops).
    """

    def __init__(self, node: Node, store: MetaStore) -> None:
        self._node = node
        self._store = store
        self._assigned: dict[TopicName, str] = {}  # partition -> node id its assignment names
        self._wake: dict[TopicName, asyncio.Event] = {}
        self._tasks: dict[TopicName, asyncio.Task[None]] = {}
        self._closed = False

    def assigned_here(self, partition: TopicName) -> bool:
        """The controller wants this node to serve ``partition``."""
        return self._assigned.get(partition) == self._node.node_id

    def assigned_elsewhere(self, partition: TopicName) -> bool:
        """The controller wants another node to serve ``partition``."""
        return self._assigned.get(partition, self._node.node_id) != self._node.node_id

    async def load(self) -> int:
        """Read every assignment and owner key, start following them; return the revision
        read at (watch from the next one so no change is missed)."""
        snapshot = await self._store.snapshot(meta_keys.partitions_prefix())
        stale_owner: list[TopicName] = []
        for kv in snapshot.kvs:
            partition, record = meta_keys.parse_partition_key(kv.key)
            try:
                if record == "assignment":
                    self._assigned[partition] = decode_model(kv, Assignment).node_id
                elif record == "owner" and decode_model(kv, Owner).node_id == self._node.node_id:
                    stale_owner.append(partition)
            except MetaDecodeError as exc:
                log.warning("assignments: %s", exc)
        for partition, node_id in self._assigned.items():
            if node_id == self._node.node_id:
                self.kick(partition)
        for partition in stale_owner:
            if self.assigned_elsewhere(partition):
                self.kick(partition)
        return snapshot.revision

    def on_event(self, event: WatchEvent) -> None:
        """Take in one change under ``partitions/`` (called by the node's watch)."""
        partition, record = meta_keys.parse_partition_key(event.key)
        if record == "assignment":
            if event.kind == "delete":
                # The topic is gone (or an operator cleared it): nothing to follow; deleting
                # the owner key is what stops a partition.
                self._assigned.pop(partition, None)
                return
            try:
                node_id = Assignment.model_validate_json(event.value).node_id
            except ValueError as exc:
                log.warning("assignments: bad value at %s: %s", event.key, exc)
                return
            previous = self._assigned.get(partition)
            self._assigned[partition] = node_id
            me = self._node.node_id
            if node_id == me or previous == me or self._node.get(partition) is not None:
                self.kick(partition)
        elif record == "owner" and event.kind == "delete" and self.assigned_here(partition):
            self.kick(partition)  # the old owner is gone: claim now, not at the next poll

    def kick(self, partition: TopicName) -> None:
        """Wake the partition's reconcile task, starting one if none runs."""
        if self._closed:
            return
        self._wake.setdefault(partition, asyncio.Event()).set()
        if partition not in self._tasks:
            self._tasks[partition] = asyncio.get_running_loop().create_task(
                self._reconcile(partition), name=f"follow-{partition}"
            )

    async def _reconcile(self, partition: TopicName) -> None:
        wake = self._wake[partition]
        failures = 0
        try:
            while True:
                wake.clear()
                try:
                    done = await self._step(partition)
                except OwnershipError as exc:  # lost a claim race: wait as for any owner
                    log.info("%s: %s", partition, exc)
                    done = False
                except Exception as exc:  # etcd or the WAL failed: try again, capped
                    log.warning("following the assignment of %s failed: %s", partition, exc)
                    done = False
                if done and not wake.is_set():
                    return  # no await since the check: a later kick starts a new task
                if not done:
                    failures += 1
                    delay_s = backoff_s(failures - 1, base_s=_POLL_BASE_S, cap_s=_POLL_CAP_S)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay_s):
                            await wake.wait()
        finally:
            if self._tasks.get(partition) is asyncio.current_task():
                del self._tasks[partition]
                self._wake.pop(partition, None)

    async def _step(self, partition: TopicName) -> bool:
        """One move towards the assignment; ``False`` while waiting for another owner."""
        node = self._node
        if not node.lease.alive:
            return True  # the node is fencing itself and exits; nothing may be claimed
        served = node.get(partition)
        serving = served is not None and not served.fenced
        if self.assigned_here(partition):
            if serving:
                return True
            # Our view trails etcd by the watch's delay. An owner key deleted together with its
            # assignment (a topic delete) must not be claimed again: ask etcd before claiming.
            key = meta_keys.partition_assignment_key(partition)
            assignment = await self._store.get_model(key, Assignment)
            if assignment is None or assignment.node_id != node.node_id:
                return True  # the watch event that follows brings our view up to date
            owner = await self._store.get_model(meta_keys.partition_owner_key(partition), Owner)
            if owner is not None and owner.node_id != node.node_id:
                return False  # the previous owner has not let go yet
            await node.ensure_serving(partition)
            return True
        if self.assigned_elsewhere(partition):
            await node.hand_over(partition)
        return True

    async def close(self) -> None:
        """Stop following: cancel every reconcile task (idempotent)."""
        self._closed = True
        for task in list(self._tasks.values()):
            await cancel_and_wait(task, timeout_s=self._store.request_timeout_s)
        self._tasks.clear()
