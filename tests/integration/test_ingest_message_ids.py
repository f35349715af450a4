"""Message id windows on a real ingest node (NATS, etcd, the WAL): a repeated
``danube.message_id`` within the window is answered with the first one's offset and not
stored again, in a request of repeats, of repeats and new ones mixed, and of one id twice;
without the window, or without ids, nothing is deduplicated; a restarted node reads the ids
back from its log."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from danube.bus import Bus, TopicName
from danube.config import (
    BusConfig,
    DanubeSettings,
    IngestConfig,
    MetadataConfig,
    WalCloudConfig,
    WalConfig,
)
from danube.frame import Record, decode_record, encode_record
from danube.up import free_port
from danube.wire.ingest import protocol
from danube.wire.ingest.client import IngestClient
from danube.wire.limits import PartitionLimits
from tests.integration.test_ingest import running_node

pytestmark = pytest.mark.integration

P = TopicName("default", "ids-part-0")
WINDOW = PartitionLimits(message_id_window_s=60)


@pytest.fixture
def settings(nats_url: str, etcd_endpoint: str, meta_prefix: str, tmp_path: Path) -> DanubeSettings:
    return DanubeSettings(
        bus=BusConfig(servers=[nats_url]),
        wal_cloud=WalCloudConfig(
            wal=WalConfig(dir=tmp_path / "wal"),
            metadata=MetadataConfig(etcd_endpoint=etcd_endpoint, prefix=meta_prefix),
        ),
        ingest=IngestConfig(lease_ttl_s=3, metrics_port=free_port()),
    )


def with_ids(*ids: str | None) -> bytes:
    records = []
    for index, msg_id in enumerate(ids):
        attributes = {} if msg_id is None else {protocol.MESSAGE_ID_ATTRIBUTE: msg_id}
        records.append(
            encode_record(
                Record(
                    payload=f"{msg_id}/{index}".encode(),
                    publish_time_ms=int(time.time() * 1000),
                    producer="curl",
                    attributes=attributes,
                )
            )
        )
    return protocol.encode_produce_request(records)


def places(reply: protocol.ProduceReply) -> list[tuple[int, bool]]:
    return [(reply.offset(i), reply.duplicate_at(i)) for i in range(reply.messages)]


async def stored(client: IngestClient) -> list[str]:
    reply = await client.fetch(P, 0, max_count=1000)
    return [decode_record(frame.payload).payload.decode() for frame in reply.frames]


async def test_repeats_within_the_window_are_answered_with_the_first_offsets(
    bus: Bus, settings: DanubeSettings
) -> None:
    client = IngestClient(bus)
    async with running_node(settings, "node-a"):

        async def produce(body: bytes) -> protocol.ProduceReply:
            return await client.produce_answer(P, body, timeout_s=20, limits=WINDOW)

        first = await produce(with_ids("a", "b"))
        assert places(first) == [(0, False), (1, False)]
        again = await produce(with_ids("a", "b"))
        assert again.duplicate
        assert places(again) == [(0, True), (1, True)]
        mixed = await produce(with_ids("c", "a", None, "c"))
        assert places(mixed) == [(2, False), (0, True), (3, False), (2, True)]
        assert not mixed.duplicate
        # No window (a topic without the policy): ids are carried, not checked.
        plain = await client.produce_answer(P, with_ids("a"), timeout_s=20)
        assert places(plain) == [(4, False)]
        assert await stored(client) == ["a/0", "b/1", "c/0", "None/2", "a/0"]
    # A restarted node reads the ids back from its log before answering.
    async with running_node(settings, "node-a"):
        restarted = await client.produce_answer(P, with_ids("b", "d"), timeout_s=30, limits=WINDOW)
        assert places(restarted) == [(1, True), (5, False)]
        assert len(await stored(client)) == 6
