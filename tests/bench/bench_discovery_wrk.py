"""HTTP produce throughput through one discovery process, driven by `wrk` (a C load generator,
so the client is not the bottleneck; `apt-get install wrk`). Real nats-server, etcd, ingest and
discovery processes; 100-byte payloads, fsync durability, one unpartitioned topic.

Run: .venv/bin/python tests/bench/bench_discovery_wrk.py
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from danube.up import ProcessSpec, ServerProcess, etcd_spec, free_port, nats_spec

DURATION_S = 5
SCENARIOS = [(1, 1), (32, 1), (1, 100), (8, 100)]  # (connections, messages per request)


def _service(kind: str, nats_url: str, etcd: str, tmp: Path) -> ServerProcess:
    port = free_port()
    section = f"DANUBE_{kind.upper()}"
    env = {
        "DANUBE_NODE_ID": f"{kind}-0",
        "DANUBE_BUS__SERVERS": f'["{nats_url}"]',
        "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": etcd,
        "DANUBE_WAL_CLOUD__WAL__DIR": str(tmp / "wal"),
        f"{section}__{'PORT' if kind == 'discovery' else 'METRICS_PORT'}": str(port),
    }
    argv = [sys.executable, "-m", f"danube.{kind}"]
    spec = ProcessSpec(kind, argv, port, env=env, ready_url=f"http://127.0.0.1:{port}/readyz")
    return ServerProcess(spec, tmp / f"{kind}.log")


def _script(tmp: Path, count: int) -> Path:
    body = json.dumps({"messages": [{"payload": "x" * 100}] * count})
    path = tmp / f"post{count}.lua"
    path.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = '{body}'\n"
    )
    return path


def main(tmp: Path) -> None:
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install wrk")
    nats = ServerProcess(nats_spec(port=free_port(), monitor_port=free_port()), tmp / "n.log")
    etcd = ServerProcess(
        etcd_spec(data_dir=tmp / "etcd", client_port=free_port(), peer_port=free_port()),
        tmp / "e.log",
    )
    with nats, etcd:
        nats_url, etcd_url = f"nats://127.0.0.1:{nats.spec.port}", f"127.0.0.1:{etcd.spec.port}"
        with (
            _service("ingest", nats_url, etcd_url, tmp),
            _service("discovery", nats_url, etcd_url, tmp) as discovery,
        ):
            conn = http.client.HTTPConnection("127.0.0.1", discovery.spec.port)
            conn.request("PUT", "/v1/topics/default/bench", body="{}")
            conn.getresponse().read()
            url = f"http://127.0.0.1:{discovery.spec.port}/v1/topics/default/bench/messages"
            print(f"HTTP produce, 100 B payloads, fsync, wrk {DURATION_S} s per scenario")
            print(f"{'conns':>5} {'batch':>5} {'req/s':>9} {'msgs/s':>9} {'avg latency':>12}")
            for conns, batch in SCENARIOS:
                argv = ["wrk", "-t1", f"-c{conns}", f"-d{DURATION_S}s", "-s",
                        str(_script(tmp, batch)), url]  # fmt: skip
                out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
                if "Non-2xx" in out:
                    sys.exit(f"errors during the run:\n{out}")
                match = re.search(r"Requests/sec:\s+([\d.]+)", out)
                latency = re.search(r"Latency\s+(\S+)", out)
                if match is None or latency is None:
                    sys.exit(f"unexpected wrk output:\n{out}")
                rps, avg = float(match.group(1)), latency.group(1)
                print(f"{conns:>5} {batch:>5} {rps:>9,.0f} {rps * batch:>9,.0f} {avg:>12}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(Path(tmp))
