"""File-system calls made on behalf of async code run in a worker thread, never on the event
loop's (a slow or hung disk would stall every request of the process)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from danube.config import DanubeSettings
from danube.discovery import app as discovery_app
from danube.ingest.node import Node
from danube.meta import TopicName

pytestmark = pytest.mark.unit


class _Lease:
    alive = True  # read by the node's leaseless gauge, which outlives the test

    def on_lost(self, callback: Any) -> None:
        return None


class _Bus:
    async def reconnect_stale(self) -> None:  # the node's bus watch holds it; never called
        return None


async def test_deleting_a_partitions_wal_checks_the_disk_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = Node(
        DanubeSettings(),
        node_id="i1",
        bus=_Bus(),  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        lease=_Lease(),  # type: ignore[arg-type]
    )
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []

    def exists(self: Path, **_: Any) -> bool:
        threads.append(threading.current_thread())
        return False

    monkeypatch.setattr(Path, "exists", exists)
    assert await node.delete_local(TopicName("ns", "t")) is False
    assert threads
    assert loop_thread not in threads


async def test_discovery_writes_its_health_file_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []

    async def started(*_: Any) -> None:
        return None

    def write_health_file(node_id: str, url: str) -> None:
        threads.append(threading.current_thread())

    monkeypatch.setattr(discovery_app, "wait_started", started)
    monkeypatch.setattr(discovery_app, "bound_port", lambda server: 8080)
    monkeypatch.setattr(discovery_app, "write_health_file", write_health_file)
    await discovery_app._announce_health(None, None, "d1", "127.0.0.1")  # type: ignore[arg-type]
    assert threads
    assert loop_thread not in threads
