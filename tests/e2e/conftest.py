"""Fixtures for whole-mesh tests: service processes started with `python -m danube.<kind>`."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from danube.config import MetadataConfig
from danube.meta import MetaStore
from danube.up import ProcessSpec, ServerProcess, free_port

from meshrun import DANUBE, MeshRun
from replication import NODE_ENV, Cluster

ServiceFactory = Callable[..., ServerProcess]


def service_spec(
    kind: str,
    node_id: str,
    *,
    nats_url: str,
    etcd_endpoint: str,
    meta_prefix: str,
    data_dir: Path,
    env: dict[str, str] | None = None,
) -> ProcessSpec:
    """A service process wired to the test's servers; ready when its /readyz answers."""
    section = f"DANUBE_{kind.upper()}"
    port = free_port()
    base = {
        "DANUBE_NODE_ID": node_id,
        "DANUBE_BUS__SERVERS": f'["{nats_url}"]',
        "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": etcd_endpoint,
        "DANUBE_WAL_CLOUD__METADATA__PREFIX": meta_prefix,
        "DANUBE_WAL_CLOUD__WAL__DIR": str(data_dir / "wal" / node_id),
        f"{section}__LEASE_TTL_S": "3",
        f"{section}__{'PORT' if kind == 'discovery' else 'METRICS_PORT'}": str(port),
    }
    if kind == "discovery":
        base[f"{section}__GRPC_PORT"] = "0"  # a free port; tests that use it set one
    return ProcessSpec(
        node_id,
        [sys.executable, "-m", f"danube.{kind}"],
        port,
        env={**base, **(env or {})},
        ready_url=f"http://127.0.0.1:{port}/readyz",
    )


SpecFactory = Callable[..., ProcessSpec]


@pytest.fixture
def spec_for(tmp_path: Path, nats_url: str, etcd_endpoint: str, meta_prefix: str) -> SpecFactory:
    """``spec_for(kind, node_id, **env)``: the spec of a service wired to this test's servers."""

    def spec(kind: str, node_id: str, **env: str) -> ProcessSpec:
        return service_spec(
            kind,
            node_id,
            nats_url=nats_url,
            etcd_endpoint=etcd_endpoint,
            meta_prefix=meta_prefix,
            data_dir=tmp_path,
            env=env,
        )

    return spec


@pytest.fixture
def services(tmp_path: Path, spec_for: SpecFactory) -> Iterator[ServiceFactory]:
    """``services(kind, node_id, **env)`` starts a service; every one is stopped at the end."""
    started: list[ServerProcess] = []

    def start(kind: str, node_id: str, **env: str) -> ServerProcess:
        spec = spec_for(kind, node_id, **env)
        process = ServerProcess(spec, tmp_path / f"{node_id}-{len(started)}.log")
        started.append(process)
        process.start()
        return process

    yield start
    for process in reversed(started):
        process.stop()


@pytest.fixture(scope="module")
def module_services(
    tmp_path_factory: pytest.TempPathFactory, nats_url: str, etcd_endpoint: str
) -> Iterator[ServiceFactory]:
    """``services`` for one mesh shared by a module's tests (an etcd prefix of its own, data
    in a module temp dir): for tests that need no isolation beyond their own topics."""
    tmp = tmp_path_factory.mktemp("mesh")
    prefix = f"/t-{uuid.uuid4().hex[:12]}"
    started: list[ServerProcess] = []

    def start(kind: str, node_id: str, **env: str) -> ServerProcess:
        spec = service_spec(
            kind,
            node_id,
            nats_url=nats_url,
            etcd_endpoint=etcd_endpoint,
            meta_prefix=prefix,
            data_dir=tmp,
            env=env,
        )
        process = ServerProcess(spec, tmp / f"{node_id}-{len(started)}.log")
        started.append(process)
        process.start()
        return process

    yield start
    for process in reversed(started):
        process.stop()


@pytest.fixture
def mesh_run(tmp_path: Path) -> Iterator[Callable[..., MeshRun]]:
    """``mesh_run(*up_args, make=True)``: the mesh via ``make run ARGS=...`` (or ``danube
    up``), data under tmp_path; killed at the end if the test did not stop it."""
    started: list[MeshRun] = []

    def start(*up_args: str, make: bool = True) -> MeshRun:
        args = ["--data-dir", str(tmp_path / "data"), *up_args]
        if make:
            argv = ["make", "--no-print-directory", "run", "ARGS=" + " ".join(args)]
        else:
            argv = [DANUBE, "up", *args]
        mesh = MeshRun(argv, tmp_path)
        started.append(mesh)
        return mesh

    yield start
    for mesh in started:
        mesh.kill()


@pytest.fixture
def cluster(tmp_path: Path, spec_for: SpecFactory) -> Iterator[Callable[..., Cluster]]:
    """``cluster(nodes, factor=, min_insync=, **env)``: ingest nodes ``ingest-0…`` as real
    processes with short leases (tests/e2e/replication.py), every one stopped at the end."""
    made: list[Cluster] = []

    def make(nodes: int, *, factor: int, min_insync: int, **env: str) -> Cluster:
        full = {
            **NODE_ENV,
            "DANUBE_INGEST__REPLICATION_FACTOR": str(factor),
            "DANUBE_INGEST__MIN_INSYNC_REPLICAS": str(min_insync),
            **env,
        }
        specs = {f"ingest-{i}": spec_for("ingest", f"ingest-{i}", **full) for i in range(nodes)}
        found = Cluster(specs, tmp_path)
        made.append(found)
        for node in specs:
            found.start(node)
        return found

    yield make
    for found in made:
        found.stop_all()


@pytest.fixture
async def store(etcd_endpoint: str, meta_prefix: str) -> AsyncIterator[MetaStore]:
    """A metadata store on the test's etcd prefix."""
    found = await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix))
    yield found
    await found.close()
