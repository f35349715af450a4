"""The produce route: ``POST /v1/topics/{ns}/{topic}/messages``.

Two ways in, one answer. :func:`fast_produce` serves a well-formed JSON body straight from
the API's ASGI layer (:class:`~danube.discovery.doors.http.middleware.ApiFront`): orjson in,
hand-checked bounds (:mod:`danube.discovery.doors.http.produce_body`), orjson out, no FastAPI
routing,
dependency injection or pydantic per message. Anything it does not take as is goes to the
FastAPI route below, which answers it as the OpenAPI says (every 400 and 415 included).

A binary body (``Content-Type: application/vnd.danube.records``: records framed as the WAL
frames them, :mod:`danube.frame.produce`) is answered by :func:`fast_produce` alone, every
error included: the FastAPI route knows JSON only (sent chunked, without a
``Content-Length``, a binary body reaches it and is answered 415).
"""

from __future__ import annotations

import logging
import re

import orjson
from fastapi import APIRouter, Request
from starlette.types import Scope

from danube.admission import FramesMessages
from danube.discovery.doors.bodies.produce import ProduceRequest, ProduceResponse
from danube.discovery.doors.http.auth import principal_of_scope
from danube.discovery.doors.http.failures import danube_error_answer
from danube.discovery.doors.http.params import Namespace, ProduceTopic
from danube.discovery.doors.http.produce_body import parse_produce, produce_answer
from danube.discovery.doors.http.produce_json import JsonMessages, store_json
from danube.discovery.doors.http.state import Services, ServicesDep
from danube.discovery.errors import error_body
from danube.errors import DanubeError
from danube.meta import TopicName
from danube.names import produce_topic
from danube.security.gate import ANONYMOUS
from danube.wire.produce_binary import (
    RECORDS_TYPE,
    parse_binary_params,
    runs_answer,
    scan_body,
)

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1")

PRODUCE_TEMPLATE = "/v1/topics/{ns}/{topic}/messages"
_ACTION = f"POST {PRODUCE_TEMPLATE}"  # in the audit log
_PRODUCE_PATH = re.compile(r"/v1/topics/([^/]+)/([^/]+)/messages")
_JSON_TYPES = frozenset({b"application/json", b"application/json; charset=utf-8"})

_RECORDS_TYPE = RECORDS_TYPE.encode()

Answer = tuple[int, bytes, dict[str, str] | None]


@router.post(
    PRODUCE_TEMPLATE.removeprefix("/v1"),
    response_model=ProduceResponse,
    response_model_exclude_none=True,  # "duplicate" only on a resend's results
)
async def produce(
    ns: Namespace,
    topic: ProduceTopic,
    body: ProduceRequest,
    services: ServicesDep,
    request: Request,
) -> ProduceResponse:
    """Store a batch of messages; one ``{partition, offset}`` per message, in order. 409
    ``producer_fenced`` while an exclusive producer other than ``producer_id`` holds the
    topic. ``topic`` may name one partition (``<t>-part-N``), as an idempotent producer's
    sequenced messages must for a partitioned topic (400 ``partition_required``)."""
    name = produce_topic(ns, topic)
    # The guard authenticated (and authorized the route, before its body was read).
    principal = getattr(request.state, "principal", ANONYMOUS)
    messages = JsonMessages(body)
    admitted = await services.admission.produce(
        principal,
        name,
        messages,
        producer_id=body.producer_id,
        schema_version=body.schema_version,
        action=_ACTION,
    )
    return ProduceResponse(results=await store_json(services.producer, admitted, messages))


def is_produce(scope: Scope) -> bool:
    """Whether the request is a produce (whatever its body)."""
    return scope["method"] == "POST" and _PRODUCE_PATH.fullmatch(scope["path"]) is not None


def is_fast_produce(scope: Scope) -> bool:
    """Whether :func:`fast_produce` may take this request: a produce with a JSON or a
    binary body."""
    if scope["method"] != "POST" or _PRODUCE_PATH.fullmatch(scope["path"]) is None:
        return False
    for name, value in scope["headers"]:
        if name == b"content-type":
            value = value.lower()
            return value in _JSON_TYPES or value == _RECORDS_TYPE
    return False


def _is_binary(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.lower() == _RECORDS_TYPE)
    return False


async def fast_produce(services: Services, scope: Scope, body: bytes) -> Answer | None:
    """The answer to a produce request :func:`is_fast_produce` took, or None when the route
    must answer it (a JSON body or a name the full checks must refuse, with their message)."""
    match = _PRODUCE_PATH.fullmatch(scope["path"])
    assert match is not None
    if _is_binary(scope):
        return await _binary_produce(services, scope, match[1], match[2], body)
    request = parse_produce(body)
    if request is None:
        return None
    try:
        name = produce_topic(match[1], match[2])
    except DanubeError:
        return None  # the route's 400 names the rule
    messages = JsonMessages(request)
    try:
        admitted = await services.admission.produce(
            principal_of_scope(scope, services.security),
            name,
            messages,
            producer_id=request.producer_id,
            schema_version=request.schema_version,
            action=_ACTION,
        )
        results = await store_json(services.producer, admitted, messages)
    except Exception as exc:
        return _failed(exc, name)
    return 200, produce_answer([(r.partition, r.offset, bool(r.duplicate)) for r in results]), None


def _failed(exc: Exception, name: TopicName | None) -> Answer:
    """The answer to a produce that raised ``exc``: its error for ours (and timeouts), a
    logged 500 for anything else."""
    if isinstance(exc, DanubeError | TimeoutError):
        status, error, headers = danube_error_answer(exc)
        return status, orjson.dumps(error), headers
    log.error("produce to %s failed", name, exc_info=exc)
    return 500, orjson.dumps(error_body(Exception())), None


async def _binary_produce(
    services: Services, scope: Scope, ns: str, topic: str, body: bytes
) -> Answer:
    """A binary produce, answered here whatever happens (the route knows JSON only). The
    order of checks is the JSON path's: the name, the body, authentication, then
    admission's (danube.admission), then routing."""
    name = None
    try:
        name = produce_topic(ns, topic)
        params = parse_binary_params(scope["query_string"])
        admission = services.admission
        limits = admission.limits
        frames = scan_body(
            body, max_messages=limits.messages_max, max_payload_bytes=limits.payload_bytes_max
        )
        admitted = await admission.produce(
            principal_of_scope(scope, services.security),
            name,
            FramesMessages(frames),
            producer_id=params.producer_id,
            schema_version=params.schema_version,
            action=_ACTION,
        )
        stored = await services.producer.produce_frames(admitted, frames, dispatch=params.dispatch)
    except Exception as exc:
        return _failed(exc, name)
    answer = runs_answer(
        stored.names, stored.routed, stored.offsets, stored.duplicates, stored.partitions
    )
    return 200, answer, None


def answer_headers(body: bytes, extra: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    """The response headers of an :data:`Answer`."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    for key, value in (extra or {}).items():
        headers.append((key.lower().encode("latin-1"), value.encode("latin-1")))
    return headers
