"""Typed key-values and the JSON codec of pydantic models stored as values.

aetcd hands out protobuf messages; :func:`kv_from_pb` turns one into a frozen
:class:`KeyValue` whose key is relative to the store prefix, so nothing above the store
sees the prefix or protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from danube.meta.errors import MetaDecodeError, MetaRequestError

M = TypeVar("M", bound=BaseModel)

# etcd refuses requests over 1.5 MiB (--max-request-bytes); keeping values at 1 MiB leaves
# room for the key and for several values in one transaction.
VALUE_BYTES_MAX = 1024 * 1024


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it. Revisions are etcd's global revision counter: a key's
    ``create_revision`` changes only when it is deleted and created again; ``mod_revision``
    at every write; ``version`` counts writes since creation; ``lease_id`` 0 means no lease."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int


def kv_from_pb(pb: Any, prefix_bytes: int) -> KeyValue:
    """A :class:`KeyValue` from an etcd ``mvccpb.KeyValue``, its key cut after the prefix."""
    return KeyValue(
        key=bytes(pb.key)[prefix_bytes:].decode("utf-8", errors="replace"),
        value=bytes(pb.value),
        create_revision=int(pb.create_revision),
        mod_revision=int(pb.mod_revision),
        version=int(pb.version),
        lease_id=int(pb.lease),
    )


def check_value(key: str, value: bytes) -> bytes:
    """Refuse a value over :data:`VALUE_BYTES_MAX` before it reaches etcd."""
    if len(value) > VALUE_BYTES_MAX:
        raise MetaRequestError(
            f"value for {key!r} is {len(value)} bytes, over the {VALUE_BYTES_MAX} byte limit"
        )
    return value


def encode_model(model: BaseModel) -> bytes:
    """The JSON bytes stored for ``model`` (pydantic's JSON mode, serialised by orjson)."""
    return orjson.dumps(model.model_dump(mode="json"))


def decode_model(kv: KeyValue, model: type[M]) -> M:
    """Decode and validate ``kv.value`` as ``model``; :class:`MetaDecodeError` if it is bad."""
    try:
        return model.model_validate_json(kv.value)
    except ValidationError as exc:
        raise MetaDecodeError(key=kv.key, reason=_first_error(exc)) from exc


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "value"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"
