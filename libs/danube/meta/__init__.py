"""The metadata layer: etcd under one prefix, typed, with deadlines and one error hierarchy.

- :class:`MetaStore`: get/put/range/delete, JSON models, CAS transactions, leases, watches;
- :class:`Lease`: keep-alive in an owned task, a ``lost`` event when it can no longer be
  relied on;
- :class:`Election`: leader election on ``elections/<name>``; :func:`run_as_leader`, the
  campaign-lead-resign loop of a singleton role;
- :mod:`danube.meta.keys` and :mod:`danube.meta.records`: the key layout and the values.

:class:`TopicName` and :class:`InvalidNameError` are those of :mod:`danube.names` (the naming
rules of the whole mesh), re-exported for convenience.

docs/metadata.md describes the layout and the transaction patterns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from danube.lazy import LazyNames

if TYPE_CHECKING:
    from danube.meta.election import Election, Leadership, run_as_leader
    from danube.meta.errors import (
        DeposedError,
        LeaseLostError,
        MetaAuthError,
        MetaDecodeError,
        MetaError,
        MetaRequestError,
        MetaTimeoutError,
        MetaUnavailableError,
        UpdateRacedError,
        WatchCompactedError,
        WatchError,
        WatchOverflowError,
    )
    from danube.meta.keys import SERVICE_KINDS, ServiceKind
    from danube.meta.kv import VALUE_BYTES_MAX, KeyValue, decode_model, encode_model
    from danube.meta.lease import Lease, LeaseBackend
    from danube.meta.store import MetaStore, RangeResult
    from danube.meta.txn import Compare, OpResponse, Txn, TxnResult
    from danube.meta.watch import Watch, WatchEvent
    from danube.names import InvalidNameError, TopicName

# Each public name and the module that defines it, imported on first use: importing one
# module of the package (danube.meta.records, the values the HTTP API's answers hold, which
# the SDK reads) loads that module, not the etcd client behind MetaStore.
_HOMES = {
    "Election": "danube.meta.election",
    "Leadership": "danube.meta.election",
    "run_as_leader": "danube.meta.election",
    "DeposedError": "danube.meta.errors",
    "LeaseLostError": "danube.meta.errors",
    "MetaAuthError": "danube.meta.errors",
    "MetaDecodeError": "danube.meta.errors",
    "MetaError": "danube.meta.errors",
    "MetaRequestError": "danube.meta.errors",
    "MetaTimeoutError": "danube.meta.errors",
    "MetaUnavailableError": "danube.meta.errors",
    "UpdateRacedError": "danube.meta.errors",
    "WatchCompactedError": "danube.meta.errors",
    "WatchError": "danube.meta.errors",
    "WatchOverflowError": "danube.meta.errors",
    "SERVICE_KINDS": "danube.meta.keys",
    "ServiceKind": "danube.meta.keys",
    "VALUE_BYTES_MAX": "danube.meta.kv",
    "KeyValue": "danube.meta.kv",
    "decode_model": "danube.meta.kv",
    "encode_model": "danube.meta.kv",
    "Lease": "danube.meta.lease",
    "LeaseBackend": "danube.meta.lease",
    "MetaStore": "danube.meta.store",
    "RangeResult": "danube.meta.store",
    "Compare": "danube.meta.txn",
    "OpResponse": "danube.meta.txn",
    "Txn": "danube.meta.txn",
    "TxnResult": "danube.meta.txn",
    "Watch": "danube.meta.watch",
    "WatchEvent": "danube.meta.watch",
    "InvalidNameError": "danube.names",
    "TopicName": "danube.names",
}


_LAZY = LazyNames(__name__, globals(), _HOMES)


def __getattr__(name: str) -> Any:
    return _LAZY.load(name)


def __dir__() -> list[str]:
    return _LAZY.names()


__all__ = [
    "SERVICE_KINDS",
    "VALUE_BYTES_MAX",
    "Compare",
    "DeposedError",
    "Election",
    "InvalidNameError",
    "KeyValue",
    "Leadership",
    "Lease",
    "LeaseBackend",
    "LeaseLostError",
    "MetaAuthError",
    "MetaDecodeError",
    "MetaError",
    "MetaRequestError",
    "MetaStore",
    "MetaTimeoutError",
    "MetaUnavailableError",
    "OpResponse",
    "RangeResult",
    "ServiceKind",
    "TopicName",
    "Txn",
    "TxnResult",
    "UpdateRacedError",
    "Watch",
    "WatchCompactedError",
    "WatchError",
    "WatchEvent",
    "WatchOverflowError",
    "decode_model",
    "encode_model",
    "run_as_leader",
]
