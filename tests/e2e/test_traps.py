"""No traps (issue 31, item 5), against real processes: an ingest node whose WAL volume (a
real tmpfs) is smaller than the disk reserve refuses to start with the numbers; one whose
volume is below the reserve is not ready (/readyz 503 disk_full, with the numbers) exactly
while produce is refused, and ready again once space is freed; discovery's HTTP listener
closes one client address's connections past its per-client limit while another address
is served, and counts the refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.up import ProcessSpec, ServerProcess

SpecFactory = Callable[..., ProcessSpec]  # the spec_for fixture of tests/e2e/conftest.py
ServiceFactory = Callable[..., ServerProcess]  # the services fixture

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(120)]

MiB = 1024 * 1024
RESERVE_BYTES = 64 * MiB  # ingest.disk_free_min_bytes by default: the tests leave it so
EXIT_BAD_CONFIG = 2
READY_WITHIN_S = 5.0  # the node reads its free space every second


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``tmpfs(size_bytes)``: a real file system of that size (needs root to mount),
    unmounted at the end."""
    mounted: list[Path] = []

    def mount(size_bytes: int) -> Path:
        point = tmp_path / f"fs-{len(mounted)}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(point)],
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _ballast(path: Path, size_bytes: int) -> None:
    """Write ``size_bytes`` of zeros to ``path`` (tmpfs: real pages, counted as used)."""
    chunk = b"\0" * MiB
    with path.open("wb", buffering=0) as file:
        left = size_bytes
        while left > 0:
            left -= file.write(chunk[: min(left, MiB)]) or 0


def _free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def _ballast_leaving(mount: Path, free_bytes: int) -> Path:
    """A ballast file that leaves about ``free_bytes`` free on ``mount``."""
    ballast = mount / "ballast"
    _ballast(ballast, _free_bytes(mount) - free_bytes)
    return ballast


def _readyz(port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)


