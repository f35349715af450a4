"""A many-topics stream (WebSocket GET /v1/namespaces/{ns}/subscriptions/{sub}/stream) through
a mesh of service processes: the stream on one discovery instance, topics created and
produced to through another; a topic created later is joined within 10 s (measured), and
after the dispatcher is killed with SIGKILL and another starts, the same stream goes on
with every topic (the consumers the dead one forgot are attached again)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from danube.up import ProcessSpec, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

JOIN_WITHIN_S = 10.0
RECOVER_WITHIN_S = 60.0


async def _put_topic(http: httpx.AsyncClient, topic: str) -> None:
    answer = await http.put(f"/v1/topics/default/{topic}", json={"partitions": 2})
    assert answer.status_code == 201, answer.text


async def _produce(http: httpx.AsyncClient, topic: str, payload: str) -> None:
    """Produce one message, retrying while the mesh answers 503 (an owner moving)."""
    async with asyncio.timeout(RECOVER_WITHIN_S):
        while True:
            body = {"messages": [{"payload": payload}]}
            answer = await http.post(f"/v1/topics/default/{topic}/messages", json=body)
            if answer.status_code == 200:
                return
            assert answer.status_code == 503, answer.text
            await asyncio.sleep(0.2)


async def _next_messages(
    ws: ClientConnection, count: int, within_s: float, errors: list[str]
) -> list[dict[str, Any]]:
    """The next ``count`` message frames; the codes of error frames on the way in ``errors``."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(within_s):
        while len(got) < count:
            frame = json.loads(await ws.recv())
            if frame["type"] == "error":
                errors.append(frame["error"]["code"])
            else:
                got.append(frame)
    return got


async def test_a_stream_joins_a_topic_created_elsewhere_and_outlives_a_dispatcher_crash(
    tmp_path: Path,
    spec_for: Callable[..., ProcessSpec],
    services: Callable[..., ServerProcess],
) -> None:
    # Started side by side (each waits for its own readiness).
    dispatcher = ServerProcess(spec_for("dispatcher", "dispatcher-0"), tmp_path / "d0.log")
    _, streamer, other, _ = await asyncio.gather(
        asyncio.to_thread(services, "ingest", "ingest-0"),
        asyncio.to_thread(services, "discovery", "discovery-0"),
        asyncio.to_thread(services, "discovery", "discovery-1"),
        asyncio.to_thread(dispatcher.start),
    )
    restarted: ServerProcess | None = None
    errors: list[str] = []
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{other.spec.port}", timeout=30
        ) as http:
            await _put_topic(http, "e2e-a")
            await _put_topic(http, "e2e-other")
            url = (
                f"ws://127.0.0.1:{streamer.spec.port}/v1/namespaces/default/subscriptions/s/"
                "stream?name=c&type=shared&start=earliest&topics_pattern=e2e-(?!other).*"
            )
            async with connect(url, proxy=None, close_timeout=2) as ws:
                await ws.send(json.dumps({"type": "flow", "credits": 1000}))
                await _produce(http, "e2e-a", "a1")
                await _produce(http, "e2e-other", "o1")
                (first,) = await _next_messages(ws, 1, JOIN_WITHIN_S, errors)
                assert (first["topic"], first["payload"]) == ("/default/e2e-a", "a1")

                created = time.monotonic()
                await _put_topic(http, "e2e-late")
                await _produce(http, "e2e-late", "l1")
                (late,) = await _next_messages(ws, 1, JOIN_WITHIN_S + 5, errors)
                joined_s = time.monotonic() - created
                assert (late["topic"], late["payload"]) == ("/default/e2e-late", "l1")
                assert joined_s < JOIN_WITHIN_S, joined_s
                refs = [{"partition": m["partition"], "offset": m["offset"]} for m in (first, late)]
                await ws.send(json.dumps({"type": "ack", "messages": refs}))

                dispatcher.kill()  # SIGKILL: it forgets every consumer
                restarted = ServerProcess(
                    spec_for("dispatcher", "dispatcher-1"), tmp_path / "d1.log"
                )
                crashed = time.monotonic()
                await asyncio.to_thread(restarted.start)
                await _produce(http, "e2e-a", "a2")
                await _produce(http, "e2e-late", "l2")
                # Acked before the crash (if the cursor was stored by then) or not: a1 and l1
                # may come again (at least once); a2 and l2 must come.
                wanted = {("/default/e2e-a", "a2"), ("/default/e2e-late", "l2")}
                seen: set[tuple[str, str]] = set()
                async with asyncio.timeout(RECOVER_WITHIN_S):
                    while not wanted <= seen:
                        (m,) = await _next_messages(ws, 1, RECOVER_WITHIN_S, errors)
                        seen.add((m["topic"], m["payload"]))
                recovered_s = time.monotonic() - crashed
                assert {t for t, _ in seen} <= {"/default/e2e-a", "/default/e2e-late"}
        print(
            f"\nmany-topics stream (processes): joined a later topic in {joined_s:.2f} s;"
            f" after a dispatcher SIGKILL both topics delivered again {recovered_s:.1f} s later"
            f" (error frames on the way: {sorted(set(errors))})"
        )
    finally:
        # Nothing here is about a clean stop (other tests cover it): SIGKILL, no 10 s wait.
        for process in (streamer, other, restarted, dispatcher):
            if process is not None:
                process.kill()
