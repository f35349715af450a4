"""Authentication and authorization against real services (discovery, ingest, dispatcher in
this process; real nats-server and etcd) with security on: refused tokens (401), each
permission allowed and denied at each scope over HTTP, a representative set over gRPC,
API keys exchanged for tokens, denials counted in the metrics and audit-logged without
the token."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from danube.client import AsyncDanubeClient, PermissionDeniedError, UnauthenticatedError
from danube.client.security import Scope
from danube.config import DanubeSettings, SecurityConfig
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.frame.produce import encode_produce_frame
from danube.ingest import app as ingest_app
from danube.runtime.service import run_in_process
from danube.security import Permission, SigningKey, generate_key, issue_token
from danube.up import free_port
from danube.wire.client import WireClient
from tests.readiness import until_ready

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MeshSettings = Callable[..., DanubeSettings]  # the mesh_settings fixture (conftest.py)
ISS, AUD = "danube-it", "danube-it-api"
ADMIN = "root"
BINARY = {"content-type": "application/vnd.danube.records"}
BINARY_ONE = encode_produce_frame(b"x", producer=b"p", publish_time_ms=0)


@dataclass
class Secured:
    http: httpx.AsyncClient  # no credentials
    base_url: str
    grpc_url: str
    key: SigningKey
    keys_dir: Path

    def token(self, principal: str, ttl_s: float = 300, **kw: Any) -> str:
        args: dict[str, Any] = {"issuer": ISS, "audience": AUD} | kw
        return issue_token(self.key, principal, ttl_s, **args)

    def auth(self, principal: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token(principal)}"}

    def client(self, principal: str) -> AsyncDanubeClient:
        return AsyncDanubeClient(self.base_url, timeout_s=10, token=self.token(principal))


@asynccontextmanager
async def secured_mesh(mesh_settings: MeshSettings, tmp_path: Path) -> AsyncIterator[Secured]:
    keys_dir = tmp_path / "keys"
    generate_key(keys_dir, kid="k-old")
    key = generate_key(keys_dir, kid="k-new")  # the greatest id signs
    settings = mesh_settings()
    grpc_port = free_port()
    discovery = settings.discovery.model_copy(update={"grpc_port": grpc_port})
    security = SecurityConfig(
        enabled=True, issuer=ISS, audience=AUD, keys_dir=keys_dir, super_admins=[ADMIN]
    )
    settings = settings.model_copy(update={"discovery": discovery, "security": security})
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True) as task,
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
    ):
        await until_ready(http, task)
        yield Secured(http, base_url, f"http://127.0.0.1:{grpc_port}", key, keys_dir)


def _error(answer: httpx.Response) -> dict[str, str]:
    error: dict[str, str] = answer.json()["error"]
    return error


async def test_anonymous_and_bad_tokens_get_401(
    mesh_settings: MeshSettings, tmp_path: Path
) -> None:
    async with secured_mesh(mesh_settings, tmp_path) as mesh:
        http = mesh.http
        assert (await http.get("/healthz")).status_code == 200  # probes stay open
        assert (await http.get("/metrics")).status_code == 200
        admin = mesh.auth(ADMIN)
        assert (await http.put("/v1/topics/default/kept", headers=admin)).status_code == 201
        # The outsider scenarios: delete, read from earliest, seek, create a namespace.
        anonymous = [
            http.delete("/v1/topics/default/kept"),
            http.post(
                "/v1/topics/default/kept/subscriptions/s/consumers",
                json={"name": "c", "type": "shared", "start": "earliest"},
            ),
            http.get("/v1/consumers/default.kept.s.d1/messages"),
            http.post("/v1/topics/default/kept/subscriptions/s/seek", json={"to": "earliest"}),
            http.delete("/v1/topics/default/kept/subscriptions/s"),
            http.put("/v1/namespaces/taken"),
            # Produce is answered before routing (the fast path): the same check holds.
            http.post("/v1/topics/default/kept/messages", json={"messages": [{"payload": "x"}]}),
            # And so does the binary body's.
            http.post("/v1/topics/default/kept/messages", content=BINARY_ONE, headers=BINARY),
        ]
        for call in anonymous:
            answer = await call
            assert answer.status_code == 401, answer.text
            assert _error(answer)["code"] == "unauthenticated"
        denied = await http.post(
            "/v1/topics/default/kept/messages",
            content=BINARY_ONE,
            headers={**BINARY, **mesh.auth("alice")},
        )
        assert (denied.status_code, _error(denied)["code"]) == (403, "permission_denied")
        # A consumer stream (WebSocket) is refused the way a stream ends: 4401, then 4403.
        ws_url = (
            mesh.base_url.replace("http://", "ws://") + "/v1/consumers/default.kept.s.d1/stream"
        )
        for headers, close_code, code in (
            ({}, 4401, "unauthenticated"),
            (mesh.auth("alice"), 4403, "permission_denied"),
        ):
            async with ws_connect(ws_url, additional_headers=headers, proxy=None) as ws:
                frame = json.loads(await ws.recv())
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
            assert frame["error"]["code"] == code
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == close_code
        other_dir = tmp_path / "forger"
        forged_same_kid = generate_key(other_dir, kid="k-new")
        unknown_kid = generate_key(other_dir, kid="k-unknown")
        refused = {
            "expired": (mesh.token("alice", now_s=time.time() - 3600), "token_expired"),
            "audience": (mesh.token("alice", audience="other"), "invalid_token"),
            "issuer": (mesh.token("alice", issuer="other"), "invalid_token"),
            "signature": (
                issue_token(forged_same_kid, ADMIN, 60, issuer=ISS, audience=AUD),
                "invalid_token",
            ),
            "unknown key id": (
                issue_token(unknown_kid, ADMIN, 60, issuer=ISS, audience=AUD),
                "invalid_token",
            ),
            "Bearer": ("Basic cm9vdDpyb290", "invalid_token"),
        }
        for words, (token, code) in refused.items():
            header = token if token.startswith("Basic") else f"Bearer {token}"
            answer = await http.get("/v1/namespaces", headers={"authorization": header})
            assert answer.status_code == 401, (words, answer.text)
            assert _error(answer)["code"] == code
            assert words in _error(answer)["message"]
        # Rotation: a token of the older key still verifies while the key is listed.
        old_key = SigningKey("k-old", _private(mesh.keys_dir / "k-old.pem"))
        by_old = issue_token(old_key, ADMIN, 60, issuer=ISS, audience=AUD)
        answer = await http.get("/v1/namespaces", headers={"authorization": f"Bearer {by_old}"})
        assert answer.status_code == 200
        assert (await http.get("/v1/topics/default/kept", headers=admin)).status_code == 200


def _private(path: Path) -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(path.read_bytes(), password=None)


# --- each permission, allowed and denied, at each scope (HTTP) ---------------------------

IN, SIBLING, OUTSIDE = ("a", "t1"), ("a", "t2"), ("b", "t1")


def _request(permission: str, ns: str, topic: str, n: int) -> tuple[str, str, Any]:
    """A request that needs ``permission`` on topic ``/ns/topic`` (or its namespace, or
    the cluster, for the permissions that are about those)."""
    return {
        "Lookup": ("GET", f"/v1/lookup/{ns}/{topic}", None),
        "Produce": (
            "POST",
            f"/v1/topics/{ns}/{topic}/messages",
            {"messages": [{"payload": f"m{n}"}]},
        ),
        "Consume": (
            "POST",
            f"/v1/topics/{ns}/{topic}/subscriptions/s{n}/consumers",
            {"name": f"c{n}", "type": "shared"},
        ),
        "ManageTopic": ("GET", f"/v1/topics/{ns}/{topic}", None),
        "ManageSchema": ("GET", f"/v1/topics/{ns}/{topic}/schema", None),
        "ManageNamespace": ("GET", f"/v1/namespaces/{ns}", None),
        "ManageBroker": ("GET", "/v1/cluster", None),
        "ManageCluster": ("GET", "/v1/security/roles", None),
    }[permission]


# What a binding at each scope reaches, per kind of resource a permission is asked on.
_TOPIC_PERMISSIONS = ("Lookup", "Produce", "Consume", "ManageTopic", "ManageSchema")
_REACH: dict[str, dict[str, set[tuple[str, str]]]] = {
    "cluster": {"topic": {IN, SIBLING, OUTSIDE}, "namespace": {IN, SIBLING, OUTSIDE}},
    "namespace": {"topic": {IN, SIBLING}, "namespace": {IN, SIBLING}},
    "topic": {"topic": {IN}, "namespace": set()},
}


def _expected(permission: str, scope: str, target: tuple[str, str]) -> bool:
    if permission in _TOPIC_PERMISSIONS:
        return target in _REACH[scope]["topic"]
    if permission == "ManageNamespace":
        return target in _REACH[scope]["namespace"]
    return scope == "cluster"  # ManageBroker, ManageCluster: the cluster only


async def test_each_permission_at_each_scope_over_http(
    mesh_settings: MeshSettings, tmp_path: Path
) -> None:
    permissions = [*_TOPIC_PERMISSIONS, "ManageNamespace", "ManageBroker", "ManageCluster"]
    async with secured_mesh(mesh_settings, tmp_path) as mesh, mesh.client(ADMIN) as root:
        for ns in ("a", "b"):
            await root.admin.create_namespace(ns)
        for ns, topic in (IN, SIBLING, OUTSIDE):
            await root.admin.create_topic(f"/{ns}/{topic}")
        resources = {"cluster": "", "namespace": "a", "topic": "/a/t1"}
        for permission in permissions:
            await root.security.create_role(f"r-{permission}", [permission])
            others = [p for p in permissions if p != permission]
            await root.security.create_role(f"all-but-{permission}", others)
            await root.security.create_binding(
                f"b-all-but-{permission}",
                principal=f"all-but-{permission}",
                roles=[f"all-but-{permission}"],
                scope="cluster",
            )
            for scope, resource in resources.items():
                await root.security.create_binding(
                    f"b-{permission}-{scope}",
                    principal=f"u-{permission}-{scope}",
                    roles=[f"r-{permission}"],
                    scope=scope,  # type: ignore[arg-type]
                    resource=resource,
                )
        n = 0
        for permission in permissions:
            for scope in resources:
                principal = f"u-{permission}-{scope}"
                for target in (IN, SIBLING, OUTSIDE):
                    n += 1
                    method, path, body = _request(permission, *target, n)
                    answer = await mesh.http.request(
                        method, path, json=body, headers=mesh.auth(principal)
                    )
                    what = (permission, scope, target, answer.status_code, answer.text[:200])
                    if _expected(permission, scope, target):
                        # Past the gate: served (the schema route: no schema bound, 404).
                        ok = (404,) if permission == "ManageSchema" else (200, 201)
                        assert answer.status_code in ok, what
                    else:
                        assert answer.status_code == 403, what
                        error = _error(answer)
                        assert error["code"] == "permission_denied", what
                        assert permission in error["message"], what
            # Every other permission, cluster-wide, does not make up for the one missing.
            n += 1
            method, path, body = _request(permission, *IN, n)
            answer = await mesh.http.request(
                method, path, json=body, headers=mesh.auth(f"all-but-{permission}")
            )
            assert answer.status_code == 403, (permission, answer.text)
            assert permission in _error(answer)["message"]
        # A binding deleted takes its grant away at once.
        await root.security.delete_binding("b-Produce-cluster")
        method, path, body = _request("Produce", *IN, 0)
        answer = await mesh.http.request(
            method, path, json=body, headers=mesh.auth("u-Produce-cluster")
        )
        assert answer.status_code == 403


async def test_whoami_and_can_answer_what_the_principal_may_at_each_scope(
    mesh_settings: MeshSettings, tmp_path: Path
) -> None:
    async with secured_mesh(mesh_settings, tmp_path) as mesh, mesh.client(ADMIN) as root:
        http = mesh.http
        await root.security.create_role("reader", ["Consume", "Lookup"])
        await root.security.create_role("topics", ["ManageTopic"])
        await root.security.create_role("broker", ["ManageBroker"])
        grants: tuple[tuple[str, str, Scope, str], ...] = (
            ("reader-t1", "reader", "topic", "/a/t1"),
            ("topics-a", "topics", "namespace", "a"),
            ("broker-all", "broker", "cluster", ""),
        )
        for binding, role, bound_at, on in grants:
            await root.security.create_binding(
                binding, principal=binding, roles=[role], scope=bound_at, resource=on
            )
        places = {  # query -> (scope, resource) the answer names
            "": ("cluster", ""),
            "?namespace=a": ("namespace", "a"),
            "?namespace=a&topic=t1": ("topic", "/a/t1"),
            "?namespace=a&topic=t2-part-1": ("topic", "/a/t2"),  # a partition: its topic
            "?namespace=b&topic=t1": ("topic", "/b/t1"),
        }
        held = {  # principal -> query -> permissions
            "reader-t1": {"?namespace=a&topic=t1": ["Lookup", "Consume"]},
            "topics-a": {
                "?namespace=a": ["ManageTopic"],
                "?namespace=a&topic=t1": ["ManageTopic"],
                "?namespace=a&topic=t2-part-1": ["ManageTopic"],
            },
            "broker-all": {q: ["ManageBroker"] for q in places},
            "nobody": {},
        }
        for principal, where in held.items():
            for query, (scope, resource) in places.items():
                answer = await http.get("/v1/security/whoami" + query, headers=mesh.auth(principal))
                assert answer.status_code == 200, answer.text
                doc = answer.json()
                assert (doc["principal"], doc["scope"], doc["resource"]) == (
                    principal,
                    scope,
                    resource,
                )
                assert doc["permissions"] == where.get(query, []), (principal, query)
                assert doc["security_enabled"] is True
                assert doc["super_admin"] is False
                # can: the same decision, one permission at a time.
                joiner = "&" if query else "?"
                for permission in ("Consume", "ManageTopic", "ManageBroker"):
                    answer = await http.get(
                        f"/v1/security/can{query}{joiner}permission={permission}",
                        headers=mesh.auth(principal),
                    )
                    assert answer.status_code == 200, answer.text
                    can = answer.json()
                    assert can["allowed"] is (permission in where.get(query, [])), (
                        principal,
                        query,
                        permission,
                        can,
                    )
                    assert (can["scope"], can["resource"]) == (scope, resource)
                    assert can["permission"] == permission
                    if not can["allowed"]:
                        assert "no binding grants" in can["reason"]
        # whoami lists the principal's own bindings (only its own) with what they grant.
        mine = (await http.get("/v1/security/whoami", headers=mesh.auth("reader-t1"))).json()
        assert mine["grants"] == [
            {
                "binding": "reader-t1",
                "scope": "topic",
                "resource": "/a/t1",
                "roles": ["reader"],
                "permissions": ["Lookup", "Consume"],
            }
        ]
        # The SDK asks the same.
        async with mesh.client("reader-t1") as reader:
            me = await reader.security.whoami(namespace="a", topic="t1")
            assert me.permissions == ["Lookup", "Consume"]
            assert (await reader.security.can("Consume", namespace="a", topic="t1")).allowed
            assert not (await reader.security.can("Consume", namespace="a")).allowed
        # A super-admin holds everything everywhere, bound or not.
        boss = (await http.get("/v1/security/whoami?namespace=b", headers=mesh.auth(ADMIN))).json()
        assert boss["super_admin"] is True
        assert boss["permissions"] == [p.value for p in Permission]
        assert boss["grants"] == []
        # Anonymous: 401 (the console asks for a token then); bad questions: 400.
        for path in ("/v1/security/whoami", "/v1/security/can?permission=Consume"):
            answer = await http.get(path)
            assert answer.status_code == 401
            assert _error(answer)["code"] == "unauthenticated"
        for path in (
            "/v1/security/whoami?topic=t1",
            "/v1/security/whoami?namespace=a.b",
            "/v1/security/can?permission=Consume&namespace=a&topic=t%2F1",
        ):
            answer = await http.get(path, headers=mesh.auth("nobody"))
            assert answer.status_code == 400, (path, answer.text)
            assert _error(answer)["code"] == "invalid_name"
        answer = await http.get("/v1/security/can?permission=Fly", headers=mesh.auth("nobody"))
        assert answer.status_code == 400, answer.text


# --- gRPC -------------------------------------------------------------------------------


async def test_grpc_checks_the_same_bindings(mesh_settings: MeshSettings, tmp_path: Path) -> None:
    async with secured_mesh(mesh_settings, tmp_path) as mesh, mesh.client(ADMIN) as root:
        await root.security.create_role("writer", ["Produce", "Lookup"])
        await root.security.create_role("reader", ["Consume"])
        await root.security.create_binding(
            "w", principal="writer-app", roles=["writer"], scope="namespace", resource="default"
        )
        await root.security.create_binding(
            "r", principal="reader-app", roles=["reader"], scope="topic", resource="/default/g"
        )
        garbage = b"\xff" * 16  # no TopicLookupRequest: refused after authentication only
        async with WireClient(mesh.grpc_url, timeout_s=10) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await anonymous.lookup("/default/g")
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await anonymous.channel.unary_unary("/danube.Discovery/TopicLookup")(garbage)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        expired = mesh.token("writer-app", now_s=time.time() - 3600)
        async with WireClient(mesh.grpc_url, timeout_s=10, token=expired) as late:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await late.lookup("/default/g")
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "expired" in (refused.value.details() or "")
        writer_token = mesh.token("writer-app")
        reader_token = mesh.token("reader-app")
        async with (
            WireClient(mesh.grpc_url, timeout_s=10, token=writer_token) as writer,
            WireClient(mesh.grpc_url, timeout_s=10, token=reader_token) as reader,
        ):
            assert (await writer.lookup("/default/g")).proxy
            lookup = writer.channel.unary_unary("/danube.Discovery/TopicLookup")
            with pytest.raises(grpc.aio.AioRpcError) as malformed:
                await lookup(garbage, metadata=writer.metadata)
            assert malformed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (malformed.value.details() or "").startswith("invalid_request: ")
            consumer_id = await reader.subscribe("/default/g", "c", "sub", "exclusive")
            producer_id = await writer.create_producer("/default/g", "w")
            await writer.send("/default/g", producer_id, "w", b"hello")
            async for message in reader.receive(consumer_id):
                assert message.payload == b"hello"
                await reader.ack(message)
                break
            for call, permission in (
                (reader.lookup("/default/g"), "Lookup"),
                (reader.create_producer("/default/g", "r"), "Produce"),
                (writer.subscribe("/default/g", "w", "sub2", "shared"), "Consume"),
                (reader.subscribe("/default/other", "c", "sub", "shared"), "Consume"),
                (writer.create_producer("/elsewhere/g", "w"), "Produce"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as denied:
                    await call
                assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert f"permission {permission} required" in (denied.value.details() or "")


# --- API keys, metrics, audit -----------------------------------------------------------


def _denied_count(metrics_text: str, permission: str) -> float:
    match = re.search(
        rf'^danube_discovery_authz_denied_total\{{permission="{permission}"\}} (\S+)$',
        metrics_text,
        re.MULTILINE,
    )
    return float(match.group(1)) if match else 0.0


async def test_api_key_exchange_metrics_and_audit(
    mesh_settings: MeshSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="danube.audit")
    async with secured_mesh(mesh_settings, tmp_path) as mesh, mesh.client(ADMIN) as root:
        created = await root.security.create_api_key("svc", description="ci")
        assert created.api_key.startswith("dnbk_")
        listed = await root.security.api_keys()
        assert [(k.id, k.principal) for k in listed] == [(created.id, "svc")]
        assert created.api_key not in str(listed)
        async with AsyncDanubeClient(mesh.base_url, timeout_s=10) as anonymous:
            token = await anonymous.security.token(created.api_key, ttl_s=120)
            assert token.principal == "svc"
            assert token.expires_ms == pytest.approx(time.time() * 1000 + 120_000, abs=3000)
            with pytest.raises(UnauthenticatedError) as bad:
                await anonymous.security.token(created.api_key[:-2] + "xx")
            assert bad.value.code == "invalid_api_key"
        async with AsyncDanubeClient(mesh.base_url, timeout_s=10, token=token.token) as svc:
            assert (await svc.security.whoami()).principal == "svc"
            before = _denied_count((await mesh.http.get("/metrics")).text, "Produce")
            with pytest.raises(PermissionDeniedError) as denied:
                await svc.admin.create_topic("/default/nope")  # ManageTopic
            assert "ManageTopic" in denied.value.message
            producer = svc.producer("/default/nope")
            with pytest.raises(PermissionDeniedError):
                await producer.send_and_wait(b"x")
            after = _denied_count((await mesh.http.get("/metrics")).text, "Produce")
            assert after >= before + 1
        await root.security.revoke_api_key(created.id)
        async with AsyncDanubeClient(mesh.base_url, timeout_s=10) as anonymous:
            with pytest.raises(UnauthenticatedError):
                await anonymous.security.token(created.api_key)
        await root.security.create_role("ops", ["ManageTopic"])  # a management action
    audit = [r for r in caplog.records if r.name == "danube.audit"]
    denial = next(r for r in audit if getattr(r, "allowed", None) is False and r.principal == "svc")  # type: ignore[attr-defined]
    assert denial.action == "PUT /v1/topics/{ns}/{topic}"  # type: ignore[attr-defined]
    assert denial.resource == "topic /default/nope"  # type: ignore[attr-defined]
    assert denial.permission == "ManageTopic"  # type: ignore[attr-defined]
    allowed = [r for r in audit if getattr(r, "allowed", None) is True]
    assert any(r.action == "PUT /v1/security/roles/{name}" for r in allowed)  # type: ignore[attr-defined]
    for record in audit:
        text = record.getMessage() + repr(vars(record))
        assert token.token not in text
        assert created.api_key not in text


# --- the CLI ----------------------------------------------------------------------------

DANUBE = str(Path(sys.executable).parent / "danube")


async def _danube(*args: str, token: str | None = None) -> tuple[int, str, str]:
    """Run `danube ARGS` (with $DANUBE_TOKEN when ``token``); exit code, stdout, stderr."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("DANUBE_TOKEN", None)
    if token is not None:
        env["DANUBE_TOKEN"] = token
    process = await asyncio.create_subprocess_exec(
        DANUBE,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_cli_tokens_roles_bindings_api_keys(
    mesh_settings: MeshSettings, tmp_path: Path
) -> None:
    async with secured_mesh(mesh_settings, tmp_path) as mesh:
        url = mesh.base_url
        code, out, err = await _danube(
            "admin", "security", "tokens", "create", "--principal", ADMIN,
            "--keys-dir", str(mesh.keys_dir), "--issuer", ISS, "--audience", AUD, "--ttl", "10m",
        )  # fmt: skip
        assert code == 0, err
        root = out.strip()
        code, _, err = await _danube("admin", "namespaces", "list", "-s", url)
        assert code == 1
        assert "unauthenticated" in err
        code, out, err = await _danube("--token", root, "admin", "namespaces", "list", "-s", url)
        assert code == 0, err
        assert "default" in out.split()
        security = ("admin", "security")
        for args in (
            ("roles", "create", "ops", "--permissions", "ManageTopic,Lookup", "-s", url),
            ("bindings", "create", "b-ops", "--principal", "ops", "--roles", "ops",
             "--scope", "namespace", "--resource", "default", "-s", url),
        ):  # fmt: skip
            code, _, err = await _danube(*security, *args, token=root)
            assert code == 0, err
        code, out, err = await _danube(*security, "roles", "list", "--json", "-s", url, token=root)
        assert code == 0, err
        assert json.loads(out) == [
            {"name": "ops", "permissions": ["Lookup", "ManageTopic"], "created_ms": ANY_INT}
        ]
        code, out, _ = await _danube(*security, "bindings", "list", "--json", "-s", url, token=root)
        assert [(b["id"], b["scope"], b["resource"]) for b in json.loads(out)] == [
            ("b-ops", "namespace", "default")
        ]
        code, out, err = await _danube(
            *security, "api-keys", "create", "--principal", "ops", "--json", "-s", url, token=root
        )
        assert code == 0, err
        made = json.loads(out)
        code, out, err = await _danube(
            *security, "tokens", "exchange", "--api-key", made["api_key"], "-s", url
        )
        assert code == 0, err
        ops = out.strip()
        code, _, err = await _danube(
            "admin", "topics", "create", "/default/ops-t", "-s", url, token=ops
        )
        assert code == 0, err
        code, _, err = await _danube(
            "admin", "topics", "create", "/other/ops-t", "-s", url, token=ops
        )
        assert code == 1
        assert "permission_denied" in err
        assert "ManageTopic" in err
        code, _, err = await _danube(*security, "roles", "delete", "ops", "-s", url, token=root)
        assert code == 1
        assert "role_in_use" in err
        for cleanup in (("bindings", "delete", "b-ops"), ("roles", "delete", "ops"),
                     ("api-keys", "revoke", made["id"])):  # fmt: skip
            code, _, err = await _danube(*security, *cleanup, "-s", url, token=root)
            assert code == 0, err
        code, out, _ = await _danube(*security, "roles", "list", "--json", "-s", url, token=root)
        assert json.loads(out) == []


class _AnyInt:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, int)


