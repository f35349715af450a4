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
