"""Danube's own client (the official ``danube-client`` from PyPI, in its own virtual
environment, driven as a subprocess: tests/interop/danube_client_driver.py) against the mesh
started as ``danube up`` starts it, over the gRPC API on its own port."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from danube.security import issue_token, load_keys

from meshrun import DANUBE, ROOT, MeshRun

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CLIENT_PYTHON = ROOT / ".venv-danube-client" / "bin" / "python"
DRIVER = ROOT / "tests" / "interop" / "danube_client_driver.py"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshRun]:
    assert CLIENT_PYTHON.exists(), "the official client's venv is missing: run `make setup-interop`"
    tmp = tmp_path_factory.mktemp("danube-client")
    run = MeshRun([DANUBE, "up", "--data-dir", str(tmp / "data")], tmp)
    try:
        run.wait_ready()
        yield run
    finally:
        run.kill()


def drive(
    mesh: MeshRun, scenario: str, *args: str, timeout_s: float = 120, url: str | None = None
) -> dict[str, Any]:
    done = subprocess.run(
        [str(CLIENT_PYTHON), str(DRIVER), scenario, url or mesh.grpc_url, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    assert done.returncode == 0, f"{scenario} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_roundtrip_with_attributes(mesh: MeshRun) -> None:
    result = drive(mesh, "roundtrip", "/default/grpc-rt")
    received = result["received"]
    assert [m["payload"] for m in received] == [f"hello-{i}" for i in range(10)]
    assert [m["attributes"] for m in received] == [
        {"index": str(i), "kind": "roundtrip"} for i in range(10)
    ]
    assert [m["offset"] for m in received] == list(range(10))
    assert {m["topic"] for m in received} == {"/default/grpc-rt"}
    assert {m["producer"] for m in received} == {"rt-producer"}


def test_partitioned_topic_keyed_sends_in_order(mesh: MeshRun) -> None:
    result = drive(mesh, "partitioned", "/default/grpc-parts")
    received = result["received"]
    assert sorted(m["payload"] for m in received) == sorted(result["sent"])
    partitions_of_key: dict[str, set[str]] = defaultdict(set)
    order_of_key: dict[str, list[int]] = defaultdict(list)
    for m in received:
        partitions_of_key[m["key"]].add(m["topic"])
        order_of_key[m["key"]].append(int(m["payload"].split(":")[1]))
    assert all(len(p) == 1 for p in partitions_of_key.values()), partitions_of_key
    assert all(o == sorted(o) for o in order_of_key.values()), order_of_key
    topics = {m["topic"] for m in received}
    assert topics <= {f"/default/grpc-parts-part-{i}" for i in range(3)}
    described = mesh.run("danube admin topics describe /default/grpc-parts --json")
    assert described.returncode == 0, described.stderr
    assert len(json.loads(described.stdout)["partitions"]) == 3


def test_key_shared_each_key_on_one_consumer(mesh: MeshRun) -> None:
    result = drive(mesh, "key_shared", "/default/grpc-ks")
    owners: dict[str, set[str]] = defaultdict(set)
    for name, messages in result["by_consumer"].items():
        for m in messages:
            owners[m["key"]].add(name)
    assert len(owners) == 10
    assert all(len(names) == 1 for names in owners.values()), owners
    assert sum(len(m) for m in result["by_consumer"].values()) == 100
    for messages in result["by_consumer"].values():
        for key in {m["key"] for m in messages}:
            offsets = [m["offset"] for m in messages if m["key"] == key]
            assert offsets == sorted(offsets)


def test_second_exclusive_consumer_refused(mesh: MeshRun) -> None:
    result = drive(mesh, "exclusive_refused", "/default/grpc-ex")
    assert result["refused"] is True
    assert "ALREADY_EXISTS" in result["error"] or "already exists" in result["error"]


def test_nack_with_delay_is_redelivered(mesh: MeshRun) -> None:
    result = drive(mesh, "nack_delay", "/default/grpc-nack")
    assert result["again"]["offset"] == result["first"]["offset"]
    assert result["again"]["payload"] == "nack-me"
    assert result["redelivered_after_s"] >= 0.9


def test_json_schema_enforced_for_a_schema_producer(mesh: MeshRun) -> None:
    result = drive(mesh, "schema_enforce", "/default/grpc-schema")
    assert result["schema_id"] == result["same_id_again"] > 0
    assert result["configured"][0] is True
    assert result["refused"] is not None
    assert "INVALID_ARGUMENT" in result["refused"]
    assert "schema_violation" in result["refused"]
    assert "id" in result["refused"]  # the missing property is named
    assert result["received"]["payload"] == '{"id": 1, "item": "book"}'
    assert result["received"]["offset"] == 0  # the refused one stored nothing
    assert result["received_schema"] == [result["schema_id"], 1]
    assert result["topic_config"] == ["grpc-schema-value", "enforce", result["schema_id"]]


def test_clients_come_back_after_ingest_and_dispatcher_are_killed(mesh: MeshRun) -> None:
    """The owning ingest and dispatcher are SIGKILLed mid-stream (the supervisor restarts
    them): the client's producer and consumer carry on by themselves, and every message the
    broker acknowledged is received. An ack in flight when the dispatcher dies fails (the
    driver, like any application, goes on: the message comes again)."""
    process = subprocess.Popen(
        [str(CLIENT_PYTHON), str(DRIVER), "survive", mesh.grpc_url, "/default/grpc-sv", "12"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        time.sleep(2)
        for kind in ("ingest", "dispatcher"):
            (pid,) = mesh.services(kind)
            os.kill(pid, 9)
            time.sleep(2)
        out, err = process.communicate(timeout=150)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err[-6000:]
    result = json.loads(out.splitlines()[-1])
    lost = sorted(set(result["acked"]) - set(result["received"]), key=lambda s: int(s[3:]))
    assert lost == [], (
        f"acknowledged but never received: {lost[:10]} (errors: {result['errors']},"
        f" ack errors: {result['ack_errors']})"
    )
    assert len(result["acked"]) > 20


def test_tls_and_token_with_danube_s_client(tmp_path: Path) -> None:
    """A mesh started with --secure, reached the way Danube's users reach a secured broker:
    ``with_tls(ca)`` + ``with_token(jwt)``; a token whose principal has no binding is refused."""
    secure = MeshRun([DANUBE, "up", "--data-dir", str(tmp_path / "data"), "--secure"], tmp_path)
    try:
        secure.wait_ready()
        secrets = tmp_path / "data" / "secure"
        token = (secrets / "admin.token").read_text().strip()
        keys = load_keys(secrets / "keys")
        assert keys.signing is not None
        stranger = issue_token(keys.signing, "stranger", 600, issuer="danube", audience="danube")
        url = secure.grpc_url.replace("http://", "https://")
        result = drive(
            secure,
            "secured",
            "/default/grpc-secured",
            str(secrets / "pki" / "ca.pem"),
            token,
            stranger,
            url=url,
        )
    finally:
        secure.kill()
    assert [m["payload"] for m in result["received"]] == [f"secret-{i}" for i in range(5)]
    assert [m["offset"] for m in result["received"]] == list(range(5))
    # The consumer, made once the topic had a leader, was redirected to that leader's gRPC
    # door (TLS, its token): its stream and acks went through an ingest node.
    (door,) = result["consumer_doors"]
    assert door["proxy"] is False
    assert door["url"].startswith("https://")
    assert door["url"] != url
    assert result["refused"] is not None
    assert "Produce" in result["refused"], result["refused"]