ANY_INT: Any = _AnyInt()


# --- another instance's gate follows the writes (etcd watch) ----------------------------


async def test_a_second_gate_follows_roles_and_bindings(store: Any, tmp_path: Path) -> None:
    from danube.discovery.security.admin import SecurityAdmin
    from danube.meta import TopicName
    from danube.security import Binding, Permission, PermissionDeniedError, Resource, Role
    from danube.security.gate import SecurityGate

    generate_key(tmp_path / "keys")
    config = SecurityConfig(enabled=True, keys_dir=tmp_path / "keys")
    writer = SecurityGate.from_config(config, store)
    follower = SecurityGate.from_config(config, store)
    await writer.load()
    revision = await follower.load()
    orders = Resource.topic(TopicName("shop", "orders"))
    following = asyncio.create_task(follower.follow(revision))
    try:
        admin = SecurityAdmin(store, writer)
        await admin.put_role(Role(name="writer", permissions=[Permission.Produce]))
        await admin.put_binding(
            Binding(id="b", principal="app", roles=["writer"], scope="namespace", resource="shop")
        )
        writer.authorize("app", Permission.Produce, orders, action="test")  # at once here
        async with asyncio.timeout(10):
            while True:  # and within a watch round trip there
                try:
                    follower.authorize("app", Permission.Produce, orders, action="test")
                    break
                except PermissionDeniedError:
                    await asyncio.sleep(0.02)
        await admin.delete_binding("b")
        async with asyncio.timeout(10):
            while True:
                try:
                    follower.authorize("app", Permission.Produce, orders, action="test")
                except PermissionDeniedError:
                    break
                await asyncio.sleep(0.02)
        assert "b" not in follower.policy.bindings
    finally:
        following.cancel()
