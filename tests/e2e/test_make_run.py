"""`make run` brings up nats-server and etcd under the supervisor; Ctrl-C leaves nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from danube.up import free_port, probe

from meshrun import ROOT, alive, process_tree

pytestmark = pytest.mark.e2e


def test_make_run_starts_servers_and_ctrl_c_stops_them(tmp_path: Path) -> None:
    nats_port, etcd_port = free_port(), free_port()
    env = {
        **os.environ,
        "DANUBE_BUS__SERVERS": f'["nats://127.0.0.1:{nats_port}"]',
        "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": f"127.0.0.1:{etcd_port}",
        "DANUBE_DISCOVERY__PORT": str(free_port()),
        "DANUBE_DISCOVERY__GRPC_PORT": str(free_port()),
        "DANUBE_METRICS__UP_PORT_BASE": "0",  # free metrics ports: tests run side by side
        "COLUMNS": "200",
    }
    env.pop("DANUBE_CONFIG", None)
    log_path = tmp_path / "make-run.log"
    with log_path.open("wb") as log:
        # A session of its own, like a terminal's foreground job: Ctrl-C reaches the group.
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"ARGS=--data-dir {tmp_path / 'data'}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 90
        # The announcement ends with this line (after "mesh ready", the URLs and the security
        # banner): waiting for "mesh ready" alone raced the banner's next lines under load.
        while "press Ctrl-C to stop" not in log_path.read_text(errors="replace"):
            assert make.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.1)
        assert probe(f"http://127.0.0.1:{etcd_port}/health")
        with socket.create_connection(("127.0.0.1", nats_port), timeout=2) as s:
            assert s.recv(4).startswith(b"INFO")  # nats greets every client with INFO
        output = log_path.read_text(errors="replace")
        assert "nats-server" in output  # the nats process's own lines, labelled
        assert "etcd ready" in output
        assert "security: OFF" in output  # zero-config mode says so in its banner
        assert (tmp_path / "data" / "etcd").is_dir()
        descendants = set(process_tree(make.pid))
        assert len(descendants) >= 3  # danube up, nats-server, etcd

        os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C does
        make.wait(timeout=60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
    output = log_path.read_text(errors="replace")
    assert "all processes stopped" in output, output
    left = [pid for pid in descendants if alive(pid)]
    assert left == [], f"processes left behind: {left}\n{output}"
    assert not probe(f"http://127.0.0.1:{etcd_port}/health")
