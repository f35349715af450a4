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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import aetcd.rpc
import grpc

from danube.config.errors import ConfigError
from danube.config.model import MetadataConfig
from danube.config.secrets import read_password
from danube.meta.aio import cancel_and_wait
from danube.meta.errors import (
    INVALID_TOKEN_DETAIL,
    LeaseLostError,
    MetaAuthError,
    MetaError,
    map_error,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_GRPC_OPTIONS = {
    # Ranges are paged (and pages shrink when one is too big), so this only bounds memory.
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
    # Detect a dead connection under a long-lived watch (etcd allows pings every >= 5 s).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}


@dataclass(frozen=True)
class EtcdLogin:
    """Who the client is to etcd (``MetadataConfig.user`` and its password), and how the
    channel is secured (``tls``: gRPC channel credentials; None: plain TCP)."""

    user: str | None = None
    password: str | None = None
    tls: grpc.ChannelCredentials | None = None

    def __repr__(self) -> str:  # never the password, whatever prints this
        return f"EtcdLogin(user={self.user!r}, tls={self.tls is not None})"

    @classmethod
    def from_config(cls, config: MetadataConfig) -> EtcdLogin:
        """Read the password and TLS files ``config`` names (raise ConfigError if one
        cannot be read; the message has the path, never the content)."""
        password = read_password(config.password, config.password_file, key="metadata")
        tls = None
        if config.ca_file is not None:
            tls = grpc.ssl_channel_credentials(
                root_certificates=_read_file(config.ca_file, "ca_file"),
                private_key=_read_file(config.key_file, "key_file") if config.key_file else None,
                certificate_chain=(
                    _read_file(config.cert_file, "cert_file") if config.cert_file else None
                ),
            )
        return cls(user=config.user, password=password, tls=tls)


def _read_file(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"metadata.{key}: cannot read {path}: {exc.strerror}") from None


class _AetcdClient(aetcd.Client):  # type: ignore[misc]
    """aetcd's client, over TLS when given channel credentials, and able to log in again.

    aetcd 1.0 only opens plain channels; ``connect`` here is its own with that one change.
    """

    _is_connecting: bool
    metadata: Any

    def __init__(self, host: str, port: int, login: EtcdLogin, **kwargs: Any) -> None:
        super().__init__(host, port, username=login.user, password=login.password, **kwargs)
        self._tls = login.tls

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # another task is connecting: wait for it
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            options = self._options.items()
            if self._tls is None:
                self.channel = aetcd.rpc.insecure_channel(target, options=options)
            else:
                self.channel = aetcd.rpc.secure_channel(target, self._tls, options=options)
            if self._username is not None:
                self.auth_stub = aetcd.rpc.AuthStub(self.channel)
                await self.authenticate()
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False

    async def authenticate(self) -> None:
        """Log in (again): a fresh token for every later call, watches created later too."""
        request = aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password)
        reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
        self.metadata = (("token", reply.token),)
        if self._watcher is not None:
            self._watcher._metadata = self.metadata


class EtcdClient:
    """One aetcd client; every call has the deadline ``request_timeout_s``.

    With a ``login`` user, the client logs in at connect, and again once when etcd says
    its token is no longer valid (etcd restarted: its simple tokens live in memory)."""

    def __init__(
        self, endpoint: str, *, request_timeout_s: float, login: EtcdLogin | None = None
    ) -> None:
        host, _, port = endpoint.rpartition(":")
        self._login = login or EtcdLogin()
        self._client = _AetcdClient(
            host,
            int(port),
            self._login,
            timeout=request_timeout_s,
            options=dict(_GRPC_OPTIONS),
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
        try:
            return await self._call_once(op, fn)
        except MetaAuthError as exc:
            if self._login.user is None or INVALID_TOKEN_DETAIL not in str(exc):
                raise
            log.info("etcd %s: the auth token is no longer valid; logging in again", op)
            await self._call_once("authenticate", self._client.authenticate)
            return await self._call_once(op, fn)

    async def _call_once(self, op: str, fn: Callable[[], Awaitable[T]]) -> T:
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

    async def auth(self, op: str, method: str, request: Any) -> Any:
        """Call ``method`` (``UserAdd``, ``RoleGrantPermission``, ``AuthEnable``...) of etcd's
        Auth service: the setup of a secured mesh (danube.runtime.secure)."""

        def send() -> Awaitable[Any]:
            stub = getattr(aetcd.rpc.AuthStub(self._client.channel), method)
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
