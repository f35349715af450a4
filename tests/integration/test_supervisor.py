"""The supervisor: start order, restart with backoff, labelled output, and a clean stop."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from danube.up import ProcessSpec, ServerError, free_port
from danube.up.supervisor import RestartPolicy, Supervisor

pytestmark = pytest.mark.integration


def _python(name: str, code: str, **kwargs: object) -> ProcessSpec:
    argv = [sys.executable, "-u", "-c", textwrap.dedent(code)]
    return ProcessSpec(name, argv, **kwargs)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll: the state lives in other processes, so there is no event to await."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_starts_in_order_restarts_and_stops_everything() -> None:
    port = free_port()
    server = _python(
        "web",
        f"""
        import http.server, time
        time.sleep(0.5)  # not ready at once: the next process must wait for it
        http.server.HTTPServer(("127.0.0.1", {port}), http.server.SimpleHTTPRequestHandler
                               ).serve_forever()
        """,
        ready_url=f"http://127.0.0.1:{port}/",
    )
    client = _python(
        "client",
        f"""
        import socket, time
        socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
        print("connected to web")
        time.sleep(0.2)
        raise SystemExit(3)
        """,
    )
    lines: list[tuple[str, str]] = []
    policy = RestartPolicy(initial_backoff_s=0.05, max_backoff_s=0.2)
    supervisor = Supervisor([server, client], sink=lambda n, t: lines.append((n, t)), policy=policy)
    stop = asyncio.Event()
    running = asyncio.create_task(supervisor.run(stop))
    await _until(lambda: supervisor.restarts()["client"] >= 2)
    pids = supervisor.pids()
    assert "web" in pids
    stop.set()
    await asyncio.wait_for(running, 20)

    assert ("client", "connected to web") in lines  # started only once web answered
    assert sum(1 for line in lines if line == ("client", "connected to web")) >= 2
    assert supervisor.restarts()["web"] == 0
    assert not any(_alive(pid) for pid in pids.values())


async def test_a_child_ignoring_sigterm_is_killed_after_its_stop_timeout() -> None:
    stubborn = _python(
        "stubborn",
        """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("up")
        time.sleep(60)
        """,
        stop_timeout_s=0.5,
    )
    lines: list[tuple[str, str]] = []
    supervisor = Supervisor([stubborn], sink=lambda n, t: lines.append((n, t)))
    stop = asyncio.Event()
    running = asyncio.create_task(supervisor.run(stop))
    await _until(lambda: ("stubborn", "up") in lines)
    pid = supervisor.pids()["stubborn"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    stop.set()
    await asyncio.wait_for(running, 10)
    assert 0.4 <= loop.time() - started < 5
    assert not _alive(pid)


async def test_a_child_that_never_gets_ready_fails_the_run_and_is_stopped() -> None:
    never = _python(
        "never",
        "import time; time.sleep(60)",
        ready_url=f"http://127.0.0.1:{free_port()}/",
        ready_timeout_s=0.5,
    )
    supervisor = Supervisor([never], sink=lambda n, t: None)
    with pytest.raises(ServerError, match="did not become ready"):
        await asyncio.wait_for(supervisor.run(asyncio.Event()), 15)
    assert supervisor.pids() == {}


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    """Even SIGKILL of the supervisor leaves no child behind (PDEATHSIG)."""
    import signal
    import subprocess
    import time

    script = tmp_path / "sup.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, sys
            from danube.up import ProcessSpec
            from danube.up.supervisor import Supervisor
            child = ProcessSpec("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
            async def main():
                sup = Supervisor([child], sink=lambda n, t: None)
                task = asyncio.create_task(sup.run(asyncio.Event()))
                await sup.ready.wait()
                open({str(tmp_path / "pid")!r}, "w").write(str(sup.pids()["sleeper"]))
                await task
            asyncio.run(main())
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)])
    pid_file = tmp_path / "pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "supervisor never started its child"
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    assert _alive(child_pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while _alive(child_pid):
        assert time.monotonic() < deadline, "child outlived its killed supervisor"
        time.sleep(0.05)
