"""The gRPC API's bad-input table (docs/grpc-api.md, "Bad input"): malformed and invalid
requests to every method of Danube's gRPC API, sent as raw bytes on a real channel to one
real discovery (with ingest, a dispatcher, nats-server and etcd), each answered with its
documented status and the HTTP API's error code, in the details and the trailing metadata;
none INTERNAL or UNKNOWN, no Python class name shown, nothing created."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from danube.frame import MAX_ATTRIBUTES, MAX_KEY_BYTES, MAX_PRODUCER_NAME_BYTES
from danube.grpc_door.api import DanubeApi
from danube.meta.records import SCHEMA_TAGS_MAX
from danube.names import PARTITIONS_MAX
from danube.wire import DanubeApi_pb2 as pb
from danube.wire import SchemaRegistry_pb2 as sr
from danube.wire.opens import FILTER_CHARS_MAX, FILTERS_MAX
from tests.integration.conftest import MeshSettings
from tests.integration.test_grpc_api import grpc_mesh

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

S = grpc.StatusCode
BAD, NOT_FOUND, OK = S.INVALID_ARGUMENT, S.NOT_FOUND, S.OK
ERROR_CODE_KEY = "danube-error-code"
TOPIC = "/default/table"
SUBJECT = "table-value"
JSON_SCHEMA = b'{"type": "object"}'
SUBJECT_ID = 1  # SUBJECT is the first subject of the test's etcd prefix
BOUND = "/default/bound"  # a topic bound to SUBJECT, enforced
BODY_BYTES_MAX = 1024 * 1024  # discovery.max_body_bytes: gRPC's receive limit too
BOOM_ID = 0xB00
RECEIVE = "/danube.ConsumerService/ReceiveMessages"

# Every method, its request type, and a valid request to spoil one field of.
METHODS: dict[str, tuple[Any, Callable[[], Any]]] = {
    "/danube.Discovery/TopicLookup": (
        pb.TopicLookupRequest,
        lambda: pb.TopicLookupRequest(topic=TOPIC),
    ),
    "/danube.Discovery/TopicPartitions": (
        pb.TopicLookupRequest,
        lambda: pb.TopicLookupRequest(topic=TOPIC),
    ),
    "/danube.ProducerService/CreateProducer": (
        pb.ProducerRequest,
        lambda: pb.ProducerRequest(
            producer_name="p",
            topic_name=TOPIC,
            producer_access_mode=pb.Shared,
            dispatch_strategy=pb.Reliable,
        ),
    ),
    "/danube.ProducerService/SendMessage": (
        pb.StreamMessage,
        lambda: pb.StreamMessage(
            msg_id=pb.MsgID(producer_id=1, topic_name=TOPIC), payload=b"x", producer_name="p"
        ),
    ),
    "/danube.ConsumerService/Subscribe": (
        pb.ConsumerRequest,
        lambda: pb.ConsumerRequest(
            topic_name=TOPIC,
            consumer_name="c",
            subscription="s",
            subscription_type=pb.ConsumerRequest.Shared,
        ),
    ),
    RECEIVE: (pb.ReceiveRequest, lambda: pb.ReceiveRequest(consumer_id=1)),
    "/danube.ConsumerService/Ack": (
        pb.AckRequest,
        lambda: pb.AckRequest(msg_id=pb.MsgID(topic_name=TOPIC), subscription_name="s"),
    ),
    "/danube.ConsumerService/Nack": (
        pb.NackRequest,
        lambda: pb.NackRequest(msg_id=pb.MsgID(topic_name=TOPIC), subscription_name="s"),
    ),
    "/danube.HealthCheck/HealthCheck": (pb.HealthCheckRequest, lambda: pb.HealthCheckRequest()),
    "/danube_schema.SchemaRegistry/RegisterSchema": (
        sr.RegisterSchemaRequest,
        lambda: sr.RegisterSchemaRequest(
            subject="other-value", schema_type="json_schema", schema_definition=JSON_SCHEMA
        ),
    ),
    "/danube_schema.SchemaRegistry/GetSchema": (sr.GetSchemaRequest, lambda: sr.GetSchemaRequest()),
    "/danube_schema.SchemaRegistry/GetLatestSchema": (
        sr.GetLatestSchemaRequest,
        lambda: sr.GetLatestSchemaRequest(subject=SUBJECT),
    ),
    "/danube_schema.SchemaRegistry/ListVersions": (
        sr.ListVersionsRequest,
        lambda: sr.ListVersionsRequest(subject=SUBJECT),
    ),
    "/danube_schema.SchemaRegistry/CheckCompatibility": (
        sr.CheckCompatibilityRequest,
        lambda: sr.CheckCompatibilityRequest(
            subject=SUBJECT, schema_type="json_schema", new_schema_definition=JSON_SCHEMA
        ),
    ),
    "/danube_schema.SchemaRegistry/DeleteSchemaVersion": (
        sr.DeleteSchemaVersionRequest,
        lambda: sr.DeleteSchemaVersionRequest(subject=SUBJECT, version=1),
    ),
    "/danube_schema.SchemaRegistry/SetCompatibilityMode": (
        sr.SetCompatibilityModeRequest,
        lambda: sr.SetCompatibilityModeRequest(subject=SUBJECT, compatibility_mode="backward"),
    ),
    "/danube_schema.SchemaRegistry/ConfigureTopicSchema": (
        sr.ConfigureTopicSchemaRequest,
        lambda: sr.ConfigureTopicSchemaRequest(
            topic_name=TOPIC, schema_subject=SUBJECT, validation_policy="enforce"
        ),
    ),
    "/danube_schema.SchemaRegistry/UpdateTopicValidationPolicy": (
        sr.UpdateTopicValidationPolicyRequest,
        lambda: sr.UpdateTopicValidationPolicyRequest(topic_name=TOPIC, validation_policy="warn"),
    ),
    "/danube_schema.SchemaRegistry/GetTopicSchemaConfig": (
        sr.GetTopicSchemaConfigRequest,
        lambda: sr.GetTopicSchemaConfigRequest(topic_name=TOPIC),
    ),
}


@dataclass(frozen=True)
class Case:
    method: str
    case: str
    body: bytes
    status: grpc.StatusCode
    code: str  # the error code ("" when the call succeeds)


def _short(method: str) -> str:
    return method.rpartition("/")[2]


def _spoiled(method: str, **fields: Any) -> bytes:
    """The method's valid request with ``fields`` set (``msg_id__topic_name``: a field of
    msg_id)."""
    request = METHODS[method][1]()
    for name, value in fields.items():
        target = request
        *path, last = name.split("__")
        for part in path:
            target = getattr(target, part)
        if isinstance(value, list):
            getattr(target, last).extend(value)
        elif isinstance(value, dict):
            getattr(target, last).update(value)
        else:
            setattr(target, last, value)
    return bytes(request.SerializeToString())


def _field(tag: int, wire_type: int, payload: bytes) -> bytes:
    """One protobuf field, written by hand (tags and lengths below 128: one byte each)."""
    assert tag < 16
    assert len(payload) < 128
    head = bytes([tag << 3 | wire_type])
    return head + (bytes([len(payload)]) + payload if wire_type == 2 else payload)


NOT_UTF8 = b"\xc3\x28"  # a two-byte sequence cut short


def _first_string_field(request_type: Any) -> int | None:
    for field in request_type.DESCRIPTOR.fields:
        if field.type == field.TYPE_STRING and not field.is_repeated:
            return int(field.number)
    return None


def malformed_cases() -> list[Case]:
    """Bytes that are no message of the method's type, for every method."""
    cases = []
    for method, (request_type, _) in METHODS.items():
        bodies = {
            "garbage": b"\xff" * 16,  # a varint longer than ten bytes
            "truncated varint": b"\x08\x80",  # field 1, a varint cut after a continuation byte
            "truncated length": b"\x12\x05ab",  # field 2 says 5 bytes, 2 follow
            "invalid wire type": b"\x0f",  # wire type 7 does not exist
        }
        string_field = _first_string_field(request_type)
        if string_field is not None:
            bodies["bad UTF-8"] = _field(string_field, 2, NOT_UTF8)
        if "msg_id" in request_type.DESCRIPTOR.fields_by_name:  # topic_name (2) of MsgID
            number = request_type.DESCRIPTOR.fields_by_name["msg_id"].number
            bodies["bad UTF-8 in msg_id"] = _field(number, 2, _field(2, 2, NOT_UTF8))
        if request_type is pb.StreamMessage:  # attributes (7): map entry key (1) not UTF-8
            bodies["bad UTF-8 attribute"] = _field(7, 2, _field(1, 2, NOT_UTF8))
        cases += [Case(method, name, body, BAD, "invalid_request") for name, body in bodies.items()]
    return cases


