"""The SDK's decoding of a delivery batch: every field of every message in order, a damaged
frame (CRC) or a garbled record left out and handed back (nacked) while the others go on,
a batch whose layout is off refused whole with nothing handed back; and the stream's
credits, granted once half the receive queue is free, none lost while a grant is sent."""

from __future__ import annotations

import asyncio
import struct

import orjson
import pytest

from danube.client._frames import decode_frames_batch
from danube.client._inbox import Inbox
from danube.client._sources import StreamSource
from danube.client.errors import ProtocolError
from danube.client.messages import MessageRef, ReceivedMessage, received_message
from danube.frame import Record, encode_frame, encode_record
from danube.wire.delivery import DeliveredMessage, encode_batch

pytestmark = pytest.mark.unit


class Taker:
    """A consumer that records what it is handed back."""

    def __init__(self) -> None:
        self.corrupt_refs: list[MessageRef] = []
        self.acked: list[ReceivedMessage] = []

    def corrupt(self, ref: MessageRef) -> None:
        self.corrupt_refs.append(ref)

    def ack(self, message: ReceivedMessage) -> None:
        self.acked.append(message)

    def nack(self, message: ReceivedMessage, delay_ms: int = 0) -> None:
        raise AssertionError("not nacked here")


RECORDS = [
    Record(payload=b"a" * 1024, publish_time_ms=1, producer="p-1"),
    Record(
        payload=b"\x00\xffbin",
        publish_time_ms=2**63,
        producer="p\u00e9",
        key="k-1",
        attributes={"a": "1", "\u00fc": ""},
        schema_id=3,
        schema_version=4,
    ),
    Record(payload=b"", publish_time_ms=3, producer="p-1", key=""),
]


def delivered() -> list[DeliveredMessage]:
    """Three messages of two partitions, one a redelivery."""
    where = [("/ns/t-part-0", 10, 0), ("/ns/t-part-1", 4, 2), ("/ns/t-part-0", 11, 0)]
    return [
        DeliveredMessage(partition, offset, count, encode_frame(offset, encode_record(record)))
        for (partition, offset, count), record in zip(where, RECORDS, strict=True)
    ]


def expected(message: DeliveredMessage, record: Record, taker: Taker) -> ReceivedMessage:
    return ReceivedMessage(
        partition=message.partition,
        offset=message.offset,
        payload=record.payload,
        key=record.key,
        attributes=dict(record.attributes),
        publish_time_ms=record.publish_time_ms,
        producer=record.producer,
        redelivery_count=message.redelivery_count,
        schema_id=record.schema_id,
        schema_version=record.schema_version,
        _consumer=taker,
    )


def test_every_field_of_every_message_in_order() -> None:
    taker = Taker()
    sent = delivered()
    messages, count = decode_frames_batch(encode_batch(sent), taker)
    assert count == 3
    assert messages == [expected(m, r, taker) for m, r in zip(sent, RECORDS, strict=True)]
    assert [m.redelivery_count for m in messages] == [0, 2, 0]
    assert all(type(m.payload) is bytes for m in messages)
    assert taker.corrupt_refs == []
    messages[1].ack()  # through the consumer that received it
    assert taker.acked == [messages[1]]


def test_the_fast_constructor_builds_what_the_dataclass_builds() -> None:
    fields = ("/ns/t", 7, b"p", "k", {"a": "b"}, 5, "prod", 1, 2, 3, None)
    built = received_message(*fields)
    assert built == ReceivedMessage(*fields)
    assert repr(built) == repr(ReceivedMessage(*fields))
    assert hash(built.ref) == hash(MessageRef("/ns/t", 7))
    with pytest.raises(AttributeError):
        built.offset = 8  # type: ignore[misc]


