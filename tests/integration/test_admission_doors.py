"""One table of admission cases (allowed, unauthenticated, denied, over a limit, bad schema,
fenced producer) against every produce door — a real discovery's (HTTP JSON, HTTP binary,
gRPC SendMessage through the project's own client) and the ingest leader's doors (the
binary data door and the gRPC door, DESIGN §10) — with security on and off: every door
answers each case with the same error code, each in its own status."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from danube.config import DanubeSettings, SecurityConfig
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.frame.produce import encode_produce_frame
from danube.ingest import app as ingest_app
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import NodeRecord
from danube.runtime.service import run_in_process
from danube.security import generate_key, issue_token
from danube.up import free_port
from danube.wire.client import WireClient
from tests.readiness import until_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MeshSettings = Callable[..., DanubeSettings]  # the mesh_settings fixture (conftest.py)
ISS, AUD = "danube-it", "danube-it-api"
ADMIN, WRITER, OUTSIDER = "root", "writer", "mallory"
MESSAGES_MAX = 5  # discovery.max_produce_messages here
SMALL_BYTES = 100  # the topic "small"'s max_message_bytes
SCHEMA = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}})

OK = "ok"
# What each door answers a code with (HTTP status; gRPC status code).
HTTP_STATUS = {
    OK: 200,
    "unauthenticated": 401,
    "permission_denied": 403,
    "producer_fenced": 409,
    "payload_too_large": 413,
    "too_many_messages": 413,
    "schema_violation": 400,
}
GRPC_STATUS = {
    OK: grpc.StatusCode.OK,
    "unauthenticated": grpc.StatusCode.UNAUTHENTICATED,
    "permission_denied": grpc.StatusCode.PERMISSION_DENIED,
    "producer_fenced": grpc.StatusCode.FAILED_PRECONDITION,
    "payload_too_large": grpc.StatusCode.INVALID_ARGUMENT,
    "schema_violation": grpc.StatusCode.INVALID_ARGUMENT,
}


@dataclass(frozen=True)
class Case:
    principal: str | None  # None: no credentials
    topic: str
    payloads: list[bytes]
    secure: str  # the code answered with security on
    open: str  # ... and off (no RBAC: anyone is "anonymous" and may produce)


CASES = {
    "allowed": Case(WRITER, "plain", [b"x"], OK, OK),
    "allowed, schema kept": Case(WRITER, "typed", [b'{"id": 1}'], OK, OK),
    "no credentials": Case(None, "plain", [b"x"], "unauthenticated", OK),
    "denied (RBAC)": Case(OUTSIDER, "plain", [b"x"], "permission_denied", OK),
    "over the topic's payload limit": Case(
        WRITER, "small", [b"x" * (SMALL_BYTES + 1)], "payload_too_large", "payload_too_large"
    ),
    "too many messages": Case(
        WRITER, "plain", [b"x"] * (MESSAGES_MAX + 1), "too_many_messages", "too_many_messages"
    ),
    "bad schema": Case(WRITER, "typed", [b'{"id": "one"}'], "schema_violation", "schema_violation"),
    "fenced producer": Case(WRITER, "held", [b"x"], "producer_fenced", "producer_fenced"),
    "denied before fenced": Case(OUTSIDER, "held", [b"x"], "permission_denied", "producer_fenced"),
}


@dataclass
class Mesh:
    http: httpx.AsyncClient
    grpc_url: str
    token: Callable[[str], str]
    store: MetaStore

    def auth(self, principal: str | None) -> dict[str, str]:
        token = None if principal is None else self.token(principal)
        return {"authorization": f"Bearer {token}"} if token else {}


@asynccontextmanager
async def mesh(mesh_settings: MeshSettings, tmp_path: Path, *, secure: bool) -> AsyncIterator[Mesh]:
    settings = mesh_settings()
    grpc_port = free_port()
    discovery = settings.discovery.model_copy(
        update={"grpc_port": grpc_port, "max_produce_messages": MESSAGES_MAX}
    )
    security = SecurityConfig()
    key = None
    if secure:
        key = generate_key(tmp_path / "keys", kid="k")
        security = SecurityConfig(
            enabled=True, issuer=ISS, audience=AUD, keys_dir=tmp_path / "keys", super_admins=[ADMIN]
        )
    settings = settings.model_copy(update={"discovery": discovery, "security": security})

    def token(principal: str) -> str:  # "": security off, no token sent
        return "" if key is None else issue_token(key, principal, 300, issuer=ISS, audience=AUD)

    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        await until_ready(http, task)
        store = await MetaStore.connect(settings.wal_cloud.metadata)
        try:
            yield Mesh(http, f"http://127.0.0.1:{grpc_port}", token, store)
        finally:
            await store.close()


async def _prepare(mesh: Mesh, secure: bool) -> None:
    """As the super admin: the writer's role, the topics (one small, one with a schema that
    enforces, one held by an exclusive producer)."""
    admin = mesh.auth(ADMIN) if secure else {}
    http = mesh.http

    async def ok(answer: Awaitable[httpx.Response]) -> httpx.Response:
        done = await answer
        assert done.status_code < 300, done.text
        return done

    if secure:
        await ok(http.put("/v1/security/roles/w", json={"permissions": ["Produce"]}, headers=admin))
        binding = {"principal": WRITER, "roles": ["w"], "scope": "namespace", "resource": "default"}
        await ok(http.put("/v1/security/bindings/w", json=binding, headers=admin))
    await ok(http.put("/v1/topics/default/plain", headers=admin))
    small = {"policies": {"max_message_bytes": SMALL_BYTES}}
    await ok(http.put("/v1/topics/default/small", json=small, headers=admin))
    await ok(http.put("/v1/topics/default/typed", headers=admin))
    schema = {"schema_type": "json_schema", "schema": SCHEMA}
    await ok(http.post("/v1/schemas/typed-value/versions", json=schema, headers=admin))
    bind = {"subject": "typed-value", "validation_policy": "enforce", "payload_validation": True}
    await ok(http.put("/v1/topics/default/typed/schema", json=bind, headers=admin))
    await ok(http.put("/v1/topics/default/held", headers=admin))
    held = {"name": "holder", "access_mode": "exclusive"}
    await ok(http.post("/v1/topics/default/held/producers", json=held, headers=admin))


# Each door: (mesh, case) -> (the error code or "ok", the door's own status).
Door = Callable[[Mesh, Case], Awaitable[tuple[str, Any]]]


async def _http(mesh: Mesh, case: Case, **body: Any) -> tuple[str, Any]:
    answer = await mesh.http.post(
        f"/v1/topics/default/{case.topic}/messages",
        headers={**mesh.auth(case.principal), **body.pop("headers", {})},
        **body,
    )
    if answer.status_code == 200:
        return OK, 200
    return answer.json()["error"]["code"], answer.status_code


async def http_json(mesh: Mesh, case: Case) -> tuple[str, Any]:
    messages = [{"payload": p.decode()} for p in case.payloads]
    return await _http(mesh, case, json={"messages": messages})


async def http_json_routed(mesh: Mesh, case: Case) -> tuple[str, Any]:
    """A JSON body the fast path leaves to the FastAPI route (a content type it does not
    match byte for byte): the route's guard authenticates, admission decides."""
    body = json.dumps({"messages": [{"payload": p.decode()} for p in case.payloads]})
    headers = {"content-type": "application/json;charset=UTF-8"}
    return await _http(mesh, case, content=body.encode(), headers=headers)


