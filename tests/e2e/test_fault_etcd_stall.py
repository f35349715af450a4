"""Fault: etcd frozen (SIGSTOP) under real ingest, dispatcher and discovery processes with a
3 s node lease. Shorter than the lease, producing goes on untouched; longer, no process
exits: discovery keeps accepting connections and answering (a retriable 503 where it needs
what is fenced), every service serves again under a new lease once etcd is back, and every
acknowledged message is still delivered, at contiguous offsets."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from danube.runtime import ProcessSpec, ServerProcess, etcd_spec, free_port

from meshrun import DANUBE, alive, frozen

SpecFactory = Callable[..., ProcessSpec]  # the spec_for fixture of tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(150)]

LEASE_TTL_S = 3
SHORT_STALL_S = 1.5  # under the lease TTL: nothing may notice
LONG_STALL_S = 8.0  # well past it: every lease is lost
RECOVERY_BOUND_S = 20.0
PRODUCE = "/v1/topics/default/stall/messages"
CONSUME_ARGS = ["--start", "earliest", "--json", "--timeout", "30"]
RETRIABLE = {"no_owner", "not_owner", "meta_unavailable", "timeout", "partition_unavailable"}


def _produce(http: httpx.Client, text: str) -> httpx.Response:
    return http.post(PRODUCE, json={"messages": [{"payload": text}]}, timeout=15)


def test_etcd_stall_never_stops_a_service(
    tmp_path: Path, spec_for: SpecFactory, free_etcd: Callable[[], ServerProcess]
) -> None:
    etcd = free_etcd()
    env = {"DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": f"127.0.0.1:{etcd.spec.port}"}
    processes: dict[str, ServerProcess] = {}
    for kind in ("ingest", "dispatcher", "discovery"):
        env[f"DANUBE_{kind.upper()}__LEASE_TTL_S"] = str(LEASE_TTL_S)
        spec = spec_for(kind, f"{kind}-s", **env)
        processes[kind] = ServerProcess(spec, tmp_path / f"{kind}.log")
    try:
        for process in processes.values():
            process.start()
        pids = {kind: process.pid for kind, process in processes.items()}
        url = f"http://127.0.0.1:{processes['discovery'].spec.port}"
        acked: list[int] = []
        with httpx.Client(base_url=url) as http:
            for i in range(20):
                answer = _produce(http, f"m{i}")
                assert answer.status_code == 200, answer.text
                acked.append(answer.json()["results"][0]["offset"])

            assert etcd.pid is not None
            with frozen(etcd.pid):  # shorter than the lease: producing goes on
                started = time.monotonic()
                while time.monotonic() - started < SHORT_STALL_S:
                    answer = _produce(http, f"m{len(acked)}")
                    assert answer.status_code == 200, answer.text
                    acked.append(answer.json()["results"][0]["offset"])

            with frozen(etcd.pid):  # past the lease: fenced, but up and answering
                started = time.monotonic()
                refused = 0
                while time.monotonic() - started < LONG_STALL_S:
                    assert http.get("/healthz", timeout=5).status_code == 200
                    answer = _produce(http, f"m{len(acked)}")
                    if answer.status_code == 200:
                        acked.append(answer.json()["results"][0]["offset"])
                    else:
                        assert answer.status_code == 503, answer.text
                        assert answer.json()["error"]["code"] in RETRIABLE, answer.text
                        refused += 1
                    time.sleep(0.2)

            deadline = time.monotonic() + RECOVERY_BOUND_S
            while True:  # serving again under new leases
                answer = _produce(http, f"m{len(acked)}")
                if answer.status_code == 200:
                    acked.append(answer.json()["results"][0]["offset"])
                    break
                assert time.monotonic() < deadline, answer.text
                time.sleep(0.2)
            for _ in range(10):
                answer = _produce(http, f"m{len(acked)}")
                assert answer.status_code == 200, answer.text
                acked.append(answer.json()["results"][0]["offset"])

            def registered() -> bool:
                nodes = http.get("/v1/cluster", timeout=5).json()["nodes"]
                return all(nodes.get(kind) for kind in processes)

            deadline = time.monotonic() + RECOVERY_BOUND_S
            while not registered():
                assert time.monotonic() < deadline, http.get("/v1/cluster").text
                time.sleep(0.2)

        # Nobody exited: the same processes served before, through and after.
        assert {kind: process.pid for kind, process in processes.items()} == pids
        assert all(pid is not None and alive(pid) for pid in pids.values())
        assert refused > 0  # the long stall did fence producing for a while
        assert acked == list(range(len(acked)))  # contiguous, none lost or reused

        consumed = _consume_all(url, len(acked))
        assert consumed == [(offset, f"m{offset}") for offset in acked]
        print(f"etcd stalls: {len(acked)} acknowledged, all consumed; {refused} refused")
    finally:
        for process in processes.values():
            process.stop()


def _consume_all(url: str, count: int) -> list[tuple[int, str]]:
    out = subprocess.run(
        [
            DANUBE,
            "consume",
            "-s",
            url,
            "-t",
            "/default/stall",
            "-m",
            "all",
            *CONSUME_ARGS,
            "-c",
            str(count),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [(m["offset"], m["payload"]) for m in map(json.loads, out.splitlines())]


@pytest.fixture
def free_etcd(tmp_path: Path) -> Iterator[Callable[[], ServerProcess]]:
    """An etcd of this test's own (it gets frozen), stopped at the end."""
    started: list[ServerProcess] = []

    def start() -> ServerProcess:
        spec = etcd_spec(data_dir=tmp_path / "etcd", client_port=free_port(), peer_port=free_port())
        process = ServerProcess(spec, tmp_path / "etcd.log")
        process.start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
