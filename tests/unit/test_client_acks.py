"""The SDK's ack batcher: batches go as ranges of consecutive offsets, several batches are
under way at once (the next does not wait for the answer to the one before), a flush waits
for every one of them, and the dispatcher's bus body carries ranges that expand to the
same refs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from danube.client._acks import INFLIGHT_MAX, AckBatcher, ranges_of
from danube.wire.dispatcher import protocol

pytestmark = pytest.mark.unit


class HeldHttp:
    """Answers every request only when released; records the bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.under_way = 0
        self.most_under_way = 0
        self.release = asyncio.Event()

    async def request_retrying(self, method: str, path: str, **options: Any) -> None:
        # Through the lean client (a fraction of httpx's CPU per request), as produce does.
        assert options.get("lean") is True, "acks go through the lean client"
        self.bodies.append(options["body"])
        self.under_way += 1
        self.most_under_way = max(self.most_under_way, self.under_way)
        try:
            await self.release.wait()
        finally:
            self.under_way -= 1


class FakeSession:
    reattach_enabled = False
    consumer_id = "c1"

    async def reattach(self, stale_id: str) -> None:
        raise AssertionError("not expected")


def test_ranges_of_joins_consecutive_offsets_of_one_partition_in_order() -> None:
    refs = [("/ns/t-part-0", o) for o in (4, 5, 6, 9)]
    refs += [("/ns/t-part-1", 7), ("/ns/t-part-0", 10)]
    assert ranges_of(refs) == [
        {"partition": "/ns/t-part-0", "first": 4, "last": 6},
        {"partition": "/ns/t-part-0", "first": 9, "last": 9},
        {"partition": "/ns/t-part-1", "first": 7, "last": 7},
        {"partition": "/ns/t-part-0", "first": 10, "last": 10},
    ]


def test_the_bus_body_carries_ranges_that_expand_to_the_same_refs() -> None:
    refs = [("t-part-0", 1), ("t-part-0", 2), ("t-part-1", 2), ("t-part-0", 3), ("t-part-0", 5)]
    ranges = protocol.ref_ranges(refs)
    assert ranges == [
        ("t-part-0", 1, 2),
        ("t-part-1", 2, 2),
        ("t-part-0", 3, 3),
        ("t-part-0", 5, 5),
    ]
    body = protocol.AckRequest(consumer_id="c", ranges=ranges)
    assert body.refs() == refs
    assert body.count() == len(refs)
    with pytest.raises(protocol.BadRequestError):
        protocol.AckRequest(consumer_id="c", ranges=[("t", 5, 4)]).refs()
    with pytest.raises(protocol.BadRequestError):
        protocol.AckRequest(consumer_id="c", ranges=[("t", 0, protocol.REFS_MAX)]).refs()


async def test_batches_go_on_while_earlier_ones_wait_for_their_answer() -> None:
    http = HeldHttp()
    batcher = AckBatcher(
        http,  # type: ignore[arg-type]
        FakeSession(),
        interval_s=0.001,
        batch_max=10,
        timeout_s=5.0,
    )
    task = asyncio.create_task(batcher.run())
    try:
        for batch in range(INFLIGHT_MAX + 2):
            for offset in range(batch * 10, batch * 10 + 10):
                batcher.ack("/ns/t", offset)
            await asyncio.sleep(0.01)
        # INFLIGHT_MAX requests under way, none answered; the rest wait for a slot.
        assert http.under_way == http.most_under_way == INFLIGHT_MAX
        flushed = asyncio.create_task(batcher.flush())
        await asyncio.sleep(0.01)
        assert not flushed.done()  # a flush waits for every answer
        http.release.set()
        async with asyncio.timeout(2):
            await flushed
        assert http.most_under_way == INFLIGHT_MAX
        sent = [r for body in http.bodies for r in body["ranges"]]
        assert sent == [
            {"partition": "/ns/t", "first": b * 10, "last": b * 10 + 9}
            for b in range(INFLIGHT_MAX + 2)
        ]
        assert batcher.acked == (INFLIGHT_MAX + 2) * 10
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
