"""Clusters of the servers the mesh depends on, for tests and fault harnesses: a 3-member
etcd cluster (static ``--initial-cluster``) and a 3-server NATS cluster (full mesh of routes).

Each member is an ordinary :class:`~danube.up.servers.ServerProcess` built from
``etcd_spec``/``nats_spec``, with its own data directory and log. Every member's listen
address is a parameter (``hosts``: one per member, default all on 127.0.0.1, where ports
are picked free), so a harness that gives each member an address of its own (a network
namespace) reuses the same launcher with fixed ports, and ``wrap`` rewrites each member's
spec before it runs (its argv prefixed by ``ip netns exec <ns>``, say). Members are started
together and then waited for, since an etcd member is ready only once a quorum runs.

```python
with EtcdCluster.launch(tmp / "etcd") as etcd, NatsCluster.launch(tmp / "nats") as nats:
    config = MetadataConfig(etcd_endpoints=etcd.endpoints)
    bus = BusConfig(servers=nats.urls)
    etcd.kill(etcd.leader())          # SIGKILL one member
    etcd.start(name)                  # back, with its data
```
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from danube.up.servers import (
    LOOPBACK,
    EtcdPeers,
    NatsRoutes,
    ProcessSpec,
    ServerError,
    ServerProcess,
    etcd_spec,
    free_port,
    nats_spec,
)

CLUSTER_SIZE = 3
# (member name, its spec) -> the spec to run: e.g. argv prefixed by `ip netns exec <ns>`.
SpecWrapper = Callable[[str, ProcessSpec], ProcessSpec]
_STATUS_TIMEOUT_S = 2.0


def _ports(hosts: Sequence[str], given: Sequence[int] | None) -> list[int]:
    if given is not None:
        if len(given) != len(hosts):
            raise ValueError(f"{len(given)} ports for {len(hosts)} members")
        return list(given)
    return [free_port(host) for host in hosts]


def _hosts(size: int, hosts: str | Sequence[str]) -> list[str]:
    found = [hosts] * size if isinstance(hosts, str) else list(hosts)
    if len(found) != size or size < 1:
        raise ValueError(f"{len(found)} hosts for {size} members")
    return found


@dataclass
class _Members:
    """Members by name, each a process; shared by both clusters."""

    specs: dict[str, ProcessSpec]
    log_dir: Path
    processes: dict[str, ServerProcess] = field(default_factory=dict)
    starts: int = 0

    def launch_all(self) -> None:
        for name in self.specs:
            self._launch(name)
        for name in self.specs:
            self.processes[name].wait_ready()

    def _launch(self, name: str) -> ServerProcess:
        self.starts += 1
        process = ServerProcess(self.specs[name], self.log_dir / f"{name}-{self.starts}.log")
        self.processes[name] = process
        process.launch()
        return process

    def start(self, name: str) -> ServerProcess:
        """Start member ``name`` again (after a kill or stop), with its data."""
        if name in self.processes and self.processes[name].running:
            raise ServerError(f"{name} is running")
        process = self._launch(name)
        process.wait_ready()
        return process

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.stop()


class _Cluster:
    """What both clusters share: their members by name, started, killed and stopped."""

    def __init__(self, members: _Members) -> None:
        self._members = members

    @property
    def names(self) -> list[str]:
        return list(self._members.specs)

    @property
    def specs(self) -> dict[str, ProcessSpec]:
        """Each member's spec, by name (what :meth:`start` runs)."""
        return dict(self._members.specs)

    def process(self, name: str) -> ServerProcess:
        return self._members.processes[name]

    def kill(self, name: str) -> None:
        """SIGKILL member ``name``."""
        self._members.processes[name].kill()

    def start(self, name: str) -> None:
        """Start member ``name`` again, with its data (it rejoins the cluster)."""
        self._members.start(name)

    def stop_all(self) -> None:
        self._members.stop_all()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()


