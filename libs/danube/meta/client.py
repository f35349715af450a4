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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aetcd
import aetcd.rpc
import grpc

from danube.aio import awaited_task
from danube.config.errors import ConfigError
from danube.config.secrets import read_password
from danube.config.wal_cloud import MetadataConfig
from danube.meta.backoff import backoff_s
from danube.meta.errors import (
    INVALID_TOKEN_DETAIL,
    LeaseLostError,
    MetaAuthError,
    MetaError,
    MetaTimeoutError,
    MetaUnavailableError,
    map_error,
)
from danube.tasks import TaskSet, TaskSetClosedError

log = logging.getLogger(__name__)

T = TypeVar("T")

_GRPC_OPTIONS = {
    # Ranges are paged (and pages shrink when one is too big), so this only bounds memory.
    "grpc.max_receive_message_length": 64 * 1024 * 1024,
    # Detect a dead connection under a long-lived watch (etcd allows pings every >= 5 s).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}
# etcd ends a watch stream that carries this when its member has no leader (cut off from
# the quorum): such a member would otherwise keep the watch open and silent.
_REQUIRE_LEADER = ("hasleader", "true")
# Once every member has failed in turn, the next switch waits this (doubling, jittered).
FAILOVER_BACKOFF_BASE_S = 0.1
FAILOVER_BACKOFF_CAP_S = 2.0


def split_endpoints(endpoints: str | Sequence[str]) -> tuple[str, ...]:
    """``host:port`` members from a list, or from one string of comma-separated ones
    (Danube's ``etcd_endpoint``, an environment variable)."""
    items = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    return tuple(part.strip() for item in items for part in item.split(",") if part.strip())


def member_failed(error: MetaError) -> bool:
    """Whether ``error`` blames the member the call went to rather than the request:
    unreachable, without a leader, shedding load, or silent until the deadline."""
    return isinstance(error, MetaUnavailableError | MetaTimeoutError)


def _watch_metadata(metadata: Any) -> tuple[tuple[str, str], ...]:
    return (*(metadata or ()), _REQUIRE_LEADER)


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
                aetcd.rpc.WatchStub(self.channel),
                timeout=self._timeout,
                metadata=_watch_metadata(self.metadata),
            )
            self._connected.set()
        finally:
            self._is_connecting = False

    async def abandon(self, error: MetaError) -> None:
        """End every watch of this member with ``error``, whatever state aetcd's watch
        stream is in (closing a channel cancels that stream's task, which then tells its
        watches nothing; a frozen member's stream may never end at all)."""
        watcher = self._watcher
        if watcher is None:
            return
        callbacks, watcher._callbacks = list(watcher._callbacks.values()), {}
        for callback in callbacks:
            await callback.callback(error)

    async def authenticate(self) -> None:
        """Log in (again): a fresh token for every later call, watches created later too."""
        request = aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password)
        reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
        self.metadata = (("token", reply.token),)
        if self._watcher is not None:
            self._watcher._metadata = _watch_metadata(self.metadata)


