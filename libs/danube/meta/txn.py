"""A typed builder for etcd transactions: ``if`` compares, ``then`` ops, ``else`` ops.

etcd applies a transaction atomically at one revision: when every compare holds, the
``then`` ops run, otherwise the ``else`` ops. That is the only compare-and-swap etcd has,
so every fenced write of the mesh goes through here::

    result = await (
        store.txn()
        .if_mod_revision(owner_key, "==", owner_revision)   # still the owner we read
        .then_put(reservation_key, encode_model(reservation))
        .commit()
    )
    if not result.succeeded: ...                            # someone else moved first

Absent keys compare as revision 0, version 0, so ``if_absent`` is ``create_revision == 0``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aetcd.rpc

from danube.meta.errors import MetaRequestError
from danube.meta.kv import KeyValue, check_value, kv_from_pb

if TYPE_CHECKING:
    from danube.meta.lease import Lease

CompareOp = Literal["==", "!=", "<", ">"]
CompareTarget = Literal["value", "version", "create_revision", "mod_revision", "lease"]
# etcd's default --max-txn-ops; a bigger transaction is refused by the server anyway.
TXN_OPS_MAX = 128


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition: ``<target of key> <op> <operand>``."""

    key: str
    target: CompareTarget
    op: CompareOp
    operand: bytes | int
    prefix: bool = False  # every key under ``key`` must satisfy it (none: as if absent)


@dataclass(frozen=True, slots=True)
class PutOp:
    key: str
    value: bytes
    # A kept-alive Lease (checked alive before sending), or the bare id of a lease someone
    # else keeps alive (a producer session: its client refreshes it through any instance).
    lease: Lease | int | None = None


@dataclass(frozen=True, slots=True)
class DeleteOp:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class GetOp:
    key: str
    prefix: bool = False


Op = PutOp | DeleteOp | GetOp


