"""The one connection to etcd: deadlines, error mapping, and everything that touches aetcd.

aetcd is untyped; :class:`EtcdClient` is the seam that keeps it in one place. It takes
absolute byte keys and protobuf requests; :class:`~danube.meta.store.MetaStore` builds
those from relative keys and typed values. Plain reads and writes go straight to aetcd's
gRPC stubs, since aetcd's own wrappers cannot limit a range nor return a transaction's
revision; leases and watches use aetcd's helpers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aetcd
import aetcd.rpc

from danube.meta.aio import cancel_and_wait
from danube.meta.errors import LeaseLostError, MetaError, map_error

log = logging.getLogger(__name__)

T = TypeVar("T")

_GRPC_OPTIONS = {
    # Ranges are paged (and pages shrink when one is too big), so this only bounds memory.
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
    # Detect a dead connection under a long-lived watch (etcd allows pings every >= 5 s).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}


class EtcdClient:
    """One aetcd client; every call has the deadline ``request_timeout_s``."""

    def __init__(self, endpoint: str, *, request_timeout_s: float) -> None:
        host, _, port = endpoint.rpartition(":")
        self._client = aetcd.Client(
            host, int(port), timeout=request_timeout_s, options=dict(_GRPC_OPTIONS)
        )
        self.request_timeout_s = request_timeout_s
        self._orphans: set[asyncio.Task[None]] = set()  # watches created for cancelled callers
        self._closed = False

    async def connect(self) -> None:
        """Set up the gRPC channel (no round trip: a first request finds etcd or not)."""
        await self.call("connect", self._client.connect)

    async def close(self) -> None:
        """Cancel orphaned watches and close the channel (idempotent, never raises)."""
        if self._closed:
            return
        for orphan in list(self._orphans):
            await cancel_and_wait(orphan, timeout_s=self.request_timeout_s)
        self._closed = True
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._client.close()
        except Exception as exc:  # closing a broken channel must not mask the caller's error
            log.warning("closing the etcd client failed: %r", exc)

    async def call(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Await ``fn()`` within the deadline; raise only :class:`MetaError`."""
        if self._closed:
            raise MetaError(f"etcd {op}: the store is closed", code="meta_closed")
        try:
            async with asyncio.timeout(self.request_timeout_s):
                return await fn()
        except MetaError:
            raise
        except (TimeoutError, aetcd.ClientError, aetcd.rpc.AioRpcError) as exc:
            raise map_error(exc, op=op) from exc

    async def kv(self, op: str, method: str, request: Any) -> Any:
        """Call ``method`` (``Range``, ``Put``, ``DeleteRange``, ``Txn``) of etcd's KV service."""

        def send() -> Awaitable[Any]:
            stub = getattr(self._client.kvstub, method)
            timeout_s, metadata = self.request_timeout_s, self._client.metadata
            return stub(request, timeout=timeout_s, metadata=metadata)  # type: ignore[no-any-return]

        return await self.call(op, send)

    # --- leases: also the LeaseBackend of danube.meta.lease -------------------------------

    async def grant_lease(self, ttl_s: int) -> tuple[int, int]:
        """Grant a lease; return its id and the TTL etcd granted (it may raise short ones)."""
        granted = await self.call("lease grant", lambda: self._client.lease(ttl_s))
        return int(granted.id), int(granted.ttl)

    async def keep_alive_once(self, lease_id: int) -> float:
        """Refresh a lease once; return the TTL etcd restarted (<= 0: the lease is gone)."""
        reply = await self.call("lease keep-alive", lambda: self._client.refresh_lease(lease_id))
        if reply is None:
            raise MetaError("etcd lease keep-alive: the stream closed without a reply")
        return int(reply.TTL)

    async def revoke_lease(self, lease_id: int) -> bool:
        """Revoke a lease (its keys vanish); ``False`` if etcd no longer had it."""
        try:
            await self.call("lease revoke", lambda: self._client.revoke_lease(lease_id))
        except LeaseLostError:
            return False
        return True

    # --- watches --------------------------------------------------------------------------

    async def watch(self, key: bytes, range_end: bytes | None, start_revision: int | None) -> Any:
        """Create an etcd watch; return aetcd's handle (async iterable of events, ``cancel()``).

        aetcd creates the watch under ``asyncio.wait_for``, which on Python 3.11 can swallow
        a cancellation; so it runs in a task of its own, cancelling *this* call always works,
        and a watch created after its caller was cancelled is cancelled in etcd.
        """
        creating = asyncio.get_running_loop().create_task(
            self.call(
                "watch",
                lambda: self._client.watch(key, range_end=range_end, start_revision=start_revision),
            )
        )
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            orphan = asyncio.get_running_loop().create_task(self._cancel_when_created(creating))
            self._orphans.add(orphan)
            orphan.add_done_callback(self._orphans.discard)
            raise

    async def _cancel_when_created(self, creating: asyncio.Task[Any]) -> None:
        try:
            handle = await creating
            async with asyncio.timeout(self.request_timeout_s):
                await handle.cancel()
        except Exception as exc:  # nothing was created, or the stream is gone already
            log.debug("cancelling an orphaned watch: %r", exc)
