"""The produce body read without pydantic on the hot path: orjson and hand-checked bounds.

:func:`parse_produce` accepts only bodies that
:class:`~danube.discovery.doors.bodies.produce.ProduceRequest`
accepts too, with the same values, and answers None for anything else — a body that does not
parse, a field it does not know, a bound it does not hold, a type it would not take as is
(``strict``). The caller then hands the request to the FastAPI route, whose pydantic model
answers it as it always did: every 400 keeps its code and field path, because this module
never produces one.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ConfigDict, TypeAdapter, ValidationError

from danube.discovery.doors.bodies.produce import (
    PRODUCE_MESSAGES_CAP,
    PRODUCER_EPOCH_MAX,
    SEQUENCE_MAX,
    MessageIn,
    ProduceRequest,
)
from danube.frame import (
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    MAX_PRODUCER_NAME_BYTES,
)
from danube.wire.delivery import TTL_MS_MAX
from danube.wire.produce_binary import ProducerId

_REQUEST_FIELDS = frozenset(ProduceRequest.model_fields)
_MESSAGE_FIELDS = frozenset(MessageIn.model_fields)
_DISPATCHES = frozenset({"reliable", "non_reliable"})
_SCHEMA_VERSION_MAX = 2**31
# A producer session id has a pattern: checked by pydantic, for the one string.
_PRODUCER_ID = TypeAdapter(ProducerId, config=ConfigDict(strict=True))


def parse_produce(body: bytes) -> ProduceRequest | None:
    """The request ``body`` holds, or None when only the full model can answer it."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(data) is not dict or not _REQUEST_FIELDS.issuperset(data):
        return None
    raw_messages = data.get("messages")
    if type(raw_messages) is not list or not 1 <= len(raw_messages) <= PRODUCE_MESSAGES_CAP:
        return None
    messages = []
    for raw in raw_messages:
        message = _message(raw)
        if message is None:
            return None
        messages.append(message)
    producer = data.get("producer", "http")
    if type(producer) is not str or len(producer) > MAX_PRODUCER_NAME_BYTES:
        return None
    dispatch = data.get("dispatch", "reliable")
    if type(dispatch) is not str or dispatch not in _DISPATCHES:
        return None
    producer_id = data.get("producer_id")
    if producer_id is not None:
        try:
            producer_id = _PRODUCER_ID.validate_python(producer_id)
        except ValidationError:
            return None
    version = data.get("schema_version")
    if version is not None and (
        type(version) is not int or not 1 <= version <= _SCHEMA_VERSION_MAX
    ):
        return None
    epoch = data.get("producer_epoch", 0)
    if type(epoch) is not int or not 0 <= epoch <= PRODUCER_EPOCH_MAX:
        return None
    fields: dict[str, Any] = {
        "messages": messages,
        "producer": producer,
        "dispatch": dispatch,
        "producer_id": producer_id,
        "schema_version": version,
        "producer_epoch": epoch,
    }
    # model_construct keeps which fields were set, as model_validate does.
    return ProduceRequest.model_construct({k for k in data if k in fields}, **fields)


def _message(raw: Any) -> MessageIn | None:
    if type(raw) is not dict or not _MESSAGE_FIELDS.issuperset(raw):
        return None
    payload = raw.get("payload")
    if type(payload) is not str:
        return None
    encoding = raw.get("encoding", "utf8")
    if encoding != "utf8" and encoding != "base64":
        return None
    key = raw.get("key")
    if key is not None and (type(key) is not str or len(key) > MAX_KEY_BYTES):
        return None
    attributes = raw.get("attributes")
    if attributes is None:
        if "attributes" in raw:
            return None  # null is not a map
        attributes = {}
    elif not _attributes_ok(attributes):
        return None
    sequence = raw.get("sequence")
    if sequence is not None and (type(sequence) is not int or not 0 <= sequence <= SEQUENCE_MAX):
        return None
    ttl_ms = raw.get("ttl_ms")
    if ttl_ms is not None and (type(ttl_ms) is not int or not 1 <= ttl_ms <= TTL_MS_MAX):
        return None
    if "deliver_at_ms" in raw or "deliver_after_ms" in raw:
        return None  # rare: the model checks a delivery time (and names what is wrong)
    return MessageIn.model_construct(
        set(raw),
        payload=payload,
        encoding=encoding,
        key=key,
        attributes=attributes,
        sequence=sequence,
        ttl_ms=ttl_ms,
    )


def _attributes_ok(attributes: Any) -> bool:
    if type(attributes) is not dict or len(attributes) > MAX_ATTRIBUTES:
        return False
    for name, value in attributes.items():
        if len(name) > MAX_ATTRIBUTE_NAME_BYTES:
            return False
        if type(value) is not str or len(value) > MAX_ATTRIBUTE_VALUE_BYTES:
            return False
    return True


def produce_answer(results: list[tuple[str, int, bool]]) -> bytes:
    """The ``ProduceResponse`` JSON of ``(partition, offset, duplicate)`` results, in order
    (``"duplicate": true`` only on a resend's)."""
    return orjson.dumps(
        {
            "results": [
                {"partition": p, "offset": o, "duplicate": True}
                if d
                else {"partition": p, "offset": o}
                for p, o, d in results
            ]
        }
    )
