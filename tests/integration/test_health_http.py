"""The health/metrics endpoint: /healthz, /readyz following the check, /metrics text; a
free port found and probed through the health file."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from danube.runtime import healthcheck
from danube.runtime.http import HealthServer
from danube.up import free_port

pytestmark = pytest.mark.integration


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_health_ready_and_metrics() -> None:
    port = free_port()
    ready = False
    server = HealthServer("127.0.0.1", port, lambda: ready)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):
        while not server.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
            await asyncio.sleep(0.01)
    base = f"http://127.0.0.1:{port}"
    assert await asyncio.to_thread(_get, f"{base}/healthz") == (200, '{"status":"ok"}')
    assert (await asyncio.to_thread(_get, f"{base}/readyz"))[0] == 503
    ready = True
    assert (await asyncio.to_thread(_get, f"{base}/readyz"))[0] == 200
    status, text = await asyncio.to_thread(_get, f"{base}/metrics")
    assert status == 200
    assert "python_info" in text  # the default registry's process collectors
    server.stop()
    await asyncio.wait_for(task, 5)


async def test_any_free_port_is_found_and_the_healthcheck_probes_it(tmp_path: Path) -> None:
    ready = False
    server = HealthServer("127.0.0.1", 0, lambda: ready)
    task = asyncio.create_task(server.serve())
    await server.wait_started(task, 10)
    assert server.port > 0
    path = healthcheck.write_health_file(
        "ingest-0", healthcheck.probe_url("127.0.0.1", server.port), path=tmp_path / "h.json"
    )
    assert path is not None
    command = ["--file", str(path), "--timeout-s", "2"]
    assert await asyncio.to_thread(healthcheck.main, command) == 1  # not ready: 503
    ready = True
    assert await asyncio.to_thread(healthcheck.main, command) == 0
    server.stop()
    await asyncio.wait_for(task, 5)
    assert await asyncio.to_thread(healthcheck.main, command) == 1  # nobody listens
