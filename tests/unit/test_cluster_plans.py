"""The cluster launchers' plans (danube.up.clusters), no process started: one address
per member, fixed ports, the static etcd cluster, NATS routes to the others only, and the
spec rewrite a network harness needs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from danube.up import EtcdCluster, NatsCluster, ProcessSpec

pytestmark = pytest.mark.unit

HOSTS = ["10.9.0.1", "10.9.0.2", "10.9.0.3"]


def _in_netns(name: str, spec: ProcessSpec) -> ProcessSpec:
    return dataclasses.replace(spec, argv=["ip", "netns", "exec", f"ns-{name}", *spec.argv])


def _flag(argv: list[str], name: str) -> str:
    found = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"--{name}=")]
    assert len(found) == 1, (name, argv)
    return found[0]


def test_an_etcd_cluster_on_given_addresses(tmp_path: Path) -> None:
    cluster = EtcdCluster.plan(
        tmp_path, hosts=HOSTS, client_ports=[2379] * 3, peer_ports=[2380] * 3, wrap=_in_netns
    )
    assert cluster.endpoints == [f"{host}:2379" for host in HOSTS]
    initial = ",".join(f"etcd-{i}=http://{host}:2380" for i, host in enumerate(HOSTS))
    tokens = set()
    for i, (name, spec) in enumerate(cluster.specs.items()):
        argv = list(spec.argv)
        assert argv[:4] == ["ip", "netns", "exec", f"ns-{name}"]
        assert _flag(argv, "name") == name
        assert _flag(argv, "initial-cluster") == initial
        assert _flag(argv, "listen-client-urls") == f"http://{HOSTS[i]}:2379"
        assert _flag(argv, "data-dir") == str(tmp_path / name)
        assert _flag(argv, "initial-cluster-state") == "new"
        tokens.add(_flag(argv, "initial-cluster-token"))
    assert len(tokens) == 1  # one cluster
    other = EtcdCluster.plan(tmp_path / "b", hosts=HOSTS, client_ports=[1] * 3, peer_ports=[2] * 3)
    assert _flag(list(other.specs["etcd-0"].argv), "initial-cluster-token") not in tokens


def test_a_nats_cluster_routes_each_server_to_the_others(tmp_path: Path) -> None:
    cluster = NatsCluster.plan(
        tmp_path,
        hosts=HOSTS,
        client_ports=[4222] * 3,
        cluster_ports=[6222] * 3,
        monitor_ports=[8222] * 3,
    )
    assert cluster.urls == [f"nats://{host}:4222" for host in HOSTS]
    for i, spec in enumerate(cluster.specs.values()):
        argv = list(spec.argv)
        routes = argv[argv.index("--routes") + 1].split(",")
        assert routes == [f"nats://{host}:6222" for j, host in enumerate(HOSTS) if j != i]
        assert argv[argv.index("--cluster") + 1] == f"nats://{HOSTS[i]}:6222"
        assert argv[argv.index("-a") + 1] == HOSTS[i]
        assert spec.ready_url == f"http://{HOSTS[i]}:8222/healthz"


def test_ports_must_match_the_members(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 ports for 3 members"):
        EtcdCluster.plan(tmp_path, hosts=HOSTS, client_ports=[1, 2])
