"""Fault: the WAL's filesystem fills up (a 4 MiB tmpfs) under real ingest and discovery
processes: producers get a prompt 503 disk_full, leadership does not churn, a metric and one
log line name the WAL directory, and produce resumes (offsets contiguous) once space is freed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from danube.up import ServerProcess

ServiceFactory = Callable[..., ServerProcess]  # the services fixture of tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(90)]

FS_BYTES = 4 * 1024 * 1024
FLOOR_BYTES = 256 * 1024
PROMPT_S = 1.0  # the wanted bound on the disk-full answer


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (needs root), unmounted at the end."""
    mount = tmp_path / "walfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path) -> int:
    """Write ``path`` until the filesystem refuses (ENOSPC); the bytes written."""
    chunk = b"\0" * 65536
    written = 0
    with path.open("wb", buffering=0) as file:
        while True:
            try:
                written += file.write(chunk) or 0
            except OSError:
                break
    with contextlib.suppress(OSError), path.open("ab", buffering=0) as file:
        while True:  # the last partial chunk's worth
            file.write(b"\0" * 512)
            written += 512
    return written


def _produce(http: httpx.Client, text: str) -> httpx.Response:
    return http.post("/v1/topics/default/full/messages", json={"messages": [{"payload": text}]})


def _epoch(http: httpx.Client) -> int:
    (partition,) = http.get("/v1/lookup/default/full").json()["partitions"]
    return int(partition["owner"]["epoch"])


def test_a_full_disk_is_a_prompt_disk_full_without_ownership_churn(
    services: ServiceFactory, small_fs: Path
) -> None:
    wal_dir = small_fs / "ingest-1"
    ingest: ServerProcess = services(
        "ingest",
        "ingest-1",
        DANUBE_WAL_CLOUD__WAL__DIR=str(wal_dir),
        DANUBE_INGEST__DISK_FREE_MIN_BYTES=str(FLOOR_BYTES),
    )
    discovery = services("discovery", "disc-1", DANUBE_DISCOVERY__PRODUCE_TIMEOUT_S="10")
    with httpx.Client(base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=30) as http:
        first = _produce(http, "before")
        assert first.status_code == 200, first.text
        epoch_before = _epoch(http)

        _fill(small_fs / "filler")
        refusals: list[float] = []
        for i in range(10):
            started = time.monotonic()
            answer = _produce(http, f"full-{i}-" + "x" * 100_000)  # past any page left
            refusals.append(time.monotonic() - started)
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "disk_full"
            assert str(wal_dir) in answer.json()["error"]["message"]
            time.sleep(0.2)
        print(f"disk_full answered in {max(refusals):.3f} s at most")
        assert max(refusals) < PROMPT_S

        # No churn: the same process leads at the same epoch.
        assert ingest.pid is not None
        os.kill(ingest.pid, 0)  # still the same process: it neither exited nor restarted
        assert _epoch(http) == epoch_before
        metrics = httpx.get(f"http://127.0.0.1:{ingest.spec.port}/metrics").text
        assert f'danube_ingest_wal_disk_full{{wal_dir="{wal_dir}"}} 1.0' in metrics
        assert ingest.tail_log(200_000).count("WAL disk full") == 1

        (small_fs / "filler").unlink()
        started = time.monotonic()
        answer = _produce(http, "after")
        print(f"produce after freeing space: {time.monotonic() - started:.3f} s")
        assert answer.status_code == 200, answer.text
        # Nothing the refused appends took: the next offset follows the first message.
        assert answer.json()["results"][0]["offset"] == first.json()["results"][0]["offset"] + 1
        assert _epoch(http) == epoch_before
        metrics = httpx.get(f"http://127.0.0.1:{ingest.spec.port}/metrics").text
        assert f'danube_ingest_wal_disk_full{{wal_dir="{wal_dir}"}} 0.0' in metrics