def _binary_body(case: Case) -> bytes:
    return b"".join(
        encode_produce_frame(p, producer=b"p", publish_time_ms=0) for p in case.payloads
    )


async def http_binary(mesh: Mesh, case: Case) -> tuple[str, Any]:
    headers = {"content-type": "application/vnd.danube.records"}
    return await _http(mesh, case, content=_binary_body(case), headers=headers)


async def ingest_door(mesh: Mesh, case: Case) -> tuple[str, Any]:
    """The binary produce on the data door of the topic's leader, as a lookup names it."""
    record = await mesh.store.get_model(meta_keys.node_key("ingest", "ingest-1"), NodeRecord)
    assert record is not None
    assert record.data_url is not None
    headers = {"content-type": "application/vnd.danube.records", **mesh.auth(case.principal)}
    answer = await mesh.http.post(
        f"{record.data_url}/v1/topics/default/{case.topic}/messages",
        content=_binary_body(case),
        headers=headers,
    )
    if answer.status_code == 200:
        return OK, 200
    return answer.json()["error"]["code"], answer.status_code


async def grpc_send(mesh: Mesh, case: Case, url: str | None = None) -> tuple[str, Any]:
    token = None if case.principal is None else mesh.token(case.principal)
    async with WireClient(url or mesh.grpc_url, timeout_s=10, token=token or None) as client:
        try:
            for payload in case.payloads:  # one message a call (never past the limit)
                await client.send(f"/default/{case.topic}", 0, "p", payload)
        except grpc.aio.AioRpcError as exc:
            return (exc.details() or "").split(":", 1)[0], exc.code()
    return OK, grpc.StatusCode.OK


async def ingest_grpc(mesh: Mesh, case: Case) -> tuple[str, Any]:
    """SendMessage on the gRPC door of the topic's leader, as TopicLookup redirects to it."""
    record = await mesh.store.get_model(meta_keys.node_key("ingest", "ingest-1"), NodeRecord)
    assert record is not None
    assert record.grpc_url is not None
    return await grpc_send(mesh, case, record.grpc_url)


DOORS: dict[str, tuple[Door, dict[str, Any]]] = {
    "http json": (http_json, HTTP_STATUS),
    "http json, routed": (http_json_routed, HTTP_STATUS),
    "http binary": (http_binary, HTTP_STATUS),
    "grpc": (grpc_send, GRPC_STATUS),
    "ingest data door": (ingest_door, HTTP_STATUS),
    "ingest grpc door": (ingest_grpc, GRPC_STATUS),
}
# The one case a door cannot be asked: SendMessage carries one message a call.
NOT_ASKED = {("grpc", "too many messages"), ("ingest grpc door", "too many messages")}


@pytest.mark.parametrize("secure", [True, False], ids=["security on", "security off"])
async def test_every_door_answers_the_admission_table_alike(
    mesh_settings: MeshSettings, tmp_path: Path, secure: bool
) -> None:
    async with mesh(mesh_settings, tmp_path, secure=secure) as running:
        await _prepare(running, secure)
        wrong: list[str] = []
        for name, case in CASES.items():
            expected = case.secure if secure else case.open
            for door, (call, statuses) in DOORS.items():
                if (door, name) in NOT_ASKED:
                    continue
                code, status = await call(running, case)
                if (code, status) != (expected, statuses[expected]):
                    wrong.append(f"{name} / {door}: {code} {status}, not {expected}")
        assert not wrong, "\n".join(wrong)