class EtcdClient:
    """One etcd cluster, reached through one member at a time; every call has the deadline
    ``request_timeout_s``.

    **Failover.** ``endpoints`` are the members' ``host:port``; the client talks to the first
    and, when the member it talks to fails a call in a way that says the member (not the
    request) is at fault (connection refused or lost, ``no leader``, no answer within the
    deadline: :func:`member_failed`), it moves to the next, round robin. aetcd itself takes one
    host and port, so this is the one place that knows there are several. The switch:

    - is made once per failure: calls that fail together on the same member move it once (a
      *generation* number tells a failure of the member in use from a late one of a member
      already left);
    - closes the old member's channel, so every watch on it ends with a :class:`WatchError`
      and its owner resumes from its last revision on the new member (danube.meta.follow);
      a frozen member's watches, which would otherwise stay silent, end too;
    - leaves leases alone: a lease is the cluster's, its keep-alive simply continues on the
      new member (danube.meta.lease gives each refresh a third of the TTL, so a silent member
      costs one refresh, not the lease);
    - retries an idempotent call (a read, a lease grant, a watch's creation) once on the new
      member; a write is never resent (it may have been applied): its retriable error goes to
      the caller (a keep-alive's caller, the lease, tries again soon by itself);
    - backs off once a whole round of members has failed in a row: the next switch waits a
      jittered, capped exponential delay (``FAILOVER_BACKOFF_BASE_S`` doubling to
      ``FAILOVER_BACKOFF_CAP_S``), so a cluster that is wholly down is not hammered.

    With a ``login`` user, the client logs in at connect (on each member it moves to), and
    again once when etcd says its token is no longer valid (etcd restarted: its simple tokens
    live in memory)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        request_timeout_s: float,
        login: EtcdLogin | None = None,
    ) -> None:
        self.endpoints = split_endpoints(endpoints)
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        self._login = login or EtcdLogin()
        self.request_timeout_s = request_timeout_s
        self._index = 0
        self._generation = 0  # +1 at every switch of member
        self._failed_in_a_row = 0  # switches since a call last succeeded
        self.failovers = 0  # switches made so far (logged, and read by tests)
        self._client = self._member(0)
        # Both only clean up (each catches what it meets): a failure of theirs is logged.
        self._retired = TaskSet("etcd members left")  # their channels being closed
        self._orphans = TaskSet("etcd orphaned watches")  # created for cancelled callers
        self._closed = False

    @property
    def endpoint(self) -> str:
        """The member calls go to now."""
        return self.endpoints[self._index]

    def _member(self, index: int) -> _AetcdClient:
        host, _, port = self.endpoints[index].rpartition(":")
        return _AetcdClient(
            host,
            int(port),
            self._login,
            timeout=self.request_timeout_s,
            options=dict(_GRPC_OPTIONS),
        )

    async def connect(self) -> None:
        """Set up the gRPC channel (no round trip: a first request finds etcd or not)."""
        await self.call("connect", lambda: self._client.connect(), idempotent=True)

    async def close(self) -> None:
        """Cancel orphaned watches and close the channel (idempotent, never raises)."""
        if self._closed:
            return
        await self._orphans.close(timeout_s=self.request_timeout_s)
        self._closed = True
        await self._retired.close(timeout_s=self.request_timeout_s)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._client.close()
        except Exception as exc:  # closing a broken channel must not mask the caller's error
            log.warning("closing the etcd client failed: %r", exc)

    async def call(
        self,
        op: str,
        fn: Callable[[], Awaitable[T]],
        *,
        idempotent: bool = False,
        timeout_s: float | None = None,
    ) -> T:
        """Await ``fn()`` within the deadline (``timeout_s``, else ``request_timeout_s``);
        raise only :class:`MetaError`. ``fn`` must reach etcd through ``self._client`` as it
        is when ``fn`` runs, so that a retry after a failover goes to the new member."""
        try:
            return await self._call_member(op, fn, idempotent=idempotent, timeout_s=timeout_s)
        except MetaAuthError as exc:
            if self._login.user is None or INVALID_TOKEN_DETAIL not in str(exc):
                raise
            log.info("etcd %s: the auth token is no longer valid; logging in again", op)
            await self._call_once("authenticate", lambda: self._client.authenticate(), None)
            return await self._call_member(op, fn, idempotent=idempotent, timeout_s=timeout_s)

    async def _call_member(
        self, op: str, fn: Callable[[], Awaitable[T]], *, idempotent: bool, timeout_s: float | None
    ) -> T:
        """One call, and once more on the next member if this one failed and the call may
        be sent twice."""
        try:
            return await self._call_once(op, fn, timeout_s)
        except MetaError as exc:
            if not (idempotent and member_failed(exc)) or len(self.endpoints) == 1:
                raise
            log.info("etcd %s: %s; trying again on %s", op, exc, self.endpoint)
            return await self._call_once(op, fn, timeout_s)

    async def _call_once(
        self, op: str, fn: Callable[[], Awaitable[T]], timeout_s: float | None
    ) -> T:
        if self._closed:
            raise MetaError(f"etcd {op}: the store is closed", code="meta_closed")
        generation, client = self._generation, self._client
        try:
            async with asyncio.timeout(self.request_timeout_s if timeout_s is None else timeout_s):
                await client.connect()  # a member just switched to has no channel yet
                result = await fn()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if generation == self._generation or (current is not None and current.cancelling()):
                raise
            # Not this task's cancellation: gRPC cancels the calls of a channel we closed
            # when we left its member. For the caller that is a failed call, to retry.
            raise MetaUnavailableError(
                f"etcd {op}: the member it went to was left for {self.endpoint}"
            ) from None
        except MetaError as exc:
            await self._after_failure(exc, generation)
            raise
        except (TimeoutError, aetcd.ClientError, aetcd.rpc.AioRpcError) as exc:
            error = map_error(exc, op=op)
            await self._after_failure(error, generation)
            raise error from exc
        if generation == self._generation:
            self._failed_in_a_row = 0
        return result

    async def _after_failure(self, error: MetaError, generation: int) -> None:
        """Move to the next member when ``error`` says the member in use (still the one of
        ``generation``) has failed."""
        if not member_failed(error) or generation != self._generation or self._closed:
            return
        if len(self.endpoints) == 1:
            return
        self._failed_in_a_row += 1
        rounds = (self._failed_in_a_row - 1) // len(self.endpoints)
        if rounds > 0:  # every member failed in turn: wait before the next round
            await asyncio.sleep(
                backoff_s(rounds - 1, base_s=FAILOVER_BACKOFF_BASE_S, cap_s=FAILOVER_BACKOFF_CAP_S)
            )
            if generation != self._generation or self._closed:
                return  # another caller switched meanwhile
        old, failed = self._client, self.endpoint
        self._index = (self._index + 1) % len(self.endpoints)
        self._generation += 1
        self.failovers += 1
        self._client = self._member(self._index)
        log.warning(
            "etcd member %s failed (%s); switching to %s", failed, error.code, self.endpoint
        )
        self._retired.spawn(self._retire(old, failed), name=f"retire {failed}", on_failure="log")

    async def _retire(self, old: _AetcdClient, failed: str) -> None:
        """Close a member left behind: its channel first (its calls end at once, even on a
        frozen member), then its watches, each with an error that carries where to resume,
        then aetcd's own cleanup, bounded."""
        error = MetaUnavailableError(f"etcd watch: member {failed} was left for {self.endpoint}")
        try:
            if old.channel is not None:
                await old.channel.close()
        except Exception as exc:  # the member is gone already: nothing is left to free
            log.debug("closing the channel to a failed etcd member: %r", exc)
        try:
            await old.abandon(error)
            async with asyncio.timeout(self.request_timeout_s):
                await old.close()
        except Exception as exc:
            log.debug("cleaning up after a failed etcd member: %r", exc)

    async def kv(self, op: str, method: str, request: Any) -> Any:
        """Call ``method`` (``Range``, ``Put``, ``DeleteRange``, ``Txn``) of etcd's KV service."""

        def send() -> Awaitable[Any]:
            stub = getattr(self._client.kvstub, method)
            timeout_s, metadata = self.request_timeout_s, self._client.metadata
            return stub(request, timeout=timeout_s, metadata=metadata)  # type: ignore[no-any-return]

        return await self.call(op, send, idempotent=method == "Range")

    async def auth(self, op: str, method: str, request: Any) -> Any:
        """Call ``method`` (``UserAdd``, ``RoleGrantPermission``, ``AuthEnable``...) of etcd's
        Auth service: the setup of a secured mesh (danube.up.secure)."""

        def send() -> Awaitable[Any]:
            stub = getattr(aetcd.rpc.AuthStub(self._client.channel), method)
            timeout_s, metadata = self.request_timeout_s, self._client.metadata
            return stub(request, timeout=timeout_s, metadata=metadata)  # type: ignore[no-any-return]

        return await self.call(op, send)

    # --- leases: also the LeaseBackend of danube.meta.lease -------------------------------

    async def grant_lease(self, ttl_s: int) -> tuple[int, int]:
        """Grant a lease; return its id and the TTL etcd granted (it may raise short ones)."""
        # Sent again on another member if this one fails: a lease granted twice costs only
        # an unused lease that expires after its TTL.
        granted = await self.call("lease grant", lambda: self._client.lease(ttl_s), idempotent=True)
        return int(granted.id), int(granted.ttl)

    async def keep_alive_once(self, lease_id: int, *, timeout_s: float | None = None) -> float:
        """Refresh a lease once (within ``timeout_s``, else the request deadline); return the
        TTL etcd restarted (<= 0: the lease is gone)."""
        reply = await self.call(
            "lease keep-alive",
            # Not resent here: the lease's own loop tries again soon, on the new member.
            lambda: self._client.refresh_lease(lease_id),
            timeout_s=timeout_s,
        )
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
        creating = awaited_task(
            self.call(
                "watch",
                lambda: self._client.watch(key, range_end=range_end, start_revision=start_revision),
                idempotent=True,
            ),
            name="etcd watch",
        )
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            try:
                self._orphans.spawn(
                    self._cancel_when_created(creating), name="orphaned watch", on_failure="log"
                )
            except TaskSetClosedError:  # closing: the channel goes, and the watch with it
                creating.cancel()
            raise

    async def _cancel_when_created(self, creating: asyncio.Task[Any]) -> None:
        try:
            handle = await creating
            async with asyncio.timeout(self.request_timeout_s):
                await handle.cancel()
        except Exception as exc:  # nothing was created, or the stream is gone already
            log.debug("cancelling an orphaned watch: %r", exc)