def _until_readyz(
    port: int, reasons: list[str], within_s: float = READY_WITHIN_S
) -> httpx.Response:
    """Poll ``/readyz`` until its reasons' codes are ``reasons`` ([]: ready), or ``within_s``
    passed (then the last answer)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            answer = _readyz(port)
        except httpx.TransportError:  # not listening yet
            if time.monotonic() > deadline:
                raise
        else:
            codes = [reason["code"] for reason in answer.json().get("reasons", [])]
            if codes == reasons or time.monotonic() > deadline:
                return answer
        time.sleep(0.1)


def _produce(http: httpx.Client, text: str) -> httpx.Response:
    return http.post("/v1/topics/default/traps/messages", json={"messages": [{"payload": text}]})


def test_a_wal_volume_smaller_than_the_reserve_stops_the_start_with_the_numbers(
    spec_for: SpecFactory, tmpfs: Callable[[int], Path]
) -> None:
    mount = tmpfs(30 * MiB)  # the black-box run's volume, under the default 64 MiB reserve
    spec = spec_for("ingest", "ingest-1", DANUBE_WAL_CLOUD__WAL__DIR=str(mount / "wal"))
    started = time.monotonic()
    done = subprocess.run(
        list(spec.argv),
        env={**os.environ, **spec.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    print(f"exit {done.returncode} after {time.monotonic() - started:.1f} s")
    assert done.returncode == EXIT_BAD_CONFIG, output
    (line,) = [line for line in output.splitlines() if "can never take a write" in line]
    print(line)
    assert "bad configuration" in line
    assert f"{30 * MiB} B (30.0 MiB) total" in line
    assert f"ingest.disk_free_min_bytes={RESERVE_BYTES} B (64.0 MiB)" in line
    assert str(mount / "wal") in line


def test_readyz_is_503_disk_full_exactly_while_the_wal_is_below_its_reserve(
    services: ServiceFactory, spec_for: SpecFactory, tmpfs: Callable[[int], Path], tmp_path: Path
) -> None:
    mount = tmpfs(128 * MiB)
    wal_dir = mount / "wal"
    ballast = _ballast_leaving(mount, 32 * MiB)  # below the reserve from the start
    spec = spec_for(
        "ingest",
        "ingest-1",
        DANUBE_WAL_CLOUD__WAL__DIR=str(wal_dir),
        DANUBE_WAL_CLOUD__WAL__ROTATION__MAX_BYTES=str(4 * MiB),
    )
    # Not ready from the start, so not waited for: polled below.
    ingest = ServerProcess(dataclasses.replace(spec, ready_url=None), tmp_path / "ingest.log")
    ingest.start()
    try:
        answer = _until_readyz(spec.port, ["disk_full"], within_s=30)  # it starts meanwhile
        assert answer.status_code == 503, answer.text
        _assert_disk_full(answer.json(), wal_dir, total_bytes=128 * MiB)
        warnings = [
            line
            for line in ingest.tail_log(100_000).splitlines()
            if "less free space than the reserve" in line
        ]
        print(warnings[0] if warnings else "no warning")
        assert len(warnings) == 1
        warning = json.loads(warnings[0])
        assert warning["level"] == "warning"
        assert f"{128 * MiB} B (128.0 MiB) total" in warning["msg"]
        assert f"ingest.disk_free_min_bytes={RESERVE_BYTES} B" in warning["msg"]
        assert warning["total_bytes"] == 128 * MiB
        assert warning["free_min_bytes"] == RESERVE_BYTES
        assert warning["free_bytes"] < RESERVE_BYTES

        ballast.unlink()
        freed = time.monotonic()
        answer = _until_readyz(spec.port, [])
        print(f"ready {time.monotonic() - freed:.2f} s after the ballast went")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"ready": True}

        discovery = services("discovery", "disc-1", DANUBE_DISCOVERY__PRODUCE_TIMEOUT_S="10")
        with httpx.Client(base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=30) as http:
            first = _produce(http, "before")
            assert first.status_code == 200, first.text

            ballast = _ballast_leaving(mount, 16 * MiB)
            answer = _until_readyz(spec.port, ["disk_full"])
            assert answer.status_code == 503, answer.text
            _assert_disk_full(answer.json(), wal_dir, total_bytes=128 * MiB)
            refused = _produce(http, "while full")  # what not ready means: refused
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "disk_full"

            ballast.unlink()
            answer = _until_readyz(spec.port, [])
            assert answer.status_code == 200, answer.text
            after = _produce(http, "after")
            assert after.status_code == 200, after.text
            offset = after.json()["results"][0]["offset"]
            assert offset == first.json()["results"][0]["offset"] + 1
    finally:
        ingest.stop()


def _assert_disk_full(body: dict[str, Any], wal_dir: Path, *, total_bytes: int) -> None:
    assert body["ready"] is False
    (reason,) = body["reasons"]
    print(reason)
    assert reason["code"] == "disk_full"
    assert reason["wal_dir"] == str(wal_dir)
    assert reason["free_min_bytes"] == RESERVE_BYTES
    assert reason["total_bytes"] == total_bytes
    assert 0 <= reason["free_bytes"] < RESERVE_BYTES
    assert str(reason["free_bytes"]) in reason["message"]


PER_CLIENT = 3


def _served(sock: socket.socket) -> bytes:
    """Send a keep-alive ``GET /healthz`` on ``sock``; the answer's first bytes (b"" if the
    server closed the connection)."""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def _refused(metrics: str) -> float:
    wanted = 'danube_listener_connections_refused_total{listener="http",reason="per_client"} '
    for line in metrics.splitlines():
        if line.startswith(wanted):
            return float(line.removeprefix(wanted))
    return 0.0


def test_discovery_closes_one_clients_connections_past_its_limit_and_serves_another(
    services: ServiceFactory,
) -> None:
    discovery = services(
        "discovery",
        "disc-1",
        DANUBE_DISCOVERY__MAX_CONNECTIONS_PER_CLIENT=str(PER_CLIENT),
        DANUBE_DISCOVERY__KEEP_ALIVE_TIMEOUT_S="60",  # the held connections outlive the test
    )
    port = discovery.spec.port
    other = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        transport=httpx.HTTPTransport(local_address="127.0.0.2"),
        timeout=5,
    )
    with other:
        before = _refused(other.get("/metrics").text)
        held = [_connect(port, "127.0.0.1") for _ in range(PER_CLIENT)]
        try:
            for sock in held:
                assert _served(sock).startswith(b"HTTP/1.1 200 "), "held connections are served"
            for _ in range(2):  # past the limit: closed as accepted
                with _connect(port, "127.0.0.1") as extra:
                    assert _served(extra) == b""
            # Another client address is served meanwhile, on a new connection each time.
            for _ in range(3):
                answer = other.get("/healthz", headers={"Connection": "close"})
                assert answer.status_code == 200, answer.text
            metrics = other.get("/metrics").text
            assert _refused(metrics) - before == 2
            # The first client's connections are given back as they close.
            held.pop().close()
            deadline = time.monotonic() + 5
            while True:
                with _connect(port, "127.0.0.1") as again:
                    served = _served(again)
                if served or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert served.startswith(b"HTTP/1.1 200 "), served
        finally:
            for sock in held:
                sock.close()