@dataclass(frozen=True, slots=True)
class OpResponse:
    """What one op of the branch taken returned: ``kvs`` for a get, ``deleted`` for a delete."""

    kind: Literal["put", "delete", "get"]
    kvs: tuple[KeyValue, ...] = ()
    deleted: int = 0


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Which branch ran (``succeeded``: the ``then`` ops), at which revision, and its replies."""

    succeeded: bool
    revision: int
    responses: tuple[OpResponse, ...] = ()

    def first_kv(self, index: int = 0) -> KeyValue | None:
        """The first key-value the ``index``-th op returned (a get's), or ``None``."""
        kvs = self.responses[index].kvs if index < len(self.responses) else ()
        return kvs[0] if kvs else None


class _Committer(Protocol):
    async def commit(self, txn: Txn) -> TxnResult: ...


class Txn:
    """Builds one transaction; each method returns the builder so calls chain."""

    def __init__(self, committer: _Committer) -> None:
        self._committer = committer
        self.compares: list[Compare] = []
        self.success: list[Op] = []
        self.failure: list[Op] = []

    # --- compares ------------------------------------------------------------------

    def _compare(
        self,
        key: str,
        target: CompareTarget,
        op: CompareOp,
        operand: bytes | int,
        *,
        prefix: bool = False,
    ) -> Txn:
        _append(self.compares, Compare(key, target, op, operand, prefix), "compares")
        return self

    def if_value(self, key: str, op: CompareOp, value: bytes) -> Txn:
        """Compare the key's value (bytes, lexically)."""
        return self._compare(key, "value", op, value)

    def if_version(self, key: str, op: CompareOp, version: int) -> Txn:
        """Compare the key's version (writes since creation; 0 when absent)."""
        return self._compare(key, "version", op, version)

    def if_create_revision(self, key: str, op: CompareOp, revision: int) -> Txn:
        """Compare the revision that created the key (0 when absent)."""
        return self._compare(key, "create_revision", op, revision)

    def if_mod_revision(self, key: str, op: CompareOp, revision: int) -> Txn:
        """Compare the revision of the key's last write (0 when absent)."""
        return self._compare(key, "mod_revision", op, revision)

    def if_lease(self, key: str, op: CompareOp, lease_id: int) -> Txn:
        """Compare the id of the lease the key is attached to (0: none)."""
        return self._compare(key, "lease", op, lease_id)

    def if_absent(self, key: str) -> Txn:
        """The key does not exist."""
        return self.if_create_revision(key, "==", 0)

    def if_present(self, key: str) -> Txn:
        """The key exists."""
        return self.if_create_revision(key, ">", 0)

    def if_prefix_empty(self, prefix: str) -> Txn:
        """No key exists under ``prefix`` (etcd compares every key of the range, and an
        empty range as one absent key)."""
        return self._compare(prefix, "create_revision", "==", 0, prefix=True)

    # --- ops -------------------------------------------------------------------------

    def if_prefix_unchanged_since(self, prefix: str, revision: int) -> Txn:
        """No key under ``prefix`` was created or changed after ``revision`` (a count read at
        ``revision`` still holds, but for deletes)."""
        return self._compare(prefix, "mod_revision", "<", revision + 1, prefix=True)

    def then_put(self, key: str, value: bytes, *, lease: Lease | int | None = None) -> Txn:
        """Write ``key`` if the compares hold (attached to ``lease`` if given)."""
        _append(self.success, PutOp(key, check_value(key, value), lease), "then ops")
        return self

    def then_delete(self, key: str, *, prefix: bool = False) -> Txn:
        """Delete ``key`` (or every key under the prefix ``key``) if the compares hold."""
        _append(self.success, DeleteOp(key, prefix), "then ops")
        return self

    def then_get(self, key: str, *, prefix: bool = False) -> Txn:
        """Read ``key`` (or the prefix) at the transaction's revision if the compares hold."""
        _append(self.success, GetOp(key, prefix), "then ops")
        return self

    def else_put(self, key: str, value: bytes, *, lease: Lease | int | None = None) -> Txn:
        """Write ``key`` if a compare fails."""
        _append(self.failure, PutOp(key, check_value(key, value), lease), "else ops")
        return self

    def else_delete(self, key: str, *, prefix: bool = False) -> Txn:
        """Delete ``key`` (or the prefix) if a compare fails."""
        _append(self.failure, DeleteOp(key, prefix), "else ops")
        return self

    def else_get(self, key: str, *, prefix: bool = False) -> Txn:
        """Read ``key`` (or the prefix) if a compare fails: typically to see who won."""
        _append(self.failure, GetOp(key, prefix), "else ops")
        return self

    async def commit(self) -> TxnResult:
        """Send the transaction (once) and return which branch ran."""
        return await self._committer.commit(self)


def _append(ops: list[Any], item: Any, what: str) -> None:
    if len(ops) >= TXN_OPS_MAX:
        raise MetaRequestError(f"a transaction holds at most {TXN_OPS_MAX} {what}")
    ops.append(item)


# --- protobuf edge: used by MetaStore.commit -----------------------------------------

_RESULTS = {"==": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}
_TARGETS = {
    "value": ("VALUE", "value"),
    "version": ("VERSION", "version"),
    "create_revision": ("CREATE", "create_revision"),
    "mod_revision": ("MOD", "mod_revision"),
    "lease": ("LEASE", "lease"),
}


def build_request(txn: Txn, full_key: Callable[[str], bytes]) -> Any:
    """The ``TxnRequest`` protobuf for ``txn``, keys made absolute by ``full_key``."""
    rpc = aetcd.rpc
    compares = []
    for c in txn.compares:
        target, field = _TARGETS[c.target]
        key = full_key(c.key)
        pb = rpc.Compare(
            key=key,
            range_end=prefix_range_end(key) if c.prefix else b"",
            result=getattr(rpc.Compare, _RESULTS[c.op]),
            target=getattr(rpc.Compare, target),
        )
        setattr(pb, field, c.operand)
        compares.append(pb)
    return rpc.TxnRequest(
        compare=compares,
        success=[_request_op(op, full_key) for op in txn.success],
        failure=[_request_op(op, full_key) for op in txn.failure],
    )


def _request_op(op: Op, full_key: Callable[[str], bytes]) -> Any:
    rpc = aetcd.rpc
    key = full_key(op.key)
    if isinstance(op, PutOp):
        lease = op.lease
        lease_id = lease if isinstance(lease, int) else 0 if lease is None else lease.id
        return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=op.value, lease=lease_id))
    range_end = prefix_range_end(key) if op.prefix else b""
    if isinstance(op, DeleteOp):
        return rpc.RequestOp(
            request_delete_range=rpc.DeleteRangeRequest(key=key, range_end=range_end)
        )
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key, range_end=range_end))


def parse_response(pb: Any, prefix_bytes: int) -> TxnResult:
    """A :class:`TxnResult` from a ``TxnResponse`` protobuf."""
    responses: list[OpResponse] = []
    for op in pb.responses:
        which = op.WhichOneof("response")
        if which == "response_range":
            kvs = tuple(kv_from_pb(kv, prefix_bytes) for kv in op.response_range.kvs)
            responses.append(OpResponse("get", kvs=kvs))
        elif which == "response_delete_range":
            responses.append(OpResponse("delete", deleted=int(op.response_delete_range.deleted)))
        else:
            responses.append(OpResponse("put"))
    return TxnResult(bool(pb.succeeded), int(pb.header.revision), tuple(responses))


def prefix_range_end(prefix: bytes) -> bytes:
    """The end of etcd's range ``[prefix, end)`` that holds exactly the keys under ``prefix``."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"  # all 0xff: etcd reads "\0" as "to the end of the keyspace"
