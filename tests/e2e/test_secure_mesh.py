"""``make run ARGS=--secure``: the whole mesh with NATS users and subject permissions per
service kind, etcd authentication, TLS on the front doors and tokens with RBAC; a round trip
works through it with the admin's token, outsiders are refused (anonymous delete, read and
seek get 401, a principal without bindings 403, plain HTTP nothing), and the generated
secrets appear in no log line nor in ``/v1/cluster`` or ``/metrics``. An ingest node's gRPC
door serves TLS and refuses a call without a token (UNAUTHENTICATED), answers one with."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import nats
import nats.errors
import pytest

from danube.config import MetadataConfig
from danube.meta import MetaAuthError, MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import NodeRecord
from danube.security import issue_token, load_keys
from danube.up.secure import ADMIN_PRINCIPAL, ETCD_MESH_USER, MeshCredentials
from danube.wire import DanubeApi_pb2 as pb

from meshrun import DANUBE, ROOT, MeshRun

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

COUNT = 200


def _ok(mesh: MeshRun, command: str) -> str:
    result = mesh.run(command)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}\n{mesh.log()}"
    return result.stdout


async def test_secure_mesh_round_trip_and_outsiders_refused(
    mesh_run: Callable[..., MeshRun], tmp_path: Path
) -> None:
    mesh = mesh_run("--secure")  # make run ARGS="--data-dir ... --secure"
    mesh.wait_ready()
    assert "security: ON" in mesh.log()
    credentials = MeshCredentials(tmp_path / "data" / "secure")
    secrets = {path.name: path.read_text().strip() for path in credentials.all_files()}
    admin_token = (credentials.dir / "admin.token").read_text().strip()
    secrets["admin.token"] = admin_token
    nats_url = json.loads(mesh.env["DANUBE_BUS__SERVERS"])[0]
    etcd_endpoint = mesh.env["DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT"]
    ca_file = credentials.dir / "pki" / "ca.pem"
    https_url = mesh.url.replace("http://", "https://")
    assert f"DANUBE_CA_FILE={ca_file}" in mesh.log()  # the banner says how to reach it
    # The CLI as the banner tells the admin to run it: CA and token from the environment.
    mesh.env.update(
        DANUBE_SERVICE_ADDR=https_url, DANUBE_CA_FILE=str(ca_file), DANUBE_TOKEN=admin_token
    )

    # Outsiders at the front door: plain HTTP gets no answer; no token is 401 on deleting,
    # reading from the start and seeking; a valid token of a principal without a binding
    # is 403 naming the permission it lacks.
    with pytest.raises(httpx.TransportError):
        async with httpx.AsyncClient(base_url=mesh.url, timeout=5) as plain_http:
            await plain_http.get("/v1/cluster")
    _ok(mesh, "danube admin topics create /default/guarded")
    keys = load_keys(credentials.dir / "keys")
    assert keys.signing is not None
    stranger = issue_token(keys.signing, "mallory", 600, issuer="danube", audience="danube")
    async with httpx.AsyncClient(
        base_url=https_url, verify=ssl.create_default_context(cafile=ca_file), timeout=10
    ) as anon:
        attempts = {
            "delete": await anon.delete("/v1/topics/default/guarded"),
            "read": await anon.post(
                "/v1/topics/default/guarded/subscriptions/peek/consumers",
                json={"name": "c", "start": "earliest"},
            ),
            "seek": await anon.post(
                "/v1/topics/default/guarded/subscriptions/s/seek",
                json={"position": "earliest"},
            ),
        }
        assert {k: r.status_code for k, r in attempts.items()} == dict.fromkeys(attempts, 401)
        denied = await anon.delete(
            "/v1/topics/default/guarded", headers={"authorization": f"Bearer {stranger}"}
        )
        assert denied.status_code == 403, denied.text
        assert "ManageTopic" in denied.json()["error"]["message"]

    # A produce and a consume from the start (the dispatcher catches up from ingest's WAL).
    produced = {
        (partition, int(offset))
        for partition, offset in map(
            str.split,
            _ok(mesh, f"danube produce -t /default/secured -p 2 -m m -c {COUNT}").splitlines(),
        )
    }
    assert len(produced) == COUNT
    consumed = [
        (message["partition"], message["offset"])
        for message in map(
            json.loads,
            _ok(
                mesh, f"danube consume -t /default/secured -m s --start earliest -c {COUNT} --json"
            ).splitlines(),
        )
    ]
    assert sorted(consumed) == sorted(produced)
    # ... the produce through the leaders' data doors (TLS, the admin's token), not discovery;
    tls = ssl.create_default_context(cafile=ca_file)
    async with httpx.AsyncClient(verify=tls, timeout=10) as http:
        cluster = await http.get(
            f"{https_url}/v1/cluster", headers={"authorization": f"Bearer {admin_token}"}
        )
        through_doors = 0.0
        for node in cluster.json()["nodes"]["ingest"]:
            text = (await http.get(f"https://{node['address']}/metrics")).text
            through_doors += sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("danube_ingest_door_messages_total")
            )
        # ... and the consume through the dispatcher's consume door (TLS, the admin's token).
        consumed_on_doors = 0.0
        for node in cluster.json()["nodes"]["dispatcher"]:
            text = (await http.get(f"https://{node['address']}/metrics")).text
            consumed_on_doors += sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("danube_dispatcher_door_messages_total")
            )
    assert through_doors == COUNT
    assert consumed_on_doors >= COUNT

    # NATS: no anonymous client; a service kind's credentials confined to its own subjects.
    with pytest.raises((nats.errors.Error, OSError)) as raised:
        await nats.connect(nats_url, allow_reconnect=False, connect_timeout=2)
    assert "authorization" in str(raised.value).lower()
    errors: list[Exception] = []
    refused = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        errors.append(exc)
        if "permissions violation" in str(exc).lower():
            refused.set()

    spy = await nats.connect(
        nats_url, user="ingest", password=secrets["nats-ingest.password"], error_cb=on_error
    )
    try:
        await spy.subscribe("danube.disp.>")  # the dispatcher's subjects
        # Wait for the server's answer to the SUB itself, not for flush()'s PONG: nats-py 2.16
        # writes flush()'s PING straight to the socket while the SUB still waits in its
        # pending buffer, so the PONG can come back before the server has seen the SUB.
        await asyncio.wait_for(refused.wait(), timeout=10)
    except TimeoutError:
        pass
    finally:
        await spy.close()
    assert any("permissions violation" in str(e).lower() for e in errors), errors

    # etcd: refused without credentials; the mesh user sees the mesh's keys.
    with pytest.raises(MetaAuthError):
        await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, request_timeout_s=3))
    mesh_login = MetadataConfig(
        etcd_endpoint=etcd_endpoint,
        user=ETCD_MESH_USER,
        password_file=credentials.etcd_mesh_password_file,
        request_timeout_s=3,
    )
    async with await MetaStore.connect(mesh_login) as store:
        assert any(kv.key.startswith("nodes/ingest/") for kv in await store.range("nodes/"))
        doors = [
            NodeRecord.model_validate_json(kv.value).grpc_url
            for kv in await store.range(meta_keys.nodes_prefix("ingest"))
        ]
    await _ingest_grpc_door_needs_a_token(doors, ca_file.read_bytes(), admin_token)

    # Nothing the mesh prints or serves holds a secret.
    async with httpx.AsyncClient(
        base_url=https_url,
        verify=ssl.create_default_context(cafile=ca_file),
        headers={"authorization": f"Bearer {admin_token}"},
        timeout=10,
    ) as http:
        cluster = await http.get("/v1/cluster")
        metrics = await http.get("/metrics")
        whoami = await http.get("/v1/security/whoami")
    assert whoami.json()["principal"] == ADMIN_PRINCIPAL, whoami.text
    assert cluster.status_code == 200
    assert "ingest" in cluster.json()["nodes"]
    assert metrics.status_code == 200
    mesh.interrupt()
    log = mesh.log()
    for name, secret in secrets.items():
        for where, text in (
            ("log", log),
            ("/v1/cluster", cluster.text),
            ("/metrics", metrics.text),
        ):
            assert secret not in text, f"{name} leaked into {where}"
    # Every path the round trip took was in the permission table: the only violation
    # nats-server logged is the spy's (services would also log it, as "permissions
    # violation", through their bus's error callback).
    violations = [line for line in log.splitlines() if "violation" in line.lower()]
    assert len(violations) == 1, violations
    assert 'Subject "danube.disp.>"' in violations[0]

    # The same data directory without --secure is refused (its etcd asks for credentials).
    plain = subprocess.run(  # noqa: ASYNC221 (the test has nothing else to do meanwhile)
        [DANUBE, "up", "--data-dir", str(tmp_path / "data")],
        cwd=ROOT,
        env=mesh.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert plain.returncode == 2
    assert "--secure" in plain.stdout


async def _ingest_grpc_door_needs_a_token(doors: list[str | None], ca: bytes, token: str) -> None:
    """Each ingest node's gRPC door: TLS only; no token, UNAUTHENTICATED; the admin's token,
    an answer (a lookup of the partition produced to: Redirect, to a leader's door)."""
    assert doors
    assert all(url is not None and url.startswith("https://") for url in doors), doors
    credentials = grpc.ssl_channel_credentials(ca)
    bearer = (("authorization", f"Bearer {token}"),)
    lookup = pb.TopicLookupRequest(topic="/default/secured-part-0")
    for url in doors:
        assert url is not None
        async with grpc.aio.secure_channel(url.removeprefix("https://"), credentials) as channel:
            call = channel.unary_unary(
                "/danube.Discovery/TopicLookup",
                request_serializer=pb.TopicLookupRequest.SerializeToString,
                response_deserializer=pb.TopicLookupResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(lookup, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
            answer = await call(lookup, timeout=10, metadata=bearer)
            assert answer.response_type == pb.TopicLookupResponse.Redirect
            assert answer.connect_url in doors
        async with grpc.aio.insecure_channel(url.removeprefix("https://")) as plain:
            call = plain.unary_unary(
                "/danube.Discovery/TopicLookup",
                request_serializer=pb.TopicLookupRequest.SerializeToString,
                response_deserializer=pb.TopicLookupResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as unreadable:  # TLS only
                await call(lookup, timeout=5)
            assert unreadable.value.code() == grpc.StatusCode.UNAVAILABLE
