"""A mesh for benchmarks: nats-server and etcd from the venv plus service processes
(`python -m danube.<service>`), on free ports in a temporary directory."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from danube.up import ServerProcess, etcd_spec, free_port, nats_spec
from danube.up.servers import die_with_parent

READY_TIMEOUT_S = 30.0


def _start(service: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"danube.{service}"],
            env=env,
            stdout=out,
            stderr=out,
            preexec_fn=die_with_parent,  # a bench killed by a signal leaves no service behind
        )


async def until_ready(http: httpx.AsyncClient) -> None:
    """Wait for discovery's /readyz."""
    async with asyncio.timeout(READY_TIMEOUT_S):
        while True:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)


@asynccontextmanager
async def bench_mesh(
    tmp: Path,
    services: Sequence[str],
    env: dict[str, str] | None = None,
    *,
    etcd_port: int | None = None,
    tls: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
    pids: dict[str, int] | None = None,
) -> AsyncIterator[httpx.AsyncClient]:
    """Start ``services`` (discovery among them) and yield an HTTP client of discovery,
    ready; everything is stopped on exit. Logs go to ``tmp/<service>.log``. ``etcd_port``:
    where etcd listens (for a benchmark that reads metadata itself); a free port if None.
    ``tls``: discovery serves HTTPS (its certificates in ``env``), trusted by this context;
    ``headers``: sent with every request (a bearer token); ``pids``: filled with the process
    id of nats, etcd and each service by node id (for a benchmark that reads their CPU)."""
    await asyncio.to_thread(tmp.mkdir, parents=True, exist_ok=True)
    nats = ServerProcess(nats_spec(port=free_port(), monitor_port=free_port()), tmp / "nats.log")
    etcd = ServerProcess(
        etcd_spec(
            data_dir=tmp / "etcd", client_port=etcd_port or free_port(), peer_port=free_port()
        ),
        tmp / "etcd.log",
    )
    with nats, etcd:
        port = free_port()
        base = {
            **os.environ,
            "DANUBE_BUS__SERVERS": json.dumps([f"nats://127.0.0.1:{nats.spec.port}"]),
            "DANUBE_WAL_CLOUD__METADATA__ETCD_ENDPOINT": f"127.0.0.1:{etcd.spec.port}",
            "DANUBE_WAL_CLOUD__WAL__DIR": str(tmp / "wal"),
            "DANUBE_DISCOVERY__PORT": str(port),
            "DANUBE_DISCOVERY__GRPC_PORT": str(free_port()),
            **(env or {}),
        }
        processes = []
        seen: dict[str, int] = {}
        for service in services:
            # A service listed twice runs twice: bench-ingest, bench-ingest-1, ... each with
            # its own WAL directory.
            index = seen[service] = seen.get(service, -1) + 1
            node_id = f"bench-{service}" if index == 0 else f"bench-{service}-{index}"
            own = {"DANUBE_NODE_ID": node_id}
            if service == "ingest" and index > 0:
                # Beside the first node's directory, not inside it.
                own["DANUBE_WAL_CLOUD__WAL__DIR"] = str(tmp / f"wal-{node_id}")
            if service != "discovery":
                own[f"DANUBE_{service.upper()}__METRICS_PORT"] = str(free_port())
            processes.append(_start(service, {**base, **own}, tmp / f"{service}.log"))
            if pids is not None:
                pids[node_id] = processes[-1].pid
        if pids is not None:
            pids.update({"nats": nats.pid or 0, "etcd": etcd.pid or 0})
        try:
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            async with httpx.AsyncClient(
                base_url=f"{'https' if tls else 'http'}://127.0.0.1:{port}",
                timeout=30,
                limits=limits,
                verify=tls if tls is not None else True,
                headers=headers,
            ) as http:
                await until_ready(http)
                yield http
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()


DANUBE = str(Path(sys.executable).parent / "danube")


async def bench_produce(
    url: str,
    args: list[str],
    *,
    duration_s: float | None = None,
    cli: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, object]:
    """``danube [cli...] bench produce -s url`` with 1 KiB messages and ``args`` (for
    ``duration_s`` when given; else ``args`` say how many); its JSON result. ``env``: added
    to the command's environment (``PYTHONPATH`` of another checkout: its client)."""
    command = [DANUBE, *(cli or []), "bench", "produce", "-s", url, "--size", "1024"]
    length = [] if duration_s is None else ["-d", str(duration_s)]
    out = await asyncio.to_thread(
        subprocess.run,
        [*command, *length, "--json", *args],
        capture_output=True,
        check=False,
        text=True,
        env=None if env is None else {**os.environ, **env},
    )
    if out.returncode != 0:
        raise SystemExit(f"danube bench failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, object] = json.loads(out.stdout)
    return result
