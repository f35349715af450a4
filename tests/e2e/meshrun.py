"""Whole-mesh runs for e2e tests: ``make run`` / ``danube up`` started the way a user does, and
the process tree under it (so a test can kill one service, or check nothing is left)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from danube.up import free_port

ROOT = Path(__file__).resolve().parents[2]
DANUBE = str(Path(sys.executable).parent / "danube")
MESH_READY_TIMEOUT_S = 120.0


def process_tree(pid: int) -> dict[int, str]:
    """Every live descendant of ``pid`` and its command line, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    tree: dict[int, str] = {}
    for child in found:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if state != "Z":
            tree[child] = cmdline.decode(errors="replace")
    return tree


class MeshRun:
    """A whole mesh started the way a user does (``make run`` or ``danube up``), on free
    ports, in its own process group (a terminal's foreground job)."""

    def __init__(self, argv: list[str], tmp_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_port = free_port()
        self.grpc_url = f"http://127.0.0.1:{self.grpc_port}"  # Danube's gRPC client API
        self.env = {
            **os.environ,
            "DANUBE_BUS__SERVERS": f'["nats://127.0.0.1:{free_port()}"]',
            "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": f"127.0.0.1:{free_port()}",
            "DANUBE_DISCOVERY__PORT": str(self.port),
            "DANUBE_DISCOVERY__GRPC_PORT": str(self.grpc_port),
            # Free metrics ports, not make run's fixed ones: meshes of tests run side by side.
            "DANUBE_METRICS__UP_PORT_BASE": "0",
            "DANUBE_SERVICE_ADDR": self.url,  # what the CLI talks to without -s
            "PATH": f"{Path(DANUBE).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "COLUMNS": "200",
        }
        self.env.pop("DANUBE_CONFIG", None)
        self.log_path = tmp_path / "mesh.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.seen: dict[int, str] = {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + MESH_READY_TIMEOUT_S
        # The announcement ends with this line (after "mesh ready", the URLs and the
        # security banner): a test that reads the banner finds all of it.
        while "press Ctrl-C to stop" not in self.log():
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.1)

    def services(self, kind: str) -> list[int]:
        """PIDs of the running ``python -m danube.<kind>`` processes."""
        tree = process_tree(self.process.pid)
        self.seen.update(tree)
        return sorted(pid for pid, cmd in tree.items() if f"-m danube.{kind} " in cmd + " ")

    def run(self, command: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """A shell command from the repository root, talking to this mesh."""
        return subprocess.run(
            command,
            shell=True,
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the group; every process of the mesh must be gone after."""
        self.seen.update(process_tree(self.process.pid))
        os.killpg(self.process.pid, signal.SIGINT)
        self.process.wait(timeout=90)
        assert "all processes stopped" in self.log(), self.log()
        left = {pid: cmd for pid, cmd in self.seen.items() if alive(pid)}
        assert left == {}, f"processes left behind: {left}"

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process ``pid`` stopped (SIGSTOP) for the block, continued (SIGCONT) after."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
