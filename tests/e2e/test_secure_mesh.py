"""``make run ARGS=--secure``: the whole mesh with NATS users and subject permissions per
service kind and etcd authentication; a round trip works through it, outsiders are refused,
and the generated secrets appear in no log line nor in ``/v1/cluster`` or ``/metrics``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from danube.config import MetadataConfig
from danube.meta import MetaAuthError, MetaStore
from danube.runtime.secure import ETCD_MESH_USER, MeshCredentials

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
    nats_url = json.loads(mesh.env["DANUBE_BUS__SERVERS"])[0]
    etcd_endpoint = mesh.env["DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT"]

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

    # NATS: no anonymous client; a service kind's credentials confined to its own subjects.
    with pytest.raises((nats.errors.Error, OSError)) as raised:
        await nats.connect(nats_url, allow_reconnect=False, connect_timeout=2)
    assert "authorization" in str(raised.value).lower()
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    spy = await nats.connect(
        nats_url, user="ingest", password=secrets["nats-ingest.password"], error_cb=on_error
    )
    try:
        await spy.subscribe("danube.disp.>")  # the dispatcher's subjects
        await spy.flush(timeout=2)
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

    # Nothing the mesh prints or serves holds a secret.
    async with httpx.AsyncClient(base_url=mesh.url, timeout=10) as http:
        cluster = await http.get("/v1/cluster")
        metrics = await http.get("/metrics")
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
