"""Running the mesh: server specs for nats-server, etcd and S3, clusters of them, and the
process supervisor."""

from danube.runtime.clusters import EtcdCluster, NatsCluster
from danube.runtime.servers import (
    ProcessSpec,
    ServerError,
    ServerProcess,
    ServerTls,
    etcd_spec,
    find_binary,
    free_port,
    moto_cloud,
    nats_spec,
    probe,
    s3_spec,
)

__all__ = [
    "EtcdCluster",
    "NatsCluster",
    "ProcessSpec",
    "ServerError",
    "ServerProcess",
    "ServerTls",
    "etcd_spec",
    "find_binary",
    "free_port",
    "moto_cloud",
    "nats_spec",
    "probe",
    "s3_spec",
]
