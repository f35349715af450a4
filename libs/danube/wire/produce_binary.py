"""The binary produce body (``application/vnd.danube.records``, docs/http-api.md): its query
parameters, its frames checked once (:mod:`danube.frame.produce`) with their errors mapped to
the HTTP answers, and the compact answer. Pure functions, no I/O: every door that takes a
binary produce (discovery's, an ingest leader's) reads and answers it with these.

What the JSON body carries around its messages travels as query parameters:
``producer_id``, ``dispatch`` and ``schema_version``; the producer name is in every record.
The answer lists runs, not messages: consecutive messages stored in one partition at
consecutive offsets are one ``{"partition", "offset", "count"}``, in message order; a run
an idempotent producer sent again (stored before) adds ``"duplicate": true``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated
from urllib.parse import parse_qsl

import orjson
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from danube.errors import BadRequestError, TooLargeError
from danube.frame import FrameError
from danube.frame.errors import DecompressedTooLargeError
from danube.frame.produce import ProducedFrames, scan_frames_for_produce
from danube.meta import TopicName
from danube.meta.records import Dispatch
from danube.names import MAX_NAME_CHARS

RECORDS_TYPE = "application/vnd.danube.records"
"""The ``Content-Type`` of a binary produce body."""

_PARAMS = frozenset({"producer_id", "dispatch", "schema_version"})
_SCHEMA_VERSION_MAX = 2**31
_QUERY_BYTES_MAX = 1024
ProducerId = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=r"^[A-Za-z0-9_-]+$")
]
"""A producer session's id as a request carries it (a key segment: danube.names), checked
again when it is used in a key."""
_PRODUCER_ID = TypeAdapter(ProducerId, config=ConfigDict(strict=True))


@dataclass(frozen=True, slots=True)
class BinaryParams:
    """The query parameters of a binary produce."""

    producer_id: str | None = None
    dispatch: Dispatch = "reliable"
    schema_version: int | None = None


# A producer sends the same query string with every request: its parameters are read once
# (what is refused is not kept; at most this many strings of _QUERY_BYTES_MAX each are).
@lru_cache(maxsize=1024)
def parse_binary_params(query: bytes) -> BinaryParams:
    """The parameters of ``query`` (the raw query string); 400 for an unknown or bad one."""
    if not query:
        return BinaryParams()
    if len(query) > _QUERY_BYTES_MAX:
        raise BadRequestError(f"query string over {_QUERY_BYTES_MAX} bytes")
    try:
        pairs = parse_qsl(query.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequestError(f"bad query string: {exc}", code="invalid_request") from exc
    seen: dict[str, str] = {}
    for name, value in pairs:
        if name not in _PARAMS:
            raise BadRequestError(f"{name}: unknown query parameter", code="unknown_field")
        if name in seen:
            raise BadRequestError(f"{name}: given twice", code="invalid_request")
        seen[name] = value
    raw_dispatch = seen.get("dispatch", "reliable")
    dispatch: Dispatch = "reliable" if raw_dispatch == "reliable" else "non_reliable"
    if raw_dispatch != dispatch:
        raise BadRequestError("dispatch: must be reliable or non_reliable", code="invalid_request")
    producer_id = seen.get("producer_id")
    if producer_id is not None:
        try:
            producer_id = _PRODUCER_ID.validate_python(producer_id)
        except ValidationError as exc:
            raise BadRequestError(
                "producer_id: not a producer session id", code="invalid_request"
            ) from exc
    version = None
    if "schema_version" in seen:
        raw = seen["schema_version"]
        if not raw.isdigit() or not 1 <= int(raw) <= _SCHEMA_VERSION_MAX:
            raise BadRequestError(
                f"schema_version: an integer in 1..{_SCHEMA_VERSION_MAX}", code="invalid_request"
            )
        version = int(raw)
    return BinaryParams(producer_id, dispatch, version)


def scan_body(body: bytes, *, max_messages: int, max_payload_bytes: int) -> ProducedFrames:
    """The checked frames of a binary body (at most ``max_messages + 1``: the producer
    refuses more, 413 ``too_many_messages``); 400 with the frame error's code
    (``truncated_frames``, ``corrupt_frame``, ``corrupt_record``). A compressed payload
    stating more than ``max_payload_bytes`` decompressed is corrupt before it is inflated;
    the sizes are the messages' (the producer holds them to the topic's limit)."""
    try:
        return scan_frames_for_produce(
            body, max_count=max_messages, payload_bytes_max=max_payload_bytes
        )
    except DecompressedTooLargeError as exc:
        raise TooLargeError(str(exc), code=exc.code, limit=exc.limit_bytes) from exc
    except FrameError as exc:
        raise BadRequestError(str(exc), code=exc.code) from exc


def runs_answer(
    names: Sequence[TopicName],
    routed: Sequence[int],
    offsets: Sequence[int],
    duplicates: Sequence[bool] | None = None,
    partitions: int | None = None,
) -> bytes:
    """``{"runs": [{"partition", "offset", "count"}, ...], "partitions": N}``: the messages'
    places in order, consecutive offsets of one partition as one run. A run of an idempotent
    producer's resend (stored before: ``duplicates``) says ``"duplicate": true`` and never
    takes in a message that is new, nor a new run a resent one. ``partitions``: the topic's
    partition count, so that a producer that routes itself sees it grow."""
    flags = duplicates if duplicates is not None else [False] * len(offsets)
    runs: list[list[int]] = []  # [partition index, first offset, count, duplicate]
    last: list[int] | None = None
    for partition, offset, duplicate in zip(routed, offsets, flags, strict=True):
        if (
            last is not None
            and last[0] == partition
            and last[1] + last[2] == offset
            and last[3] == duplicate
        ):
            last[2] += 1
        else:
            last = [partition, offset, 1, int(duplicate)]
            runs.append(last)
    answer: dict[str, object] = {
        "runs": [
            {"partition": str(names[p]), "offset": first, "count": count, "duplicate": True}
            if duplicate
            else {"partition": str(names[p]), "offset": first, "count": count}
            for p, first, count, duplicate in runs
        ]
    }
    if partitions is not None:
        answer["partitions"] = partitions
    return orjson.dumps(answer)
