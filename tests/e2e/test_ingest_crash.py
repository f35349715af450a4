"""Ingest under SIGKILL: rounds of kill -9 (5 in `make test`, 20 in `make bench`) while a
producer runs; nothing acked is lost, no offset repeats, and producing continues after the last
offset."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from danube.bus import Bus, TopicName
from danube.config import BusConfig
from danube.frame import Record, decode_record, encode_record
from danube.up import ProcessSpec, ServerProcess
from danube.wire.ingest.client import IngestClient

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PARTITION = TopicName("default", "crash-part-0")


async def _producer(
    client: IngestClient, acked: dict[int, bytes], stop: asyncio.Event, sent: list[int]
) -> None:
    """Send numbered messages one batch at a time; record (offset -> payload) once acked."""
    number = 0
    while not stop.is_set():
        payloads = [f"message-{number + i}".encode() for i in range(random.randint(1, 20))]
        records = [
            encode_record(Record(payload=p, publish_time_ms=1, producer="crash")) for p in payloads
        ]
        try:
            first = await client.produce(PARTITION, records, timeout_s=1.0)
        except Exception:  # ingest is down or restarting: try the same batch again
            continue
        for index, payload in enumerate(payloads):
            assert first + index not in acked, f"offset {first + index} acknowledged twice"
            acked[first + index] = payload
        number += len(payloads)
        sent.append(number)


async def _read_all(client: IngestClient) -> list[tuple[int, bytes]]:
    messages: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        reply = await client.fetch(PARTITION, offset, max_count=5000)
        assert not reply.below_wal_start
        for frame in reply.frames:
            messages.append((frame.offset, decode_record(frame.payload).payload))
        if reply.next_offset == offset:
            return messages
        offset = reply.next_offset


@pytest.mark.parametrize("rounds", [pytest.param(20, marks=pytest.mark.soak), 5])
async def test_sigkill_rounds_lose_nothing_acknowledged(
    rounds: int, tmp_path: Path, nats_url: str, spec_for: Callable[..., ProcessSpec]
) -> None:
    bus = await Bus.connect(BusConfig(servers=[nats_url]), name="crash-test")
    client = IngestClient(bus)
    acked: dict[int, bytes] = {}
    sent: list[int] = []
    stop = asyncio.Event()
    producer = asyncio.create_task(_producer(client, acked, stop, sent))
    try:
        for round_ in range(rounds):
            # The same node (its data directory) on a fresh port each time: the killed
            # one's port may be taken by now.
            spec = spec_for("ingest", "ingest-crash-0")
            ingest = ServerProcess(spec, tmp_path / f"ingest-{round_}.log")
            await asyncio.to_thread(ingest.start)
            before = len(acked)
            async with asyncio.timeout(30):  # the producer makes progress on every incarnation
                while len(acked) == before:  # noqa: ASYNC110 - polled, the producer owns it
                    await asyncio.sleep(0.01)
            await asyncio.sleep(random.uniform(0.05, 0.6))
            assert ingest.pid is not None
            os.kill(ingest.pid, 9)
            await asyncio.to_thread(ingest.kill)  # reap it
        stop.set()
        await producer

        ingest = ServerProcess(spec_for("ingest", "ingest-crash-0"), tmp_path / "ingest-final.log")
        await asyncio.to_thread(ingest.start)
        try:
            # Producing continues after the last acknowledged offset. (This also waits for
            # the restarted node to lead again: ready means serving, not yet leading.)
            record = encode_record(Record(payload=b"after", publish_time_ms=1, producer="crash"))
            after = await client.produce(PARTITION, [record], timeout_s=10)
            assert after > max(acked)
            stored = await _read_all(client)
            offsets = [offset for offset, _ in stored]
            assert offsets == sorted(set(offsets)), "offsets repeat or go backwards"
            by_offset = dict(stored)
            missing = [o for o in acked if o not in by_offset]
            assert missing == [], f"acknowledged offsets lost: {missing[:10]}"
            wrong = [o for o, p in acked.items() if by_offset[o] != p]
            assert wrong == [], f"acknowledged offsets with other payloads: {wrong[:10]}"
            assert max(offsets) == after
            assert by_offset[after] == b"after"
        finally:
            ingest.stop()
    finally:
        stop.set()
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        await bus.close()
    assert len(acked) > rounds  # every round acknowledged something
