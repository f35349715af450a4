"""Delayed delivery from each client (docs/policies.md, "Delayed delivery"): the SDK's
``deliver_after`` (binary records, keyed), the CLI's ``--deliver-after-ms``, a raw attribute;
a key-shared subscription gets each no earlier than its time while the messages not delayed
come at once, and an exclusive subscription of the same topic gets everything at once."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.client import DELIVER_AT_ATTRIBUTE, AsyncDanubeClient, deliver_after

pytestmark = pytest.mark.integration

TOPIC = "default/later"
DELAY_MS = 1500


async def _attach(http: httpx.AsyncClient, sub: str, kind: str) -> str:
    response = await http.post(
        f"/v1/topics/{TOPIC}/subscriptions/{sub}/consumers",
        json={"name": "c", "type": kind, "start": "earliest"},
    )
    assert response.status_code == 201, response.text
    consumer_id: str = response.json()["consumer_id"]
    return consumer_id


async def _take(http: httpx.AsyncClient, cid: str, count: int) -> list[tuple[int, dict[str, Any]]]:
    """``count`` messages as they arrive, each with its arrival (wall ms), acked."""
    got: list[tuple[int, dict[str, Any]]] = []
    deadline = time.monotonic() + 20
    while len(got) < count:
        assert time.monotonic() < deadline, str(sorted(m["payload"] for _, m in got))
        answer = await http.get(f"/v1/consumers/{cid}/messages", params={"wait_ms": 500})
        assert answer.status_code == 200, answer.text
        arrived = int(time.time() * 1000)
        batch = answer.json()["messages"]
        got += [(arrived, m) for m in batch]
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in batch]
        if refs:
            await http.post(f"/v1/consumers/{cid}/ack", json={"messages": refs})
    return got


async def test_every_client_delays_and_exclusive_delivers_at_once(
    consume_http: httpx.AsyncClient,
) -> None:
    http = consume_http
    assert (await http.put(f"/v1/topics/{TOPIC}")).status_code == 201
    keyed = await _attach(http, "keyed", "key_shared")
    whole = await _attach(http, "whole", "exclusive")
    url = str(http.base_url)
    sent_ms = int(time.time() * 1000)
    async with AsyncDanubeClient(url) as client, client.producer("/" + TOPIC) as producer:
        for i in range(20):
            await producer.send(f"sdk-{i}", key=f"k{i % 4}", attributes=deliver_after(DELAY_MS))
        await producer.send("raw", attributes={DELIVER_AT_ATTRIBUTE: str(sent_ms + DELAY_MS)})
        for i in range(5):
            await producer.send(f"now-{i}", key=f"k{i % 4}")
        await producer.flush()
    # Both subscriptions polled together from now on, while the CLI sends its message (its
    # start alone may take longer than the delay on a busy machine: the messages not
    # delayed are looked for from here, not after it).
    async with asyncio.TaskGroup() as tasks:
        keyed_taken = tasks.create_task(_take(http, keyed, 27))
        whole_taken = tasks.create_task(_take(http, whole, 27))
        cli = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "danube"), "produce", "-s", url, "-t", "/" + TOPIC,
            "-m", "cli", "--deliver-after-ms", str(DELAY_MS),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await cli.communicate()
        assert cli.returncode == 0, output
    got, whole_got = keyed_taken.result(), whole_taken.result()
    # Key-shared: the five not delayed at once; the 22 delayed no earlier than due.
    by_payload = {m["payload"]: (arrived, m) for arrived, m in got}
    assert len(by_payload) == 27
    for i in range(5):
        assert by_payload[f"now-{i}"][0] < sent_ms + DELAY_MS
    for name in [f"sdk-{i}" for i in range(20)] + ["raw", "cli"]:
        arrived, message = by_payload[name]
        # "raw" is due at the time it names (before its publish time + the delay).
        due = sent_ms + DELAY_MS if name == "raw" else message["publish_time_ms"] + DELAY_MS
        assert arrived >= due, f"{name} came {due - arrived} ms early"
        assert arrived < due + 1000, f"{name} came {arrived - due} ms late"
    # Exclusive: everything at once (before the delayed ones' time), in offset order.
    offsets = [m["offset"] for _, m in whole_got]
    assert offsets == sorted(offsets)
    for arrived, message in whole_got:
        assert arrived < message["publish_time_ms"] + DELAY_MS, message["payload"]
    listed = (await http.get(f"/v1/topics/{TOPIC}/subscriptions")).json()["subscriptions"]
    assert {s["name"]: s["delayed"] for s in listed} == {"keyed": 0, "whole": 0}