# A bit of the offset, of the CRC, of the record's header, of the payload (a bit of the
# length would move the frames after it: the batch's layout is off, refused whole below).
@pytest.mark.parametrize("flip_at", [0, 12, 20, -1])
def test_a_damaged_frame_is_left_out_and_handed_back(flip_at: int) -> None:
    sent = delivered()
    damaged = bytearray(sent[1].frame)
    damaged[flip_at] ^= 0x01
    sent[1] = DeliveredMessage(sent[1].partition, 4, 2, bytes(damaged))
    taker = Taker()
    messages, count = decode_frames_batch(encode_batch(sent), taker)
    assert count == 3
    assert [m.offset for m in messages] == [10, 11]
    assert [m.payload for m in messages] == [RECORDS[0].payload, RECORDS[2].payload]
    offset = struct.unpack_from("<Q", damaged)[0]
    assert taker.corrupt_refs == [MessageRef("/ns/t-part-1", offset)]


def test_a_garbled_record_under_a_good_crc_is_left_out_and_handed_back() -> None:
    sent = delivered()
    garbled = bytearray(encode_record(RECORDS[0]))
    garbled[0] = 9  # an unknown record version
    sent[0] = DeliveredMessage("/ns/t-part-0", 10, 0, encode_frame(10, bytes(garbled)))
    taker = Taker()
    messages, count = decode_frames_batch(encode_batch(sent), taker)
    assert (count, [m.offset for m in messages]) == (3, [4, 11])
    assert taker.corrupt_refs == [MessageRef("/ns/t-part-0", 10)]


def _count_at(body: bytes) -> int:
    """Where the batch's u32 count lies (after the partition table)."""
    names = struct.unpack_from("<H", body, 1)[0]
    pos = 3
    for _ in range(names):
        pos += 2 + struct.unpack_from("<H", body, pos)[0]
    return pos


def test_a_batch_whose_layout_is_off_is_refused_whole() -> None:
    sent = delivered()
    damaged = bytearray(sent[0].frame)
    damaged[-1] ^= 0x01  # would be handed back, were the batch whole
    sent[0] = DeliveredMessage(sent[0].partition, 10, 0, bytes(damaged))
    body = encode_batch(sent)
    at = _count_at(body)
    fewer = body[:at] + struct.pack("<I", 2) + body[at + 4 : at + 4 + 12] + body[at + 4 + 18 :]
    bad_index = bytearray(body)
    bad_index[at + 4 : at + 6] = struct.pack("<H", 7)  # only two partitions are named
    for bad in (body[:-1], body + b"\x00", fewer, bytes(bad_index), body[:at]):
        taker = Taker()
        with pytest.raises(ProtocolError):
            decode_frames_batch(bad, taker)
        assert taker.corrupt_refs == []


class GatedSocket:
    """A stream socket whose sends of flow frames wait while ``gate`` is closed."""

    def __init__(self) -> None:
        self.credits: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def send(self, text: str) -> None:
        await self.gate.wait()
        self.credits.append(orjson.loads(text)["credits"])


async def test_credits_freed_while_a_grant_is_being_sent_are_granted_after_it() -> None:
    inbox = Inbox(4)
    source = StreamSource(None, inbox, Taker(), None)  # type: ignore[arg-type]
    ws = GatedSocket()
    granting = asyncio.create_task(source._grant(ws))  # type: ignore[arg-type]

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    def take(count: int) -> None:
        for _ in range(count):
            assert inbox.take_nowait() is not None
            source.taken()

    try:
        await settle()
        assert ws.credits == [4]
        batch, _ = decode_frames_batch(encode_batch(delivered() + delivered()[:1]), Taker())
        inbox.put_many(batch)
        source.outstanding -= len(batch)
        take(1)
        await settle()
        assert ws.credits == [4]  # 1 free of 4: below half, nothing granted
        ws.gate.clear()
        take(1)
        await settle()  # 2 free: a grant of 2 is being sent
        take(2)  # 2 more free meanwhile
        ws.gate.set()
        await settle()
        assert ws.credits == [4, 2, 2]
        assert source.outstanding == 4
    finally:
        granting.cancel()
        await asyncio.gather(granting, return_exceptions=True)
