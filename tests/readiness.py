"""Waiting for an in-process discovery instance to answer ``/readyz``."""

from __future__ import annotations

import asyncio

import httpx

READY_TIMEOUT_S = 20.0


async def until_ready(http: httpx.AsyncClient, task: asyncio.Task[None]) -> None:
    """Return once ``/readyz`` answers 200; raise what stopped ``task`` (the service) if it
    ends first, TimeoutError after :data:`READY_TIMEOUT_S`."""
    async with asyncio.timeout(READY_TIMEOUT_S):
        while True:
            if task.done():
                task.result()  # raises what made it stop
                raise AssertionError("discovery stopped before it was ready")
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.05)
