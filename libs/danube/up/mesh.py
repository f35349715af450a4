"""The local mesh `danube up` runs: nats-server, etcd, then one process per service.

Services join the plan when their package exists (``danube.<service>.__main__``);
each later issue adds its own. Every instance inherits the supervisor's
environment (so any ``DANUBE_*`` override reaches it), the config file the supervisor
read (``DANUBE_CONFIG``), plus a few per-instance overrides: its node id and
health/metrics port.

Health/metrics ports are fixed per kind and instance, so that one Prometheus file
(deploy/observability/prometheus-local.yml) scrapes any ``make run``:
``metrics.up_port_base`` + :data:`PORTS_PER_KIND` x the kind's place in
:data:`SERVICE_ORDER` + the instance (9400 ingest-0, 9401 ingest-1, 9420 cloud_reader-0,
9440 uploader-0, 9460 retention-0, 9480 dispatcher-0); discovery-0 serves its metrics on
its API port (``discovery.port``), its replicas on 9501, 9502... (their API ports too).
``up_port_base: 0`` gives any free ports instead. :meth:`MeshPlan.scrape_targets` is the
same list in Prometheus's file_sd form, which ``danube up`` writes beside its data.

What the file (or the environment) sets holds: the data directory only fills in what
they leave unset. etcd's data always lives under it; each ingest instance gets its
own WAL directory (two WAL owners must never share one) named after its node id,
under ``wal_cloud.wal.dir`` when that is set, else under ``<data dir>/wal``; with no
``wal_cloud.cloud`` set at all, the objects go to the fs backend at
``<data dir>/objects``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from danube.config import CONFIG_PATH_ENV, DanubeSettings, FsCloud
from danube.up.secure import SecureMesh
from danube.up.servers import ProcessSpec, etcd_spec, free_port, nats_spec

# Dependency order: a service starts after everything before it is ready.
SERVICE_ORDER = ("ingest", "cloud_reader", "uploader", "retention", "dispatcher", "discovery")
SCALE_MAX = 16
# Fixed metrics ports: a block of this many per kind, from metrics.up_port_base (room for
# SCALE_MAX instances, and round numbers to read: 9400, 9420, 9440...).
PORTS_PER_KIND = 20
_SCALE_RE = re.compile(r"^(?P<service>[a-z_]+)=(?P<count>\d+)$")


def metrics_port(base: int, service: str, index: int) -> int:
    """The fixed health/metrics port of instance ``index`` of ``service`` under ``danube
    up`` (``base``: ``metrics.up_port_base``, not 0); discovery-0 uses its API port."""
    if not 0 <= index < SCALE_MAX:
        raise ValueError(f"instance {index} of {service}: 0..{SCALE_MAX - 1}")
    return base + PORTS_PER_KIND * SERVICE_ORDER.index(service) + index


@dataclass(frozen=True)
class MeshPlan:
    """What to start, in order, and where the operator finds it; ``metrics``: each service
    process's name → the ``host:port`` serving its ``/metrics``."""

    specs: list[ProcessSpec]
    urls: dict[str, str] = field(default_factory=dict)
    secure: SecureMesh | None = None
    metrics: dict[str, str] = field(default_factory=dict)

    def scrape_targets(self) -> list[dict[str, object]]:
        """Prometheus file_sd target groups: one per service process, labelled with its
        kind (``service``, as the compose and Kubernetes scrapes label it) and ``node``."""
        return [
            {"targets": [address], "labels": {"service": name.rsplit("-", 1)[0], "node": name}}
            for name, address in self.metrics.items()
        ]


def available_services() -> list[str]:
    """The services whose package is installed, in dependency order."""
    found = []
    for service in SERVICE_ORDER:
        try:
            spec = importlib.util.find_spec(f"danube.{service}.__main__")
        except ModuleNotFoundError:
            spec = None
        if spec is not None:
            found.append(service)
    return found


def parse_scale(items: list[str]) -> dict[str, int]:
    """``["ingest=2", "dispatcher=3"]`` → ``{"ingest": 2, "dispatcher": 3}``, validated."""
    scale: dict[str, int] = {}
    for item in items:
        match = _SCALE_RE.match(item.strip())
        if match is None:
            raise ValueError(f"--scale expects SERVICE=COUNT, got {item!r}")
        service, count = match["service"], int(match["count"])
        if service not in SERVICE_ORDER:
            raise ValueError(f"--scale: unknown service {service!r}; one of {SERVICE_ORDER}")
        if not 0 <= count <= SCALE_MAX:
            raise ValueError(f"--scale {service}: count must be 0..{SCALE_MAX}, got {count}")
        scale[service] = count
    return scale


def _host_port(address: str) -> tuple[str, int]:
    parts = urlsplit(address if "//" in address else f"//{address}")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"expected host:port in {address!r}")
    return parts.hostname, parts.port


