"""The typed etcd store of the mesh: keys, transactions, leases and watches under a prefix.

Every key given to :class:`MetaStore` is relative to ``metadata.prefix`` (default ``/danube``):
``store.get("topics/default/orders")`` reads ``/danube/topics/default/orders``, and keys
come back relative too. Every call has a deadline (``request_timeout_s``, enforced both by
gRPC and by ``asyncio.timeout``) and raises only :class:`MetaError` subclasses. The aetcd
connection itself is :class:`~danube.meta.client.EtcdClient`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aetcd.rpc
from pydantic import BaseModel

from danube.config.wal_cloud import MetadataConfig
from danube.meta.client import EtcdClient, EtcdLogin, member_failed
from danube.meta.errors import LeaseLostError, MetaError, MetaRequestError, UpdateRacedError
from danube.meta.kv import KeyValue, M, check_value, decode_model, encode_model, kv_from_pb
from danube.meta.lease import REFRESHES_PER_TTL, Lease
from danube.meta.txn import PutOp, Txn, TxnResult, build_request, parse_response, prefix_range_end
from danube.meta.watch import WATCH_BUFFER_EVENTS, Watch

# One range request returns at most this many keys (fewer when a page is too big for one
# gRPC message); longer ranges are read in pages pinned to the first page's revision, so
# the result is still one consistent snapshot.
RANGE_PAGE_KEYS = 1000
# A range without a limit refuses to return more than this (use ``limit`` and paging).
RANGE_KEYS_MAX = 100_000
LEASE_TTL_MAX_S = 86_400


@dataclass(frozen=True, slots=True)
class RangeResult:
    """Keys under a prefix at one ``revision``; ``more`` when ``limit`` cut the list short.
    Watching from ``revision + 1`` then sees every later change exactly once."""

    revision: int
    kvs: list[KeyValue]
    more: bool


class MetaStore:
    """The etcd metadata store under one key prefix. Open with :meth:`connect`."""

    def __init__(self, etcd: EtcdClient, *, prefix: str) -> None:
        self._etcd = etcd
        self._prefix = prefix.rstrip("/") + "/"
        self._prefix_bytes = len(self._prefix.encode())
        self._leases: set[Lease] = set()

    @classmethod
    async def connect(cls, config: MetadataConfig) -> MetaStore:
        """Open a connection to the etcd cluster ``config.etcd_endpoints`` and check it
        answers: the first member that does is the one used (each is tried once; the error of
        the last one is raised when none answers)."""
        etcd = EtcdClient(
            config.etcd_endpoints,
            request_timeout_s=config.request_timeout_s,
            login=EtcdLogin.from_config(config),
        )
        store = cls(etcd, prefix=config.prefix)
        try:
            for tried in range(1, len(etcd.endpoints) + 1):
                try:
                    await etcd.connect()
                    await store.ping()
                    break
                except MetaError as exc:  # a failed member: the client moved to the next
                    if tried == len(etcd.endpoints) or not member_failed(exc):
                        raise
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Revoke the leases this store granted (best effort), then close the connection."""
        leases = [lease for lease in self._leases if lease.alive]
        if leases:
            await asyncio.gather(*(lease.revoke() for lease in leases))
        await self._etcd.close()

    async def __aenter__(self) -> MetaStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def prefix(self) -> str:
        """The absolute prefix every key lives under, with its trailing ``/``."""
        return self._prefix

    @property
    def request_timeout_s(self) -> float:
        """The deadline of each request."""
        return self._etcd.request_timeout_s

    # --- plumbing --------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        if not key or key.startswith("/"):
            raise MetaRequestError(f"key {key!r} must be non-empty and relative (no leading /)")
        return (self._prefix + key).encode()

    def _range_of(self, prefix: str) -> tuple[bytes, bytes]:
        if prefix.startswith("/"):
            raise MetaRequestError(f"prefix {prefix!r} must be relative (no leading /)")
        start = (self._prefix + prefix).encode()
        return start, prefix_range_end(start)

    # --- keys --------------------------------------------------------------------------

    async def ping(self) -> int:
        """Check etcd answers; return its current revision."""
        start, _ = self._range_of("")
        request = aetcd.rpc.RangeRequest(key=start, count_only=True)
        response = await self._etcd.kv("ping", "Range", request)
        return int(response.header.revision)

    async def get(self, key: str) -> KeyValue | None:
        """The key, or ``None`` if it does not exist."""
        request = aetcd.rpc.RangeRequest(key=self._key(key))
        response = await self._etcd.kv("get", "Range", request)
        return kv_from_pb(response.kvs[0], self._prefix_bytes) if response.kvs else None

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        """Write the key (attached to ``lease`` if given); return the revision of the write."""
        check_value(key, value)
        lease_id = 0
        if lease is not None:
            lease.ensure_alive()
            lease_id = lease.id
        request = aetcd.rpc.PutRequest(key=self._key(key), value=value, lease=lease_id)
        try:
            response = await self._etcd.kv("put", "Put", request)
        except LeaseLostError as exc:
            raise LeaseLostError(exc.message, lease_id=lease_id) from exc
        return int(response.header.revision)

    async def range(self, prefix: str, *, limit: int | None = None) -> list[KeyValue]:
        """The keys under ``prefix`` (``""``: all), sorted by key, at most ``limit`` of them."""
        return (await self.snapshot(prefix, limit=limit)).kvs

    async def snapshot(
        self, prefix: str, *, limit: int | None = None, start_key: str | None = None
    ) -> RangeResult:
        """Like :meth:`range`, with the revision read at; ``start_key`` (relative, under the
        prefix) starts the range there, to page through long ranges."""
        if limit is not None and limit < 1:
            raise MetaRequestError("limit must be at least 1")
        begin, end = self._range_of(prefix)
        if start_key is not None:
            begin = max(begin, self._key(start_key))
        wanted = RANGE_KEYS_MAX + 1 if limit is None else limit
        kvs: list[KeyValue] = []
        revision, page, more = 0, RANGE_PAGE_KEYS, True
        while more and len(kvs) < wanted:
            request = aetcd.rpc.RangeRequest(
                key=begin, range_end=end, limit=min(page, wanted - len(kvs)), revision=revision
            )
            try:
                response = await self._etcd.kv("range", "Range", request)
            except MetaRequestError as exc:
                if exc.code != "response_too_large" or page == 1:
                    raise
                page //= 2  # big values: the same keys fit in smaller pages
                continue
            revision = revision or int(response.header.revision)
            kvs.extend(kv_from_pb(kv, self._prefix_bytes) for kv in response.kvs)
            more = bool(response.more)
            if response.kvs:
                begin = bytes(response.kvs[-1].key) + b"\0"
        if limit is None and len(kvs) > RANGE_KEYS_MAX:
            raise MetaRequestError(
                f"more than {RANGE_KEYS_MAX} keys under {prefix!r}: read them with limit/start_key"
            )
        return RangeResult(revision, kvs, more)

    async def delete(self, key: str) -> bool:
        """Delete the key; ``False`` if it did not exist."""
        request = aetcd.rpc.DeleteRangeRequest(key=self._key(key))
        response = await self._etcd.kv("delete", "DeleteRange", request)
        return int(response.deleted) > 0

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix`` (``""``: the whole store); return how many."""
        begin, end = self._range_of(prefix)
        request = aetcd.rpc.DeleteRangeRequest(key=begin, range_end=end)
        response = await self._etcd.kv("delete_prefix", "DeleteRange", request)
        return int(response.deleted)

    # --- transactions ------------------------------------------------------------------

    def txn(self) -> Txn:
        """A new transaction builder; ``await txn.commit()`` sends it."""
        return Txn(self)

    async def commit(self, txn: Txn) -> TxnResult:
        """Send a transaction built with :meth:`txn`."""
        for op in (*txn.success, *txn.failure):
            if isinstance(op, PutOp) and isinstance(op.lease, Lease):
                op.lease.ensure_alive()
        request = build_request(txn, self._key)
        response = await self._etcd.kv("txn", "Txn", request)
        return parse_response(response, self._prefix_bytes)

    async def create(self, key: str, value: bytes, *, lease: Lease | None = None) -> bool:
        """Write the key only if it does not exist; ``True`` if this call created it."""
        result = await self.txn().if_absent(key).then_put(key, value, lease=lease).commit()
        return result.succeeded

    async def compare_and_swap(
        self,
        key: str,
        value: bytes,
        *,
        expected_mod_revision: int,
        lease: Lease | None = None,
    ) -> bool:
        """Write the key only if its last write is ``expected_mod_revision`` (0: absent)."""
        result = await (
            self.txn()
            .if_mod_revision(key, "==", expected_mod_revision)
            .then_put(key, value, lease=lease)
            .commit()
        )
        return result.succeeded

    async def compare_and_delete(self, key: str, *, expected_mod_revision: int) -> bool:
        """Delete the key only if its last write is ``expected_mod_revision``."""
        result = await (
            self.txn().if_mod_revision(key, "==", expected_mod_revision).then_delete(key).commit()
        )
        return result.succeeded

    # --- JSON models -----------------------------------------------------------------

    async def get_model(self, key: str, model: type[M]) -> M | None:
        """The key's value decoded as ``model``, or ``None`` if the key does not exist."""
        found = await self.get_model_kv(key, model)
        return None if found is None else found[0]

    async def get_model_kv(self, key: str, model: type[M]) -> tuple[M, KeyValue] | None:
        """The decoded value and its :class:`KeyValue` (for the revisions a CAS needs)."""
        kv = await self.get(key)
        return None if kv is None else (decode_model(kv, model), kv)

    async def update_model(
        self, key: str, model: type[M], change: Callable[[M], M], *, tries: int
    ) -> tuple[M, M] | None:
        """Read ``key`` as ``model``, write ``change(current)`` if the key is still as read
        (compare-and-swap on its mod revision), again from the read on a race, at most
        ``tries`` times: ``(before, after)``; ``None`` when the key does not exist.
        ``change`` returning ``current`` itself writes nothing; what it raises propagates
        (a refused change). UpdateRacedError when every try lost the race."""
        for _ in range(tries):
            found = await self.get_model_kv(key, model)
            if found is None:
                return None
            current, kv = found
            updated = change(current)
            if updated is current:
                return current, current
            if await self.compare_and_swap(
                key, encode_model(updated), expected_mod_revision=kv.mod_revision
            ):
                return current, updated
        raise UpdateRacedError(key=key, tries=tries)

    async def put_model(self, key: str, value: BaseModel, *, lease: Lease | None = None) -> int:
        """Write ``value`` as JSON; return the revision of the write."""
        return await self.put(key, encode_model(value), lease=lease)

    async def create_model(self, key: str, value: BaseModel, *, lease: Lease | None = None) -> bool:
        """Write ``value`` as JSON only if the key does not exist."""
        return await self.create(key, encode_model(value), lease=lease)

    async def range_models(
        self, prefix: str, model: type[M], *, limit: int | None = None
    ) -> list[tuple[str, M]]:
        """``(key, value)`` for each key under ``prefix``, decoded as ``model``."""
        return [(kv.key, decode_model(kv, model)) for kv in await self.range(prefix, limit=limit)]

    # --- leases ------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> Lease:
        """Grant a lease of ``ttl_s`` seconds (etcd may raise it to its minimum, ~2 s) and
        start its keep-alive. Revoke it, or close the store, to release it."""
        if not 1 <= ttl_s <= LEASE_TTL_MAX_S:
            raise MetaRequestError(f"lease ttl_s must be in 1..{LEASE_TTL_MAX_S}, not {ttl_s}")
        granted_at = asyncio.get_running_loop().time()
        lease_id, granted_ttl_s = await self._etcd.grant_lease(ttl_s)
        lease = Lease(
            self._etcd,
            lease_id,
            float(granted_ttl_s),
            granted_at=granted_at,
            request_timeout_s=self.request_timeout_s,
            refresh_timeout_ttl_share=(
                1 / REFRESHES_PER_TTL if len(self._etcd.endpoints) > 1 else 1.0
            ),
        )
        self._leases.add(lease)
        lease.on_lost(self._leases.discard)
        lease.start()
        return lease

    @asynccontextmanager
    async def lease(self, ttl_s: int) -> AsyncIterator[Lease]:
        """``async with store.lease(10) as lease:`` grants, keeps alive, then revokes."""
        granted = await self.grant_lease(ttl_s)
        try:
            yield granted
        finally:
            await granted.revoke()

    async def grant_bare_lease(self, ttl_s: int) -> tuple[int, float]:
        """Grant a lease that nobody here keeps alive; return its id and granted TTL. Its
        holder (a producer session's client) refreshes it with :meth:`refresh_lease`
        through whichever instance it reaches; :meth:`close` leaves it alone."""
        if not 1 <= ttl_s <= LEASE_TTL_MAX_S:
            raise MetaRequestError(f"lease ttl_s must be in 1..{LEASE_TTL_MAX_S}, not {ttl_s}")
        lease_id, granted_ttl_s = await self._etcd.grant_lease(ttl_s)
        return lease_id, float(granted_ttl_s)

    @property
    def endpoint(self) -> str:
        """The etcd member calls go to now (it changes when one fails)."""
        return self._etcd.endpoint

    @property
    def failovers(self) -> int:
        """How many times this store moved to another etcd member."""
        return self._etcd.failovers

    async def refresh_lease(self, lease_id: int) -> float:
        """Refresh a lease by id once; the TTL etcd restarted (<= 0: the lease is gone)."""
        return await self._etcd.keep_alive_once(lease_id)

    async def revoke_lease(self, lease_id: int) -> bool:
        """Revoke a lease by id (its keys vanish); ``False`` if etcd no longer had it."""
        return await self._etcd.revoke_lease(lease_id)

    # --- watches -----------------------------------------------------------------------

    def watch_prefix(
        self,
        prefix: str,
        *,
        start_revision: int | None = None,
        buffer_size: int = WATCH_BUFFER_EVENTS,
    ) -> Watch:
        """The changes under ``prefix`` from ``start_revision`` (inclusive; default: from now).
        Use as ``async with store.watch_prefix(p) as events: async for event in events:``."""
        begin, end = self._range_of(prefix)
        return self._watch(begin, end, start_revision, buffer_size)

    def watch_key(
        self,
        key: str,
        *,
        start_revision: int | None = None,
        buffer_size: int = WATCH_BUFFER_EVENTS,
    ) -> Watch:
        """The changes of one key; otherwise like :meth:`watch_prefix`."""
        return self._watch(self._key(key), None, start_revision, buffer_size)

    def _watch(
        self, key: bytes, range_end: bytes | None, start_revision: int | None, buffer_size: int
    ) -> Watch:
        async def create(revision: int | None) -> Any:
            return await self._etcd.watch(key, range_end, revision)

        return Watch(
            create,
            prefix_bytes=self._prefix_bytes,
            start_revision=start_revision,
            buffer_size=buffer_size,
            cancel_timeout_s=self.request_timeout_s,
        )
