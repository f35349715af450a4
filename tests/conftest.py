"""Real-server fixtures: nats-server, etcd and an S3 server on free 127.0.0.1 ports; one
Spark session (local[2]) for the Spark tests, and a config file naming the test's etcd
prefix and object storage."""

from __future__ import annotations

import os

# Tests start servers and services (fork, then exec) while their own etcd stores are open:
# with gRPC's fork handlers on, a child then aborts before exec about one start in five
# ("epoll_wait error: Bad file descriptor"; libs/danube/cli/__init__.py says why). Set
# before anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from pydantic import SecretStr

from danube.bus import Bus
from danube.config import BusConfig, CloudConfig, MetadataConfig
from danube.config.wal_cloud import FsCloud
from danube.meta import MetaStore
from danube.up import (
    EtcdCluster,
    NatsCluster,
    ServerProcess,
    etcd_spec,
    free_port,
    moto_cloud,
    nats_spec,
    s3_spec,
)
from danube.up.servers import MOTO_ACCESS_KEY, MOTO_REGION

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _serve(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One nats-server for the session."""
    tmp = tmp_path_factory.mktemp("nats")
    spec = nats_spec(port=free_port(), monitor_port=free_port())
    yield from _serve(ServerProcess(spec, tmp / "nats.log"))


@pytest.fixture(scope="session")
def nats_url(nats_server: ServerProcess) -> str:
    return f"nats://127.0.0.1:{nats_server.spec.port}"


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One single-member etcd for the session; tests isolate themselves by key prefix."""
    tmp = tmp_path_factory.mktemp("etcd")
    spec = etcd_spec(data_dir=tmp / "data", client_port=free_port(), peer_port=free_port())
    yield from _serve(ServerProcess(spec, tmp / "etcd.log"))


@pytest.fixture(scope="session")
def etcd_endpoint(etcd_server: ServerProcess) -> str:
    return f"127.0.0.1:{etcd_server.spec.port}"


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster of the test's own (tests kill its members), stopped after."""
    with EtcdCluster.launch(tmp_path / "etcd-cluster") as cluster:
        yield cluster


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """A 3-server NATS cluster of the test's own (tests kill its servers), stopped after."""
    with NatsCluster.launch(tmp_path / "nats-cluster") as cluster:
        yield cluster


@pytest.fixture
def meta_prefix() -> str:
    """A key prefix no other test uses."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The moto S3 server for the session."""
    tmp = tmp_path_factory.mktemp("s3")
    yield from _serve(ServerProcess(s3_spec(port=free_port()), tmp / "s3.log"))


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: ServerProcess) -> str:
    return f"http://127.0.0.1:{s3_server.spec.port}"


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh, empty bucket on the S3 server."""
    import boto3

    name = f"t-{uuid.uuid4().hex[:16]}"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=MOTO_REGION,
        aws_access_key_id=MOTO_ACCESS_KEY,
        aws_secret_access_key=MOTO_ACCESS_KEY,
    )
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["fs", "s3"])
def cloud_config(request: pytest.FixtureRequest, tmp_path: Path) -> CloudConfig:
    """Object storage in a fresh root: a local directory, then a bucket on the S3 server."""
    if request.param == "fs":
        return FsCloud(backend="fs", root=str(tmp_path / "objects"))
    endpoint: str = request.getfixturevalue("s3_endpoint")
    bucket: str = request.getfixturevalue("s3_bucket")
    return moto_cloud(endpoint, bucket)


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    """A bus connection to the session's nats-server."""
    bus = await Bus.connect(BusConfig(servers=[nats_url]), name="test")
    yield bus
    await bus.close()


@pytest.fixture
async def store(etcd_endpoint: str, meta_prefix: str) -> AsyncIterator[MetaStore]:
    """A metadata store on the session's etcd, under this test's own prefix."""
    store = await MetaStore.connect(MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix))
    yield store
    await store.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """Spark on two local cores, as small as it gets (no UI, few shuffle partitions).
    Imported here, not at the top: only the Spark tests pay for starting a JVM."""
    from danube.spark import spark_session

    session = spark_session(
        "danube-tests",
        master="local[2]",
        conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.memory": "1g",
        },
    )
    yield session
    session.stop()


def write_config(path: Path, etcd_endpoint: str, prefix: str, cloud: CloudConfig) -> Path:
    """Write a config file with the ``wal_cloud`` metadata and cloud sections (secrets in
    clear: they are the S3 server's test credentials)."""
    section = {
        name: value.get_secret_value() if isinstance(value, SecretStr) else value
        for name, value in cloud
        if value is not None
    }
    metadata = {"etcd_endpoint": etcd_endpoint, "prefix": prefix}
    path.write_text(yaml.safe_dump({"wal_cloud": {"metadata": metadata, "cloud": section}}))
    return path


@pytest.fixture
def config_file(
    tmp_path: Path, etcd_endpoint: str, meta_prefix: str, cloud_config: CloudConfig
) -> Path:
    """A config file naming the test's etcd prefix and object storage (fs, then S3)."""
    return write_config(tmp_path / "danube.yml", etcd_endpoint, meta_prefix, cloud_config)
