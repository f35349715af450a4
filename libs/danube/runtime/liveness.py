"""Whether the process that holds a key is provably gone, so a claimant may end its lease at
once instead of waiting out the TTL (docs/dispatcher.md, "Taking over from a killed
dispatcher").

A lease is the failure detector of last resort: it expires ``lease_ttl_s`` after the last
keep-alive, whatever became of the process. A process that died (kill -9, a crash, an OOM
kill) on a host that is still up leaves one more sign: its listening sockets are closed, so
a connection to its advertised door is refused at once (the host's kernel answers RST). That
is evidence of death, not of a slow or cut-off process:

- a frozen process (SIGSTOP, a stalled VM's guest still answering) keeps its listening
  socket: the kernel completes the handshake into the backlog, the connect succeeds;
- a host that is down or cut off answers nothing: the connect times out;
- a process that restarted on the same address accepts again.

Only a refusal counts. The door must be the one registered under the very lease that holds
the key (a node registered again under a new lease is another incarnation: its old lease is
in the hands of its own reclaim, danube.dispatcher.store.reclaim). A node that deleted its
registration is leaving cleanly and hands its work over itself: nothing to probe.

A false refusal (a firewall that rejects rather than drops) ends a live node's lease early:
the same as an etcd partition longer than the TTL would, which the owner keys' fencing
already covers (the old owner's cursor writes fail on the changed owner key).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from danube.aio import awaited_task
from danube.meta import MetaError, MetaStore, TopicName
from danube.meta import keys as meta_keys
from danube.meta.keys import ServiceKind
from danube.meta.records import NodeRecord, Owner

# How long a probe's connect may take. A refusal comes back within a round trip; anything
# slower is no evidence and the claim waits for the lease as before.
PROBE_TIMEOUT_S = 0.25


async def refuses_connections(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connect to ``url``'s host and port is refused (nothing listens there).
    False when it connects, times out, or fails any other way (no evidence)."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return False
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(parts.hostname, port)
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


async def gone_door(store: MetaStore, kind: ServiceKind, node_id: str, lease_id: int) -> str | None:
    """The door of ``node_id`` when the process registered under ``lease_id`` is provably
    gone (registered under that lease, its door refusing connections); None otherwise."""
    kv = await store.get(meta_keys.node_key(kind, node_id))
    if kv is None or kv.lease_id != lease_id or lease_id == 0:
        return None
    record = NodeRecord.model_validate_json(kv.value)
    if record.data_url is None or not await refuses_connections(record.data_url):
        return None
    return record.data_url


async def end_lease_if_gone(
    store: MetaStore, kind: ServiceKind, node_id: str, lease_id: int
) -> tuple[str, bool] | None:
    """Revoke ``lease_id``, which holds a key of ``node_id`` (a ``kind`` node), when that
    node is provably gone (:func:`gone_door`): its registration and every key it held go at
    once. Its door and whether this call revoked it (False: another claimant was first),
    or None when there is no evidence (the lease is left to expire). MetaError: etcd."""
    door = await gone_door(store, kind, node_id, lease_id)
    if door is None:
        return None
    return door, await store.revoke_lease(lease_id)


class GoneNodes:
    """:func:`end_lease_if_gone` for many keys of the same nodes at once (a leader's
    partitions, each noticing it silent): one probe at a time per node and lease, its
    answer shared with every asker for ``RECENT_S``. ``on_ended(node_id, door)`` is told
    once for each lease this process revoked."""

    RECENT_S = 0.5

    def __init__(
        self,
        store: MetaStore,
        kind: ServiceKind,
        on_ended: Callable[[str, str], None] | None = None,
    ) -> None:
        self._store = store
        self._kind = kind
        self._on_ended = on_ended
        self._probes: dict[tuple[str, int], asyncio.Task[str | None]] = {}
        self._answers: dict[tuple[str, int], tuple[float, str | None]] = {}

    async def gone(self, node_id: str, lease_id: int) -> str | None:
        """The door of ``node_id`` when it is provably gone and ``lease_id`` is ended now
        (by this process or another); None: no evidence. MetaError: etcd."""
        key = (node_id, lease_id)
        now = time.monotonic()
        known = self._answers.get(key)
        if known is not None and now - known[0] < self.RECENT_S:
            return known[1]
        probe = self._probes.get(key)
        if probe is None:
            probe = awaited_task(self._probe(node_id, lease_id), name=f"probe {node_id}")
            self._probes[key] = probe
            probe.add_done_callback(lambda _: self._probes.pop(key, None))
        door = await asyncio.shield(probe)
        self._answers = {k: v for k, v in self._answers.items() if now - v[0] < self.RECENT_S}
        self._answers[key] = (time.monotonic(), door)
        return door

    async def _probe(self, node_id: str, lease_id: int) -> str | None:
        ended = await end_lease_if_gone(self._store, self._kind, node_id, lease_id)
        if ended is None:
            return None
        door, revoked = ended
        if revoked and self._on_ended is not None:
            self._on_ended(node_id, door)
        return door


async def subscription_owner_gone(store: MetaStore, topic: TopicName, sub: str) -> bool:
    """Whether a request to ``sub`` of ``topic`` that got no reply will never get one: the
    dispatcher that owns it is provably gone (:func:`gone_door`), or nobody owns it any more
    (a dispatcher answers what it was asked before it releases the owner key: a key gone
    under a waiting request went with the lease of a dispatcher that died)."""
    try:
        found = await store.get_model_kv(meta_keys.subscription_owner_key(topic, sub), Owner)
        if found is None:
            return True
        owner, kv = found
        return await gone_door(store, "dispatcher", owner.node_id, kv.lease_id) is not None
    except MetaError:  # etcd away: no evidence either way
        return False
