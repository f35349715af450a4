"""What ``danube up`` runs the mesh with: the plan of its processes (:mod:`.mesh`), the
supervisor that keeps them (:mod:`.supervisor`), the specs of the servers it starts —
nats-server, etcd, an S3 server, and clusters of them (:mod:`.servers`, :mod:`.clusters`) —
and the files of a secured mesh (:mod:`.secure`). Tests start their servers with it too.

Nothing here runs inside a service process: that is :mod:`danube.runtime`.
"""

from danube.up.clusters import EtcdCluster, NatsCluster
from danube.up.servers import (
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
