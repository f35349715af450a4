"""Fault: descriptor exhaustion against real processes. An ingest node under a 256-descriptor
limit leads 300 partitions (its segment files stay within ingest.open_segments_max); discovery
under the same limit meets 400 slow-header clients (each is closed within header_timeout_s,
connections past max_connections at once) and keeps serving and its lease; a service raises its
soft descriptor limit to the hard one at start."""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import httpx
import pytest

from danube.up import ProcessSpec, ServerProcess

SpecFactory = Callable[..., ProcessSpec]  # the spec_for fixture of tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(120)]

FD_LIMIT = 256
PARTITIONS = 300
SEGMENTS_OPEN_MAX = 32
SLOW_CLIENTS = 400
HEADER_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 100


def _limited(spec: ProcessSpec, ulimit: str) -> ProcessSpec:
    """``spec`` run under a shell's ``ulimit`` (``-n 256``: soft and hard)."""
    command = f"ulimit {ulimit} && exec {shlex.join(spec.argv)}"
    return dataclasses.replace(spec, argv=["sh", "-c", command])


class Starter(Protocol):
    def __call__(
        self, kind: str, node_id: str, ulimit: str | None = None, **env: str
    ) -> ServerProcess: ...


@pytest.fixture
def start(tmp_path: Path, spec_for: SpecFactory) -> Iterator[Starter]:
    """``start(kind, node_id, ulimit=None, **env)``: a service, under ``ulimit`` if given."""
    started: list[ServerProcess] = []

    def run(kind: str, node_id: str, ulimit: str | None = None, **env: str) -> ServerProcess:
        spec = spec_for(kind, node_id, **env)
        if ulimit is not None:
            spec = _limited(spec, ulimit)
        process = ServerProcess(spec, tmp_path / f"{node_id}.log")
        started.append(process)
        process.start()
        return process

    yield run
    for process in reversed(started):
        process.stop()


def _fds(pid: int) -> list[str]:
    found = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            found.append(os.readlink(entry))
        except OSError:
            continue
    return found


def _limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open files limit")


def test_ingest_leads_300_partitions_under_256_descriptors(start: Starter) -> None:
    ingest = start(
        "ingest",
        "ingest-1",
        ulimit=f"-n {FD_LIMIT}",
        DANUBE_INGEST__OPEN_SEGMENTS_MAX=str(SEGMENTS_OPEN_MAX),
    )
    discovery = start("discovery", "disc-1")
    with httpx.Client(base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=30) as http:
        created = http.put("/v1/topics/default/many", json={"partitions": PARTITIONS})
        assert created.status_code in (200, 201), created.text
        stored: set[str] = set()
        deadline = time.monotonic() + 90
        while len(stored) < PARTITIONS and time.monotonic() < deadline:
            messages = [{"payload": f"m{i}"} for i in range(PARTITIONS)]
            answer = http.post("/v1/topics/default/many/messages", json={"messages": messages})
            if answer.status_code == 200:
                stored |= {r["partition"] for r in answer.json()["results"]}
        assert len(stored) == PARTITIONS
        assert ingest.pid is not None
        fds = _fds(ingest.pid)
        segments = [fd for fd in fds if fd.endswith(".wal")]
        print(f"ingest with {PARTITIONS} partitions: {len(fds)} fds, {len(segments)} segment files")
        assert len(segments) <= SEGMENTS_OPEN_MAX + 8  # plus those busy in writer threads
        assert len(fds) < FD_LIMIT
        assert "Too many open files" not in ingest.tail_log(1_000_000)
        assert http.get(f"http://127.0.0.1:{ingest.spec.port}/readyz").status_code == 200


def _slow_clients(port: int, count: int) -> list[socket.socket]:
    clients = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(5)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            sock.close()
            continue
        clients.append(sock)
    return clients


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        sock.sendall(b"X")
        sock.setblocking(False)
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset


def test_discovery_sheds_slow_header_clients_and_keeps_its_lease(start: Starter) -> None:
    start("ingest", "ingest-1")
    discovery = start(
        "discovery",
        "disc-1",
        ulimit=f"-n {FD_LIMIT}",
        DANUBE_DISCOVERY__HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        DANUBE_DISCOVERY__MAX_CONNECTIONS=str(MAX_CONNECTIONS),
    )
    port = discovery.spec.port
    clients = _slow_clients(port, SLOW_CLIENTS)
    try:
        deadline = time.monotonic() + HEADER_TIMEOUT_S + 3.0
        open_ = list(clients)
        while open_ and time.monotonic() < deadline:
            time.sleep(0.25)  # a header byte every quarter second: never a whole head
            open_ = [sock for sock in open_ if not _closed_by_server(sock)]
        print(f"{len(clients)} slow clients, {len(open_)} still open after the header timeout")
        assert open_ == []
        assert discovery.pid is not None
        assert len(_fds(discovery.pid)) < FD_LIMIT
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text  # bus, etcd and its lease are fine
    finally:
        for sock in clients:
            sock.close()
    errors = [line for line in discovery.tail_log(1_000_000).splitlines() if "accept()" in line]
    print(f"accept() errors logged: {len(errors)}")
    assert len(errors) <= 10  # at most one a second per listener: a back-off, not a spin


def test_a_service_raises_its_soft_descriptor_limit_to_the_hard_one(start: Starter) -> None:
    ingest = start("ingest", "ingest-1", ulimit="-S -n 200")
    assert ingest.pid is not None
    soft, hard = _limit(ingest.pid)
    assert soft == hard > 200


_ACCEPT_SCRIPT = """
import asyncio, logging, resource, socket, subprocess, sys
from danube.runtime.listener import AcceptBackoffLoop

logging.basicConfig(level=logging.ERROR)

async def main() -> None:
    held = []
    server = await asyncio.start_server(lambda r, w: held.append(w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    resource.setrlimit(resource.RLIMIT_NOFILE, (30, 30))
    await asyncio.sleep(3)

if sys.argv[1] == "backoff":
    with asyncio.Runner(loop_factory=AcceptBackoffLoop) as runner:
        runner.run(main())
else:
    asyncio.run(main())
"""


@pytest.mark.parametrize(("loop", "most"), [("backoff", 5), ("default", None)])
def test_accept_out_of_descriptors_backs_off_instead_of_spinning(
    loop: str, most: int | None
) -> None:
    """100 connections wait while the server has no descriptor left, for 3 s: the service
    loop logs one accept() error a second; CPython's own (shown for the record) hundreds."""
    done = subprocess.run(
        [sys.executable, "-c", _ACCEPT_SCRIPT, loop], capture_output=True, text=True, timeout=30
    )
    errors = [
        line
        for line in done.stderr.splitlines()
        if "accept() failed" in line or "out of system resource" in line
    ]
    print(f"{loop} loop: {len(errors)} accept() errors logged in 3 s")
    if most is not None:
        assert 1 <= len(errors) <= most
    else:  # the defect AcceptBackoffLoop is for; once CPython mends it, the override can go
        assert len(errors) > 50
