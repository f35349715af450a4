"""run_in_process: a service that stops returns its outcome; one whose stop hangs is ended
after IN_PROCESS_STOP_S and the block fails naming where it waited."""

from __future__ import annotations

import asyncio

import pytest

from danube.config import DanubeSettings
from danube.runtime import service

pytestmark = pytest.mark.unit


async def _stops(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    await stop.wait()


async def _fails(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    await stop.wait()
    raise RuntimeError("broken on the way out")


async def _never_stops(settings: DanubeSettings, node_id: str, stop: asyncio.Event) -> None:
    await stop.wait()
    await _stuck_in_close()


async def _stuck_in_close() -> None:
    await asyncio.Event().wait()


async def test_a_clean_stop_returns_and_a_failed_one_is_raised_when_asked() -> None:
    settings = DanubeSettings()
    async with service.run_in_process(_stops, settings, "a", must_stop_cleanly=True):
        pass
    with pytest.raises(RuntimeError, match="broken on the way out"):
        async with service.run_in_process(_fails, settings, "b", must_stop_cleanly=True):
            pass
    async with service.run_in_process(_fails, settings, "c"):  # not asked: swallowed
        pass


async def test_a_hung_stop_is_cancelled_and_names_where_it_waited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "IN_PROCESS_STOP_S", 0.2)
    with pytest.raises(TimeoutError) as hung:
        async with service.run_in_process(_never_stops, DanubeSettings(), "d") as task:
            pass
    assert "d did not stop within 0 s" in str(hung.value)
    assert "serve-d: _never_stops" in str(hung.value)
    assert "_stuck_in_close" in str(hung.value)
    assert task.cancelled()