class EtcdCluster(_Cluster):
    """An etcd cluster of ``size`` members, ``etcd-0``…; ``endpoints`` in member order."""

    def __init__(self, members: _Members, endpoints: dict[str, str]) -> None:
        super().__init__(members)
        self.endpoint_of = endpoints  # member name -> host:port

    @classmethod
    def plan(
        cls,
        data_root: Path,
        *,
        size: int = CLUSTER_SIZE,
        hosts: str | Sequence[str] = LOOPBACK,
        client_ports: Sequence[int] | None = None,
        peer_ports: Sequence[int] | None = None,
        wrap: SpecWrapper | None = None,
    ) -> EtcdCluster:
        """The cluster's specs, nothing started (:meth:`start_all` starts it); ``wrap``
        rewrites each member's spec (e.g. to run it inside a network namespace)."""
        addresses = _hosts(size, hosts)
        clients, peers = _ports(addresses, client_ports), _ports(addresses, peer_ports)
        names = [f"etcd-{i}" for i in range(size)]
        initial = ",".join(
            f"{name}=http://{host}:{port}"
            for name, host, port in zip(names, addresses, peers, strict=True)
        )
        token = f"danube-{uuid.uuid4().hex[:8]}"  # members of another run never join this one
        specs: dict[str, ProcessSpec] = {}
        endpoints: dict[str, str] = {}
        for i, name in enumerate(names):
            spec = etcd_spec(
                data_dir=data_root / name,
                client_port=clients[i],
                peer_port=peers[i],
                host=addresses[i],
                peers=EtcdPeers(name=name, initial_cluster=initial, token=token),
            )
            specs[name] = spec if wrap is None else wrap(name, spec)
            endpoints[name] = f"{addresses[i]}:{clients[i]}"
        data_root.mkdir(parents=True, exist_ok=True)
        return cls(_Members(specs, data_root), endpoints)

    @classmethod
    def launch(
        cls, data_root: Path, *, size: int = CLUSTER_SIZE, hosts: str | Sequence[str] = LOOPBACK
    ) -> EtcdCluster:
        """Plan and start a cluster; every member ready (a leader elected) on return."""
        cluster = cls.plan(data_root, size=size, hosts=hosts)
        cluster.start_all()
        return cluster

    def start_all(self) -> None:
        """Start every member, then wait until each answers ``/health``."""
        try:
            self._members.launch_all()
        except BaseException:
            self.stop_all()
            raise

    @property
    def endpoints(self) -> list[str]:
        """Every member's client ``host:port``, in member order."""
        return [self.endpoint_of[name] for name in self.names]

    def status(self, name: str) -> dict[str, object]:
        """The member's ``/v3/maintenance/status`` (etcd's JSON gateway): ``leader`` and
        ``header.member_id`` (decimal strings) tell who leads."""
        request = urllib.request.Request(
            f"http://{self.endpoint_of[name]}/v3/maintenance/status", data=b"{}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=_STATUS_TIMEOUT_S) as response:
            found: dict[str, object] = json.load(response)
        return found

    def leader(self, *, timeout_s: float = 10.0) -> str:
        """The name of the member that leads now (waiting for an election to end)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for name in self.names:
                if not self._members.processes[name].running:
                    continue
                try:
                    status = self.status(name)
                except OSError:
                    continue
                header = status.get("header")
                if isinstance(header, dict) and status.get("leader") == header.get("member_id"):
                    return name
            if time.monotonic() > deadline:
                raise ServerError(f"no etcd leader within {timeout_s} s")
            time.sleep(0.05)


class NatsCluster(_Cluster):
    """A NATS cluster of ``size`` servers, ``nats-0``…, each routed to all the others."""

    def __init__(self, members: _Members, urls: dict[str, str], monitors: dict[str, str]) -> None:
        super().__init__(members)
        self.url_of = urls  # server name -> nats://host:port
        self.monitor_of = monitors  # server name -> http://host:monitor_port

    @classmethod
    def plan(
        cls,
        log_dir: Path,
        *,
        size: int = CLUSTER_SIZE,
        hosts: str | Sequence[str] = LOOPBACK,
        client_ports: Sequence[int] | None = None,
        cluster_ports: Sequence[int] | None = None,
        monitor_ports: Sequence[int] | None = None,
        wrap: SpecWrapper | None = None,
    ) -> NatsCluster:
        """The cluster's specs, nothing started (:meth:`start_all` starts it); ``wrap``
        rewrites each server's spec (e.g. to run it inside a network namespace)."""
        addresses = _hosts(size, hosts)
        clients = _ports(addresses, client_ports)
        routes = _ports(addresses, cluster_ports)
        monitors = _ports(addresses, monitor_ports)
        names = [f"nats-{i}" for i in range(size)]
        route_urls = [f"nats://{host}:{port}" for host, port in zip(addresses, routes, strict=True)]
        specs: dict[str, ProcessSpec] = {}
        urls: dict[str, str] = {}
        monitor_urls: dict[str, str] = {}
        for i, name in enumerate(names):
            others = tuple(url for j, url in enumerate(route_urls) if j != i)
            spec = nats_spec(
                port=clients[i],
                monitor_port=monitors[i],
                host=addresses[i],
                name=name,
                cluster=NatsRoutes(port=routes[i], routes=others),
            )
            specs[name] = spec if wrap is None else wrap(name, spec)
            urls[name] = f"nats://{addresses[i]}:{clients[i]}"
            monitor_urls[name] = f"http://{addresses[i]}:{monitors[i]}"
        log_dir.mkdir(parents=True, exist_ok=True)
        return cls(_Members(specs, log_dir), urls, monitor_urls)

    @classmethod
    def launch(
        cls, log_dir: Path, *, size: int = CLUSTER_SIZE, hosts: str | Sequence[str] = LOOPBACK
    ) -> NatsCluster:
        """Plan and start a cluster; every server ready and routed to the others on return."""
        cluster = cls.plan(log_dir, size=size, hosts=hosts)
        cluster.start_all()
        return cluster

    def start_all(self, *, timeout_s: float = 30.0) -> None:
        """Start every server; wait until each answers and has a route to every other."""
        try:
            self._members.launch_all()
            for name in self.names:
                self.wait_routed(name, timeout_s=timeout_s)
        except BaseException:
            self.stop_all()
            raise

    @property
    def urls(self) -> list[str]:
        """Every server's client URL, in server order."""
        return [self.url_of[name] for name in self.names]

    def start(self, name: str) -> None:
        """Start server ``name`` again; it routes to the others once ready."""
        self._members.start(name)
        self.wait_routed(name)

    def monitor(self, name: str, path: str) -> dict[str, object]:
        """A monitoring endpoint of server ``name`` (``varz``, ``routez``, ``connz``...)."""
        url = f"{self.monitor_of[name]}/{path}"
        with urllib.request.urlopen(url, timeout=_STATUS_TIMEOUT_S) as response:
            found: dict[str, object] = json.load(response)
        return found

    def client_names(self, name: str) -> list[str]:
        """The names of the clients connected to server ``name`` (``connz``)."""
        connections = self.monitor(name, "connz?limit=1024").get("connections") or []
        assert isinstance(connections, list)
        return [str(c.get("name", "")) for c in connections if isinstance(c, dict)]

    def wait_routed(self, name: str, *, timeout_s: float = 30.0) -> None:
        """Wait until server ``name`` has a route to every other running server (NATS pools
        several connections per peer: peers are counted by their server id)."""
        wanted = sum(1 for other in self.names if other != name and self.process(other).running)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = self.monitor(name, "routez").get("routes") or []
            except OSError:
                found = []
            assert isinstance(found, list)
            routes = len({r.get("remote_id") for r in found if isinstance(r, dict)})
            if routes >= wanted:
                return
            if time.monotonic() > deadline:
                raise ServerError(f"{name} has {routes} of {wanted} routes after {timeout_s} s")
            time.sleep(0.05)
