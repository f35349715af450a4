"""The README quickstart on the whole mesh: `danube up`, then `danube produce` and `danube
consume` (the console script) against it, then Ctrl-C stops everything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from danube.runtime import free_port

pytestmark = pytest.mark.e2e

DANUBE = str(Path(sys.executable).parent / "danube")
READY_TIMEOUT_S = 90.0
COMMAND_TIMEOUT_S = 60.0


def _danube(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DANUBE, *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    )


def test_up_then_produce_and_consume_with_the_cli(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DANUBE_BUS__SERVERS": f'["nats://127.0.0.1:{free_port()}"]',
        "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": f"127.0.0.1:{free_port()}",
        "DANUBE_DISCOVERY__PORT": str(port),
        "COLUMNS": "200",
    }
    env.pop("DANUBE_CONFIG", None)
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            [DANUBE, "up", "--data-dir", str(tmp_path / "data")],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "mesh ready" not in log_path.read_text(errors="replace"):
            assert up.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)

        produced = _danube("produce", "-s", url, "-t", "/default/quick", "-p", "2", "-m", "hi",
                           "-c", "200", "--key", "k")  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        lines = produced.stdout.splitlines()
        assert len(lines) == 200
        assert len({line.split()[0] for line in lines}) == 1  # one key, one partition
        assert [int(line.split()[1]) for line in lines] == list(range(200))

        consumed = _danube("consume", "-s", url, "-t", "/default/quick", "-m", "s",
                           "--start", "earliest", "-c", "200", "--json")  # fmt: skip
        assert consumed.returncode == 0, consumed.stderr
        got = [json.loads(line) for line in consumed.stdout.splitlines()]
        assert [(m["offset"], m["payload"], m["key"]) for m in got] == [
            (i, "hi", "k") for i in range(200)
        ]

        cluster = _danube("admin", "cluster", "-s", url, "--json")
        assert cluster.returncode == 0, cluster.stderr
        nodes = json.loads(cluster.stdout)["nodes"]
        assert {"discovery", "ingest", "dispatcher"} <= {k for k, v in nodes.items() if v}

        bench = _danube("bench", "e2e", "-s", url, "-n", "2000", "--size", "200", "--json")
        assert bench.returncode == 0, bench.stderr
        result = json.loads(bench.stdout)
        assert (result["produced"], result["consumed"], result["missing"]) == (2000, 2000, 0)

        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    assert "all processes stopped" in log_path.read_text(errors="replace")
