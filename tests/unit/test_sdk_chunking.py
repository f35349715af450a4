"""Large messages without a server: the split, the chunk attributes, and the consumer's
reassembly under any loss, duplication and interleaving of producers (every message is
either given back byte-identical or given up, every record it came in is let go exactly
through one of the two, and the memory held never passes its cap)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client._chunk_sender import ChunkSender
from danube.client._chunking import (
    ChunkedMessage,
    GivenUp,
    Reassembler,
    chunk_attributes,
    new_uuid,
    split,
)
from danube.client.errors import InvalidArgumentError, InvalidMessageError
from danube.client.messages import MessageRef, ReceivedMessage, SendResult
from danube.client.producer import ProducerOptions
from danube.wire import chunks as wire

pytestmark = pytest.mark.unit


def test_split_joins_back_and_bounds_each_piece() -> None:
    payload = bytes(range(256)) * 41
    pieces = split(payload, 1000)
    assert [len(p) for p in pieces] == [1000] * 10 + [496]
    assert b"".join(pieces) == payload


def test_chunk_header_refuses_what_breaks_the_contract() -> None:
    good = chunk_attributes({"a": "1"}, new_uuid(), 1, 3, 10)
    assert wire.chunk_header(good).index == 1
    for name, value in [
        (wire.UUID_ATTRIBUTE, "XYZ"),
        (wire.INDEX_ATTRIBUTE, "3"),  # not below the count
        (wire.COUNT_ATTRIBUTE, "1"),  # one chunk is no chunking
        (wire.TOTAL_BYTES_ATTRIBUTE, "2"),  # fewer bytes than chunks
        (wire.TOTAL_BYTES_ATTRIBUTE, "-5"),
        (wire.INDEX_ATTRIBUTE, "12345678901"),
    ]:
        with pytest.raises(wire.BadChunkError):
            wire.chunk_header({**good, name: value})


@dataclass
class _Sent:
    uuid: str
    payload: bytes
    key: str | None


def _chunks(
    partition: str, producer: str, payload: bytes, chunk_bytes: int, key: str | None
) -> tuple[_Sent, list[ReceivedMessage]]:
    uuid = new_uuid()
    pieces = split(payload, chunk_bytes)
    records = [
        ReceivedMessage(
            partition=partition,
            offset=-1,  # given when the log is laid out
            payload=bytes(piece),
            key=key if key is not None else uuid,
            attributes=chunk_attributes({"app": "x"}, uuid, i, len(pieces), len(payload)),
            publish_time_ms=1,
            producer=producer,
            redelivery_count=0,
        )
        for i, piece in enumerate(pieces)
    ]
    return _Sent(uuid, payload, key), records


def _at(message: ReceivedMessage, offset: int, redelivery: int = 0) -> ReceivedMessage:
    return ReceivedMessage(
        message.partition,
        offset,
        message.payload,
        message.key,
        message.attributes,
        message.publish_time_ms,
        message.producer,
        redelivery,
    )


@st.composite
def _deliveries(
    draw: st.DrawFn,
) -> tuple[dict[str, _Sent], list[ReceivedMessage], set[str], dict[int, str]]:
    """Messages of a few producers in one partition, each producer's chunks in order (as an
    ordered producer stores them), the producers interleaved in any way; then chunks lost
    and chunks delivered again. Returns the messages by uuid, the deliveries, the uuids
    that lost a chunk, and the uuid of each offset."""
    producers = draw(st.integers(1, 3))
    streams: list[list[tuple[str, ReceivedMessage]]] = []
    sent: dict[str, _Sent] = {}
    for p in range(producers):
        stream = []
        for _ in range(draw(st.integers(1, 4))):
            size = draw(st.integers(2, 60))
            chunk_bytes = draw(st.integers(1, max(1, size - 1)))
            payload = draw(st.binary(min_size=size, max_size=size))
            key = draw(st.sampled_from([None, "k"]))
            message, records = _chunks("/d/t", f"p{p}", payload, chunk_bytes, key)
            sent[message.uuid] = message
            stream += [(message.uuid, r) for r in records]
        streams.append(stream)
    log: list[tuple[str, ReceivedMessage]] = []
    while any(streams):
        live = [s for s in streams if s]
        log.append(draw(st.sampled_from(live)).pop(0))
    laid = [(uuid, _at(r, offset)) for offset, (uuid, r) in enumerate(log)]
    lost = draw(st.sets(st.integers(0, len(laid) - 1), max_size=3))
    delivered = [r for i, (_, r) in enumerate(laid) if i not in lost]
    again = draw(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 10)), max_size=3))
    for index, later in again:  # a redelivery comes later than the first delivery
        if delivered:
            original = delivered[index % len(delivered)]
            at = min(len(delivered), index % len(delivered) + later)
            delivered.insert(at, _at(original, original.offset, redelivery=1))
    return sent, delivered, {laid[i][0] for i in lost}, {r.offset: u for u, r in laid}


def _run(
    reassembler: Reassembler, delivered: list[ReceivedMessage]
) -> tuple[list[ChunkedMessage], list[GivenUp]]:
    whole: list[ChunkedMessage] = []
    given_up: list[GivenUp] = []
    for now_s, message in enumerate(delivered):
        done, let_go = reassembler.offer(message, float(now_s))
        reassembler.validate()
        given_up += let_go
        if done is not None:
            whole.append(done)
    given_up += reassembler.expire(float("inf"))  # what is partial at the end expires
    reassembler.validate()
    assert len(reassembler) == 0
    assert reassembler.held_bytes == 0
    return whole, given_up


@settings(max_examples=300, deadline=None)
@given(_deliveries(), st.integers(10, 400), st.integers(1, 4))
def test_every_message_is_whole_and_identical_or_given_up(
    case: tuple[dict[str, _Sent], list[ReceivedMessage], set[str], dict[int, str]],
    bytes_max: int,
    partials_max: int,
) -> None:
    sent, delivered, lost, uuid_at = case
    reassembler = Reassembler(bytes_max=bytes_max, partials_max=partials_max, expiry_s=1e9)
    whole, given_up = _run(reassembler, delivered)
    for message in whole:
        uuid = uuid_at[message.offset]  # the first chunk's offset
        original = sent[uuid]
        assert message.payload == original.payload  # byte-identical, never a mix
        assert message.key == original.key
        assert message.attributes == {"app": "x"}
        assert uuid not in lost  # a message that lost a chunk is never whole
    # Every delivered record is let go through exactly one path: acked with its whole
    # message, or in a give-up (a record delivered twice may be in both once each).
    released: dict[MessageRef, int] = defaultdict(int)
    for message in whole:
        for ref in message.chunks:
            released[ref] += 1
    for item in given_up:
        for ref in item.refs:
            released[ref] += 1
    for record in delivered:
        assert released[record.ref] >= 1, record.ref
    # With room for every message, nothing that lost no chunk is given up.
    if bytes_max >= 60 * 12 and partials_max >= 4:
        done = {uuid_at[m.offset] for m in whole}
        assert done | lost >= set(sent)


def test_missing_chunk_is_given_up_when_the_producer_moves_on() -> None:
    first, records = _chunks("/d/t", "p", b"a" * 10, 3, None)
    _, later = _chunks("/d/t", "p", b"b" * 10, 3, None)
    log = [_at(r, i) for i, r in enumerate(records + later)]
    del log[2]  # chunk 2 of the first message never stored
    reassembler = Reassembler(bytes_max=100, partials_max=4, expiry_s=60)
    whole, given_up = _run(reassembler, log)
    assert [m.payload for m in whole] == [b"b" * 10]
    assert [(g.reason, g.uuid, g.received, g.count) for g in given_up] == [
        ("missing_chunk", first.uuid, 3, 4)
    ]
    assert "3 of 4 chunks received" in given_up[0].error().message
    assert whole[0].key is None
    assert whole[0].offset == 4


def test_expired_partial_and_memory_cap() -> None:
    reassembler = Reassembler(bytes_max=25, partials_max=4, expiry_s=5)
    _, a = _chunks("/d/t", "p1", b"a" * 10, 4, "k")
    _, b = _chunks("/d/t", "p2", b"b" * 20, 4, "k")
    assert reassembler.offer(_at(a[0], 0), 0.0) == (None, [])
    done, given_up = reassembler.offer(_at(b[0], 1), 1.0)  # 10 + 20 > 25: a is evicted
    assert done is None
    assert [g.reason for g in given_up] == ["evicted"]
    assert reassembler.held_bytes == 20
    done, given_up = reassembler.offer(_at(b[1], 2), 7.0)  # b's first chunk 6 s ago
    # b expires, then the chunk that came is let go at once (counted once: first=False).
    assert done is None
    assert [(g.reason, g.first, len(g.refs)) for g in given_up] == [
        ("expired", True, 1),
        ("expired", False, 1),
    ]
    assert reassembler.held_bytes == 0
    too_big = Reassembler(bytes_max=5, partials_max=4, expiry_s=5)
    assert [g.reason for g in too_big.offer(_at(a[0], 0), 0.0)[1]] == ["too_large"]


def test_chunks_that_disagree_are_corrupt() -> None:
    _, a = _chunks("/d/t", "p", b"a" * 10, 4, "k")
    liar = ReceivedMessage(
        "/d/t",
        1,
        a[1].payload,
        "k",
        {**a[1].attributes, wire.TOTAL_BYTES_ATTRIBUTE: "11"},
        1,
        "p",
        0,
    )
    reassembler = Reassembler(bytes_max=100, partials_max=4, expiry_s=5)
    reassembler.offer(_at(a[0], 0), 0.0)
    done, given_up = reassembler.offer(liar, 0.0)
    assert done is None
    assert [(g.reason, len(g.refs)) for g in given_up] == [("corrupt", 2)]
    # A chunk larger than its message claims is not held past what was reserved.
    _, b = _chunks("/d/t", "p", b"b" * 10, 4, "k")
    fat = ReceivedMessage("/d/t", 6, b"b" * 50, "k", b[1].attributes, 1, "p", 0)
    reassembler.offer(_at(b[0], 5), 0.0)
    done, given_up = reassembler.offer(fat, 0.0)
    assert done is None
    assert [(g.reason, len(g.refs)) for g in given_up] == [("corrupt", 2)]
    reassembler.validate()


def test_chunk_sender_queues_in_order_under_one_key_and_checks_first() -> None:
    async def main() -> None:
        queued: list[tuple[bytes, str | None, dict[str, str]]] = []

        async def send_one(
            payload: bytes, *, key: str | None, attributes: dict[str, str]
        ) -> asyncio.Future[SendResult]:
            queued.append((payload, key, attributes))
            future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
            future.set_result(SendResult("/d/t", len(queued) - 1))
            return future

        sender = ChunkSender(send_one, chunk_bytes=4, total_bytes_max=20)
        assert not sender.wants(b"1234")
        assert sender.wants(b"12345")
        assert not sender.wants("é")
        result = await (await sender.send(b"0123456789", None, {"a": "1"}))
        assert result == SendResult("/d/t", 0)
        assert [p for p, _, _ in queued] == [b"0123", b"4567", b"89"]
        uuids = {a[wire.UUID_ATTRIBUTE] for _, _, a in queued}
        assert len(uuids) == 1
        assert {k for _, k, _ in queued} == uuids
        with pytest.raises(InvalidMessageError, match="max_chunked_message_bytes"):
            await sender.send(b"x" * 21, "k", None)
        with pytest.raises(InvalidMessageError, match="chunking"):
            await sender.send(b"x" * 10, "k", {wire.UUID_ATTRIBUTE: "0" * 32})
        assert len(queued) == 3  # nothing queued for the refused ones

    asyncio.run(main())


def test_unordered_producer_cannot_chunk() -> None:
    with pytest.raises(InvalidArgumentError, match="ordered"):
        ProducerOptions(chunking=True, idempotent=False, max_inflight_batches=4)
    ProducerOptions(chunking=True, max_inflight_batches=4)  # sequenced: ordered


def test_a_message_given_up_then_delivered_again_from_its_start_completes() -> None:
    # chunk_give_up="nack": the records of a message given up come again, in log order.
    _, a = _chunks("/d/t", "p", b"a" * 9, 3, "k")
    reassembler = Reassembler(bytes_max=100, partials_max=4, expiry_s=5)
    reassembler.offer(_at(a[0], 0), 0.0)
    assert [g.reason for g in reassembler.expire(10.0)] == ["expired"]
    assert [(g.reason, g.first) for g in reassembler.offer(_at(a[1], 1), 10.0)[1]] == [
        ("expired", False)  # its later chunk, let go at once
    ]
    got = [reassembler.offer(_at(r, i, redelivery=1), 11.0)[0] for i, r in enumerate(a)]
    assert got[:2] == [None, None]
    assert got[2] is not None
    assert got[2].payload == b"a" * 9
    assert got[2].redelivery_count == 1