BAD_TOPICS = {
    "empty topic": "",
    "no slashes": "no-slashes",
    "bad namespace": "/bad.ns/t",
    "three segments": "/default/t/extra",
    "over-long topic": "/default/" + "t" * 300,
    "bad characters": "/default/t*",
    "partition out of range": "/default/x-part-1000000000",
    "partition at the limit": f"/default/x-part-{PARTITIONS_MAX}",
    "negative partition": "/default/x-part--1",
}
TOPIC_FIELDS = {
    "/danube.Discovery/TopicLookup": "topic",
    "/danube.Discovery/TopicPartitions": "topic",
    "/danube.ProducerService/CreateProducer": "topic_name",
    "/danube.ProducerService/SendMessage": "msg_id__topic_name",
    "/danube.ConsumerService/Subscribe": "topic_name",
    "/danube.ConsumerService/Ack": "msg_id__topic_name",
    "/danube.ConsumerService/Nack": "msg_id__topic_name",
    "/danube_schema.SchemaRegistry/ConfigureTopicSchema": "topic_name",
    "/danube_schema.SchemaRegistry/UpdateTopicValidationPolicy": "topic_name",
    "/danube_schema.SchemaRegistry/GetTopicSchemaConfig": "topic_name",
}


def topic_cases() -> list[Case]:
    """Every bad topic name to every method that takes one."""
    return [
        Case(method, name, _spoiled(method, **{field: topic}), BAD, "invalid_name")
        for method, field in TOPIC_FIELDS.items()
        for name, topic in BAD_TOPICS.items()
    ]


