"""Admission (danube.admission) as every door calls it: one table of cases, run
with each door's way of handing messages in (a JSON body, a binary body's frames, gRPC's
payloads), answers the same error code; the checks' order; no web framework imported,
nor anything of discovery."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from danube.admission import (
    Admission,
    FramesMessages,
    Messages,
    PayloadMessages,
    ProduceLimits,
    Stamp,
)
from danube.admission.exclusive import ExclusiveView
from danube.discovery.doors.bodies.produce import ProduceRequest
from danube.discovery.doors.http.produce_json import JsonMessages
from danube.discovery.errors import BadRequestError
from danube.errors import DanubeError
from danube.frame.produce import encode_produce_frame, scan_frames_for_produce
from danube.meta import TopicName
from danube.meta.records import Policies, TopicConfig
from danube.security import Permission, PermissionDeniedError, Resource
from danube.wire.chunks import TOTAL_BYTES_ATTRIBUTE

pytestmark = pytest.mark.unit

PLAIN = TopicName("default", "plain")
SMALL = TopicName("default", "small")  # max_message_bytes 100, max_chunked 1000
TYPED = TopicName("default", "typed")  # a schema: payload b"bad" breaks it
HELD = TopicName("default", "held")  # exclusive producer "aa"
LIMITS = ProduceLimits(messages_max=10, payload_bytes_max=1024)
ALLOWED = "alice"


class Rbac:
    """Alice may produce and consume anywhere; nobody else anything."""

    enabled = True

    def __init__(self) -> None:
        self.asked: list[tuple[str, Permission, str, str]] = []

    def authorize(
        self, principal: str, permission: Permission, resource: Resource, *, action: str
    ) -> None:
        self.asked.append((principal, permission, str(resource), action))
        if principal != ALLOWED:
            raise PermissionDeniedError("no", permission=permission.value, resource=str(resource))


class Policy:
    async def effective_policies(self, topic: TopicName) -> tuple[TopicConfig | None, Policies]:
        if topic.parent == SMALL:
            return None, Policies(max_message_bytes=100, max_chunked_message_bytes=1000)
        return None, Policies()


@dataclass
class Schemas:
    asked: list[int | None] = field(default_factory=list)

    async def admit(
        self,
        topic: TopicName,
        payloads: Sequence[bytes],
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> Stamp | None:
        self.asked.append(version)
        if topic.parent != TYPED:
            return None
        if any(payload == b"bad" for payload in payloads):
            raise BadRequestError("messages[0] does not match", code="schema_violation")
        return Stamp(7, version or 1)


def _admission() -> tuple[Admission, Rbac]:
    fence = ExclusiveView()
    fence.claimed(HELD, "aa", revision=1)
    rbac = Rbac()
    admission = Admission(LIMITS, security=rbac, policies=Policy(), fence=fence, schemas=Schemas())
    return admission, rbac


Message = tuple[bytes, dict[str, str]]


def _json(messages: list[Message]) -> Messages:
    body = {"messages": [{"payload": p.decode(), "attributes": a} for p, a in messages]}
    return JsonMessages(ProduceRequest.model_validate(body))


def _binary(messages: list[Message]) -> Messages:
    body = b"".join(
        encode_produce_frame(
            p,
            producer=b"p",
            publish_time_ms=0,
            attributes=[(k.encode(), v.encode()) for k, v in a.items()],
        )
        for p, a in messages
    )
    return FramesMessages(scan_frames_for_produce(body, max_count=LIMITS.messages_max))


def _grpc(messages: list[Message]) -> Messages:
    return PayloadMessages([p for p, _ in messages], [a for _, a in messages])


DOORS = {"json": _json, "binary": _binary, "grpc": _grpc}
ONE: list[Message] = [(b'{"n": 1}', {})]


@dataclass(frozen=True)
class Case:
    principal: str
    topic: TopicName
    messages: list[Message]
    producer_id: str | None
    code: str | None  # None: admitted


CASES = {
    "allowed": Case(ALLOWED, PLAIN, ONE, None, None),
    "allowed with a schema": Case(ALLOWED, TYPED, ONE, None, None),
    "the exclusive holder": Case(ALLOWED, HELD, ONE, "aa", None),
    "denied": Case("mallory", PLAIN, ONE, None, "permission_denied"),
    "denied before fenced": Case("mallory", HELD, ONE, None, "permission_denied"),
    "fenced": Case(ALLOWED, HELD, ONE, None, "producer_fenced"),
    "fenced, a partition": Case(ALLOWED, HELD.partition_name(1), ONE, "bb", "producer_fenced"),
    "too many messages": Case(ALLOWED, PLAIN, ONE * 11, None, "too_many_messages"),
    "over the instance's payload limit": Case(
        ALLOWED, PLAIN, [(b"x" * 1025, {})], None, "payload_too_large"
    ),
    "over the topic's payload limit": Case(
        ALLOWED, SMALL, [(b"x" * 101, {})], None, "payload_too_large"
    ),
    "a chunk of a message too large": Case(
        ALLOWED, SMALL, [(b"x", {TOTAL_BYTES_ATTRIBUTE: "1001"})], None, "chunked_message_too_large"
    ),
    "bad schema": Case(ALLOWED, TYPED, [(b"bad", {})], None, "schema_violation"),
    "fenced before bad schema": Case(ALLOWED, HELD, [(b"bad", {})], None, "producer_fenced"),
}


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("name", CASES)
async def test_every_door_gets_the_same_answer(door: str, name: str) -> None:
    case = CASES[name]
    admission, rbac = _admission()
    messages = DOORS[door](case.messages)
    if case.code is not None:
        with pytest.raises(DanubeError) as caught:
            await admission.produce(
                case.principal, case.topic, messages, producer_id=case.producer_id, action=door
            )
        assert caught.value.code == case.code
        return
    admitted = await admission.produce(
        case.principal, case.topic, messages, producer_id=case.producer_id, action=door
    )
    assert admitted.topic == case.topic
    assert admitted.stamp == (Stamp(7, 1) if case.topic == TYPED else None)
    assert rbac.asked == [
        (case.principal, Permission.Produce, str(Resource.topic(case.topic)), door)
    ]


async def test_the_schema_version_named_and_the_policies_go_with_the_admitted_batch() -> None:
    admission, _ = _admission()
    admitted = await admission.produce(ALLOWED, TYPED, _grpc(ONE), schema_version=3)
    assert admitted.stamp == Stamp(7, 3)
    small = await admission.produce(ALLOWED, SMALL, _binary(ONE))
    assert small.policies.max_message_bytes == 100
    assert admission.payload_bytes_max(small.policies) == 100
    assert admission.payload_bytes_max(Policies(max_message_bytes=10_000)) == 1024


async def test_an_idempotent_producers_run_is_checked_and_carried() -> None:
    admission, _ = _admission()
    body = {
        "producer": "p",
        "messages": [{"payload": "a", "sequence": 5}, {"payload": "b", "sequence": 6}],
    }
    admitted = await admission.produce(
        ALLOWED, PLAIN, JsonMessages(ProduceRequest.model_validate(body))
    )
    assert admitted.sequencing is not None
    assert (admitted.sequencing.first, admitted.sequencing.count) == (5, 2)
    body["messages"][1]["sequence"] = 8  # type: ignore[index]
    with pytest.raises(BadRequestError) as caught:
        await admission.produce(ALLOWED, PLAIN, JsonMessages(ProduceRequest.model_validate(body)))
    assert caught.value.code == "invalid_sequence"


def test_consume_is_decided_by_rbac() -> None:
    admission, rbac = _admission()
    admission.consume(ALLOWED, PLAIN, action="grpc Subscribe")
    with pytest.raises(PermissionDeniedError):
        admission.consume("mallory", PLAIN, action="grpc Subscribe")
    assert [asked[1] for asked in rbac.asked] == [Permission.Consume, Permission.Consume]


def test_admission_imports_no_web_framework_nor_http_body() -> None:
    source = Path(sys.modules[Admission.__module__].__file__ or "").read_text()
    imported = {
        node.module or ""
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
    } | {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    forbidden = (
        "fastapi",
        "starlette",
        "grpc",
        "danube.discovery.doors.http",
        "danube.discovery.doors.grpc",
        "danube.discovery.doors.bodies",
    )
    assert not [m for m in imported if m.startswith(forbidden)]
    # Nor does anything the package imports, its builder included: nothing of discovery
    # at all (an ingest node builds one; grpc comes with danube.config: not checked here).
    probe = (
        "import sys, danube.admission as a; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette') "
        "or m == 'danube.discovery' or m.startswith('danube.discovery.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