def plan_mesh(
    settings: DanubeSettings,
    *,
    data_dir: Path,
    scale: Mapping[str, int] | None = None,
    services: list[str] | None = None,
    config_path: Path | None = None,
    secure: SecureMesh | None = None,
) -> MeshPlan:
    """The processes of a one-machine mesh for ``settings`` (read from ``config_path``, if
    any, which every service then reads too), servers first; ``secure``: with the servers
    asking for, and every service given, the credentials it holds."""
    nats_host, nats_port = _host_port(settings.bus.servers[0])
    # One etcd on this machine, on the first member named (a cluster is run by hand or by
    # the test launchers: danube.up.clusters).
    etcd_host, etcd_port = _host_port(settings.wal_cloud.metadata.etcd_endpoints[0])
    etcd = etcd_spec(
        host=etcd_host,
        data_dir=data_dir / "etcd",
        client_port=etcd_port,
        peer_port=free_port(etcd_host),
    )
    if secure is not None:
        etcd = dataclasses.replace(etcd, on_first_ready=secure.etcd_setup)
    specs = [
        nats_spec(
            host=nats_host,
            port=nats_port,
            monitor_port=free_port(nats_host),
            config_file=None if secure is None else secure.nats_config,
        ),
        etcd,
    ]
    urls = {"nats": f"nats://{nats_host}:{nats_port}", "etcd": f"http://{etcd_host}:{etcd_port}"}
    scale = scale or {}
    metrics: dict[str, str] = {}
    for service in available_services() if services is None else services:
        for index in range(scale.get(service, 1)):
            spec = _service_spec(
                settings, service, index, data_dir, config_path, tls=secure is not None
            )
            if secure is not None:
                spec = dataclasses.replace(spec, env={**spec.env, **secure.env_for(service)})
            specs.append(spec)
            metrics[spec.name] = f"{_scrape_host(settings, service)}:{spec.port}"
    if any(spec.name.startswith("discovery") for spec in specs):
        discovery = settings.discovery
        # A secured mesh serves TLS with its own certificates (danube.up.secure).
        scheme = "https" if discovery.tls.enabled or secure is not None else "http"
        urls["http"] = f"{scheme}://{discovery.host}:{discovery.port}"
        if discovery.grpc_enabled:
            urls["grpc"] = f"{scheme}://{discovery.host}:{discovery.grpc_port}"
    return MeshPlan(specs, urls, secure, metrics)


SCRAPE_TARGETS_FILE = Path("prometheus") / "targets.json"  # under the data directory


def write_scrape_targets(plan: MeshPlan, data_dir: Path) -> Path:
    """Write :meth:`MeshPlan.scrape_targets` to ``<data_dir>/prometheus/targets.json``
    (written aside and renamed: Prometheus re-reads it on change, never half of it), the
    file deploy/observability/prometheus-local.yml reads; return its path."""
    path = data_dir / SCRAPE_TARGETS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_suffix(".json.tmp")
    aside.write_text(json.dumps(plan.scrape_targets(), indent=2) + "\n")
    aside.replace(path)
    return path


def _scrape_host(settings: DanubeSettings, service: str) -> str:
    """Where a scrape on this machine reaches the service: its bind address, or the
    loopback when it binds every address."""
    host: str = getattr(settings, service).host
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _service_spec(
    settings: DanubeSettings,
    service: str,
    index: int,
    data_dir: Path,
    config_path: Path | None,
    *,
    tls: bool = False,
) -> ProcessSpec:
    """One service instance; ``tls``: its listener serves TLS whatever the settings say (a
    secured mesh gives it certificates through its environment)."""
    name = f"{service}-{index}"
    section = f"DANUBE_{service.upper()}"
    env = {"DANUBE_NODE_ID": name, **_data_env(settings, service, name, data_dir)}
    if config_path is not None:
        # The file the supervisor read, whatever $DANUBE_CONFIG says: every process reads it.
        env[CONFIG_PATH_ENV] = str(config_path.resolve())
    base = settings.metrics.up_port_base
    if service == "discovery":
        # The public APIs' ports are fixed; replicas beyond the first serve theirs (and so
        # their metrics) on fixed ports of their own, and the gRPC API on a free one.
        port = settings.discovery.port
        if index > 0:
            port = metrics_port(base, service, index) if base else free_port()
            env[f"{section}__GRPC_PORT"] = str(free_port())
        env[f"{section}__PORT"] = str(port)
        tls = tls or settings.discovery.tls.enabled
        ready_url = f"{'https' if tls else 'http'}://{settings.discovery.host}:{port}/readyz"
    else:
        port = metrics_port(base, service, index) if base else free_port()
        env[f"{section}__METRICS_PORT"] = str(port)
        if service == "ingest":
            # The gRPC door keeps its port across the supervisor's restarts: a client
            # redirected there retries that address, and finds the node again.
            env[f"{section}__GRPC_PORT"] = str(free_port())
        tls = tls or getattr(settings, service).tls.enabled
        ready_url = f"{'https' if tls else 'http'}://127.0.0.1:{port}/readyz"
    argv = [sys.executable, "-m", f"danube.{service}"]
    return ProcessSpec(name, argv, port, env=env, ready_url=ready_url)


def _data_env(settings: DanubeSettings, service: str, name: str, data_dir: Path) -> dict[str, str]:
    """Where an instance keeps its data: what the settings name, else the data directory.

    ``model_fields_set`` tells a value the file or the environment set from a default."""
    env: dict[str, str] = {}
    wal_cloud = settings.wal_cloud
    if service == "ingest":
        configured = "wal" in wal_cloud.model_fields_set and "dir" in wal_cloud.wal.model_fields_set
        root = wal_cloud.wal.dir if configured else data_dir / "wal"
        env["DANUBE_WAL_CLOUD__WAL__DIR"] = str(Path(root).resolve() / name)
    if "cloud" not in wal_cloud.model_fields_set and isinstance(wal_cloud.cloud, FsCloud):
        # The backend tag travels with the root: an env override of a union member needs it.
        env["DANUBE_WAL_CLOUD__CLOUD__BACKEND"] = "fs"
        env["DANUBE_WAL_CLOUD__CLOUD__ROOT"] = str(data_dir / "objects")
    return env