P, C = "/danube.ProducerService/", "/danube.ConsumerService/"
R = "/danube_schema.SchemaRegistry/"
EXCLUSIVE, KEY_SHARED = pb.ConsumerRequest.Exclusive, pb.ConsumerRequest.KeyShared


def field_cases() -> list[Case]:
    """Each method's other fields: names, enums, limits, schema definitions."""
    rows: list[tuple[str, str, dict[str, Any], grpc.StatusCode, str]] = [
        (
            P + "CreateProducer",
            "empty producer name",
            {"producer_name": ""},
            BAD,
            "invalid_request",
        ),
        (
            P + "CreateProducer",
            "over-long producer name",
            {"producer_name": "p" * 257},
            BAD,
            "invalid_request",
        ),
        (
            P + "CreateProducer",
            "unknown access mode",
            {"producer_access_mode": 7},
            BAD,
            "invalid_request",
        ),
        (
            P + "CreateProducer",
            "unknown dispatch strategy",
            {"dispatch_strategy": 9},
            BAD,
            "invalid_request",
        ),
        (
            P + "CreateProducer",
            "unknown namespace",
            {"topic_name": "/ghost/t"},
            NOT_FOUND,
            "namespace_not_found",
        ),
        (
            P + "SendMessage",
            "over-long routing key",
            {"routing_key": "k" * (MAX_KEY_BYTES + 1)},
            BAD,
            "invalid_record",
        ),
        (
            P + "SendMessage",
            "over-long producer name",
            {"producer_name": "é" * (MAX_PRODUCER_NAME_BYTES // 2 + 1)},
            BAD,
            "invalid_record",
        ),
        (
            P + "SendMessage",
            "too many attributes",
            {"attributes": {f"a{i}": "v" for i in range(MAX_ATTRIBUTES + 1)}},
            BAD,
            "invalid_record",
        ),
        (
            P + "SendMessage",
            "another schema's id",
            {"msg_id__topic_name": BOUND, "schema_id": 2**40},
            BAD,
            "schema_mismatch",
        ),
        (
            P + "SendMessage",
            "schema version 0",
            {"msg_id__topic_name": BOUND, "schema_version": 0},
            BAD,
            "invalid_version",
        ),
        (
            P + "SendMessage",
            "unknown schema version",
            {"msg_id__topic_name": BOUND, "schema_version": 2**32 - 1},
            BAD,  # as over HTTP: the produce is wrong, not a lookup
            "schema_not_found",
        ),
        (
            P + "SendMessage",
            "payload breaking the schema",
            {"msg_id__topic_name": BOUND, "payload": b"[1, 2]"},
            BAD,
            "schema_violation",
        ),
        (
            P + "SendMessage",
            "payload not JSON",
            {"msg_id__topic_name": BOUND, "payload": b"\xc3\x28"},
            BAD,
            "schema_violation",
        ),
        (C + "Subscribe", "empty consumer name", {"consumer_name": ""}, BAD, "invalid_request"),
        (
            C + "Subscribe",
            "over-long consumer name",
            {"consumer_name": "c" * 129},
            BAD,
            "invalid_request",
        ),
        (C + "Subscribe", "empty subscription", {"subscription": ""}, BAD, "invalid_name"),
        (
            C + "Subscribe",
            "over-long subscription",
            {"subscription": "s" * 256},
            BAD,
            "invalid_name",
        ),
        (C + "Subscribe", "bad subscription", {"subscription": "a.b"}, BAD, "invalid_name"),
        (
            C + "Subscribe",
            "unknown subscription type",
            {"subscription_type": 9},
            BAD,
            "invalid_request",
        ),
        (
            C + "Subscribe",
            "key filters, not key-shared",
            {"key_filters": ["a*"]},
            BAD,
            "invalid_request",
        ),
        (
            C + "Subscribe",
            "over-long key filter",
            {"subscription_type": KEY_SHARED, "key_filters": ["k" * (FILTER_CHARS_MAX + 1)]},
            BAD,
            "invalid_request",
        ),
        (
            C + "Subscribe",
            "too many key filters",
            {"subscription_type": KEY_SHARED, "key_filters": ["k"] * (FILTERS_MAX + 1)},
            BAD,
            "invalid_request",
        ),
        (
            C + "Subscribe",
            "unknown namespace",
            {"topic_name": "/ghost/t"},
            NOT_FOUND,
            "namespace_not_found",
        ),
        (C + "Ack", "empty subscription", {"subscription_name": ""}, BAD, "invalid_name"),
        (C + "Ack", "bad subscription", {"subscription_name": "a b"}, BAD, "invalid_name"),
        (C + "Ack", "nothing delivered", {}, NOT_FOUND, "consumer_not_found"),
        (C + "Nack", "empty subscription", {"subscription_name": ""}, BAD, "invalid_name"),
        (
            C + "Nack",
            "over-long subscription",
            {"subscription_name": "s" * 256},
            BAD,
            "invalid_name",
        ),
        (C + "ReceiveMessages", "unknown consumer", {}, NOT_FOUND, "consumer_not_found"),
        (
            "/danube.HealthCheck/HealthCheck",
            "unknown client type",
            {"client": 5},
            BAD,
            "invalid_request",
        ),
        (R + "RegisterSchema", "empty subject", {"subject": ""}, BAD, "invalid_name"),
        (R + "RegisterSchema", "bad subject", {"subject": "a/b"}, BAD, "invalid_name"),
        (R + "RegisterSchema", "over-long subject", {"subject": "s" * 256}, BAD, "invalid_name"),
        (
            R + "RegisterSchema",
            "unknown schema type",
            {"schema_type": "nope"},
            BAD,
            "invalid_schema",
        ),
        (
            R + "RegisterSchema",
            "definition not JSON",
            {"schema_definition": b"{not json"},
            BAD,
            "invalid_schema",
        ),
        (
            R + "RegisterSchema",
            "definition not UTF-8",
            {"schema_definition": NOT_UTF8},
            BAD,
            "invalid_schema",
        ),
        (
            R + "RegisterSchema",
            "empty definition",
            {"schema_definition": b""},
            BAD,
            "invalid_schema",
        ),
        (
            R + "RegisterSchema",
            "bad Avro",
            {"schema_type": "avro", "schema_definition": b'{"type": "record"}'},
            BAD,
            "invalid_schema",
        ),
        (
            R + "RegisterSchema",
            "nested too deep",
            {"schema_definition": b"[" * 5000},
            BAD,
            "invalid_schema",
        ),
        (
            R + "RegisterSchema",
            "over-long description",
            {"description": "d" * 4097},
            BAD,
            "bad_request",
        ),
        (
            R + "RegisterSchema",
            "too many tags",
            {"tags": [f"t{i}" for i in range(SCHEMA_TAGS_MAX + 1)]},
            BAD,
            "bad_request",
        ),
        (R + "GetSchema", "unknown schema id", {"schema_id": 2**63}, NOT_FOUND, "schema_not_found"),
        (
            R + "GetSchema",
            "version 0",
            {"schema_id": SUBJECT_ID, "version": 0},
            BAD,
            "invalid_version",
        ),
        (
            R + "GetSchema",
            "unknown version",
            {"schema_id": SUBJECT_ID, "version": 99},
            NOT_FOUND,
            "schema_not_found",
        ),
        (R + "GetLatestSchema", "empty subject", {"subject": ""}, BAD, "invalid_name"),
        (R + "GetLatestSchema", "bad subject", {"subject": "a b"}, BAD, "invalid_name"),
        (R + "ListVersions", "bad subject", {"subject": "a*b"}, BAD, "invalid_name"),
        (
            R + "CheckCompatibility",
            "unknown mode",
            {"compatibility_mode": "sideways"},
            BAD,
            "invalid_mode",
        ),
        (
            R + "CheckCompatibility",
            "definition not UTF-8",
            {"new_schema_definition": NOT_UTF8},
            BAD,
            "invalid_schema",
        ),
        (R + "CheckCompatibility", "bad subject", {"subject": ".."}, BAD, "invalid_name"),
        (R + "DeleteSchemaVersion", "version 0", {"version": 0}, BAD, "invalid_version"),
        (R + "DeleteSchemaVersion", "empty subject", {"subject": ""}, BAD, "invalid_name"),
        (
            R + "SetCompatibilityMode",
            "unknown mode",
            {"compatibility_mode": "sideways"},
            BAD,
            "invalid_mode",
        ),
        (R + "SetCompatibilityMode", "bad subject", {"subject": "a b"}, BAD, "invalid_name"),
        (
            R + "ConfigureTopicSchema",
            "unknown policy",
            {"validation_policy": "strict"},
            BAD,
            "invalid_policy",
        ),
        (R + "ConfigureTopicSchema", "empty subject", {"schema_subject": ""}, BAD, "invalid_name"),
        (
            R + "UpdateTopicValidationPolicy",
            "unknown policy",
            {"validation_policy": "strict"},
            BAD,
            "invalid_policy",
        ),
    ]
    return [
        Case(m, name, _spoiled(m, **fields), status, code) for m, name, fields, status, code in rows
    ]


EMPTY: dict[str, tuple[grpc.StatusCode, str]] = {
    "TopicLookup": (BAD, "invalid_name"),
    "TopicPartitions": (BAD, "invalid_name"),
    "CreateProducer": (BAD, "invalid_name"),
    "SendMessage": (BAD, "invalid_name"),
    "Subscribe": (BAD, "invalid_name"),
    "ReceiveMessages": (NOT_FOUND, "consumer_not_found"),
    "Ack": (BAD, "invalid_name"),
    "Nack": (BAD, "invalid_name"),
    "HealthCheck": (OK, ""),  # a producer with id 0: valid, answered CLOSE
    "RegisterSchema": (BAD, "invalid_name"),
    "GetSchema": (NOT_FOUND, "schema_not_found"),
    "GetLatestSchema": (BAD, "invalid_name"),
    "ListVersions": (BAD, "invalid_name"),
    "CheckCompatibility": (BAD, "invalid_schema"),  # the definition is read first
    "DeleteSchemaVersion": (BAD, "invalid_name"),
    "SetCompatibilityMode": (BAD, "invalid_mode"),  # the mode is read first
    "ConfigureTopicSchema": (BAD, "invalid_name"),
    "UpdateTopicValidationPolicy": (BAD, "invalid_name"),
    "GetTopicSchemaConfig": (BAD, "invalid_name"),
}


def empty_cases() -> list[Case]:
    """The empty message (every field its default) to every method."""
    return [Case(m, "empty message", b"", *EMPTY[_short(m)]) for m in METHODS]


TABLE = malformed_cases() + topic_cases() + field_cases() + empty_cases()


async def _call(channel: grpc.aio.Channel, case: Case) -> tuple[grpc.StatusCode, str, str]:
    """Send the raw bytes; (status, details, error code of the trailing metadata)."""
    try:
        if case.method == RECEIVE:
            stream = channel.unary_stream(case.method)(case.body, timeout=10)
            async for _ in stream:
                pass
            return OK, "", ""
        await channel.unary_unary(case.method)(case.body, timeout=10)
        return OK, "", ""
    except grpc.aio.AioRpcError as exc:
        trailing = dict(exc.trailing_metadata() or ())
        code = str(trailing.get(ERROR_CODE_KEY, ""))
        if code and len(str(trailing.get("x-request-id", ""))) != 32:  # the trace id stays
            code += " (no x-request-id)"
        return exc.code(), exc.details() or "", code


def _wrong(case: Case, status: grpc.StatusCode, details: str, code: str) -> str | None:
    """What is wrong with an answer, or None."""
    label = f"{_short(case.method)} / {case.case}"
    if status in (S.INTERNAL, S.UNKNOWN):
        return f"{label}: {status.name} {details!r}"
    if (status, code) != (case.status, case.code):
        expected = f"{case.status.name} {case.code!r}"
        return f"{label}: {status.name} {code!r} (expected {expected}) {details!r}"
    if case.code and not details.startswith(f"{case.code}: "):
        return f"{label}: details {details!r} do not start with the code"
    if any(leak in details for leak in ("<class", "Error:", "Traceback", "pydantic")):
        return f"{label}: details show internals: {details!r}"
    return None


@pytest.fixture
def boom(monkeypatch: pytest.MonkeyPatch) -> None:
    """HealthCheck of client id BOOM_ID raises what no handler expects (a bug)."""
    real = DanubeApi.health_check

    async def health_check(self: DanubeApi, request: Any, context: Any) -> Any:
        if request.id == BOOM_ID:
            raise RuntimeError("secret internals /etc/danube")
        return await real(self, request, context)

    monkeypatch.setattr(DanubeApi, "health_check", health_check)


@pytest.mark.usefixtures("boom")
async def test_every_bad_input_has_its_documented_status_and_code(
    mesh_settings: MeshSettings, caplog: pytest.LogCaptureFixture
) -> None:
    assert len(TABLE) > 200
    async with grpc_mesh(mesh_settings, max_body_bytes=BODY_BYTES_MAX) as (api, http, _):
        registered = await api.register(
            sr.RegisterSchemaRequest(
                subject=SUBJECT, schema_type="json_schema", schema_definition=JSON_SCHEMA
            )
        )
        assert registered.schema_id == SUBJECT_ID
        await api.configure(
            sr.ConfigureTopicSchemaRequest(
                topic_name=BOUND,
                schema_subject=SUBJECT,
                validation_policy="enforce",
                enable_payload_validation=True,
            )
        )
        topics_before = (await http.get("/v1/namespaces/default/topics")).json()
        wrong = []
        for case in TABLE:
            status, details, code = await _call(api.channel, case)
            problem = _wrong(case, status, details, code)
            if problem is not None:
                wrong.append(problem)
        assert wrong == []
        # A refused request changed nothing: no topic was created by any of them.
        assert (await http.get("/v1/namespaces/default/topics")).json() == topics_before

        # Over the receive limit, gRPC itself refuses the message before any handler: its
        # status, not ours (docs/grpc-api.md, "Bad input").
        huge = _spoiled(P + "SendMessage", payload=b"x" * BODY_BYTES_MAX)
        status, details, code = await _call(
            api.channel, Case(P + "SendMessage", "over max_body_bytes", huge, OK, "")
        )
        assert (status, code) == (S.RESOURCE_EXHAUSTED, ""), details

        # A bug in a handler: INTERNAL, nothing said but "internal", logged with its trace.
        with caplog.at_level(logging.ERROR, logger="danube.grpc_door"):
            boom = pb.HealthCheckRequest(id=BOOM_ID).SerializeToString()
            status, details, code = await _call(
                api.channel, Case("/danube.HealthCheck/HealthCheck", "a bug", boom, OK, "")
            )
        assert (status, details, code) == (S.INTERNAL, "internal: internal error", "internal")
        logged = [r for r in caplog.records if "HealthCheck/HealthCheck failed" in r.getMessage()]
        assert len(logged) == 1
        assert logged[0].exc_info is not None
        assert "secret internals" in str(logged[0].exc_info[1])
