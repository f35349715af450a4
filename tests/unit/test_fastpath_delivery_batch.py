"""A delivery batch's two fast readers against their slow twin, decode_batch with
verify_frame and decode_record_fields: the SDK's one-pass decode_frames_batch (the same
messages, the same frames handed back, or the batch refused) and the hop's batch_size."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.client._frames import decode_frames_batch
from danube.client.errors import ProtocolError
from danube.client.messages import MessageRef, ReceivedMessage
from danube.frame import (
    MAX_FRAME_PAYLOAD_BYTES,
    FrameError,
    Record,
    decode_record_fields,
    encode_frame,
    encode_record,
)
from danube.wire.delivery import (
    BatchFormatError,
    DeliveredMessage,
    batch_size,
    decode_batch,
    encode_batch,
    read_head,
)
from tests.fastpath import damaged, hand_records, records

pytestmark = pytest.mark.unit


class Taker:
    """A consumer that keeps what it is handed back."""

    def __init__(self) -> None:
        self.corrupt_refs: list[MessageRef] = []

    def corrupt(self, ref: MessageRef) -> None:
        self.corrupt_refs.append(ref)

    def ack(self, message: ReceivedMessage) -> None:
        raise AssertionError("not acked here")

    def nack(self, message: ReceivedMessage, delay_ms: int = 0) -> None:
        raise AssertionError("not nacked here")


Outcome = tuple[Any, ...]


def fast(body: bytes) -> Outcome:
    taker = Taker()
    try:
        messages, count = decode_frames_batch(body, taker)
    except ProtocolError:
        assert taker.corrupt_refs == []  # a refused batch hands nothing back
        return ("refused",)
    return ("ok", messages, taker.corrupt_refs, count)


def slow(body: bytes) -> Outcome:
    try:
        delivered = decode_batch(body)
    except BatchFormatError:
        return ("refused",)
    messages, corrupt = [], []
    for m in delivered:
        try:
            fields = decode_record_fields(m.record)  # the frame's CRC first
        except FrameError:
            corrupt.append(MessageRef(m.partition, m.offset))
            continue
        messages.append(
            ReceivedMessage(
                m.partition,
                m.offset,
                fields.payload,
                fields.key,
                fields.attributes,
                fields.publish_time_ms,
                fields.producer,
                m.redelivery_count,
                fields.schema_id,
                fields.schema_version,
            )
        )
    return ("ok", messages, corrupt, len(delivered))


def hop(body: bytes) -> Outcome:
    try:
        return ("ok", batch_size(body))
    except BatchFormatError:
        return ("refused",)


_PARTITIONS = st.sampled_from(["/ns/t-part-0", "/ns/t-part-1", "/ns/\u00e9-part-0", "/d/t"])
_RECORDS = st.one_of(records().map(encode_record), hand_records())


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    """A batch whose frames may be damaged (each frame's own damage hands it back; a frame
    cut or grown moves the others: the layout is off) and whose head may be too."""
    sent = [
        DeliveredMessage(partition, offset, count, encode_frame(offset, record))
        for partition, offset, count, record in draw(
            st.lists(
                st.tuples(
                    _PARTITIONS, st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), _RECORDS
                ),
                max_size=4,
            )
        )
    ]
    body = encode_batch(sent)
    frames_at = read_head(body).frames_at
    body = body[:frames_at] + draw(damaged(body[frames_at:]))
    if draw(st.integers(0, 5)) == 0:  # the head: a flip in the table, the count or an entry
        head = bytearray(body)
        head[draw(st.integers(0, frames_at - 1))] ^= draw(st.integers(1, 255))
        body = bytes(head)
    return body


@settings(max_examples=200, deadline=None)
@given(batches())
def test_the_sdk_reads_what_decode_batch_and_the_record_decoder_read(body: bytes) -> None:
    assert fast(body) == slow(body)


@settings(max_examples=200, deadline=None)
@given(batches())
def test_the_hop_counts_what_decode_batch_splits(body: bytes) -> None:
    read = slow(body)
    assert hop(body) == (read if read == ("refused",) else ("ok", read[3]))


def test_the_twins_tell_each_outcome_apart() -> None:
    record = encode_record(
        Record(payload=b"x", publish_time_ms=1, producer="p", key="k", attributes={"a": "b"})
    )
    good = encode_batch([DeliveredMessage("/d/t", 5, 1, encode_frame(5, record))])
    damaged_frame = good[:-1] + bytes([good[-1] ^ 1])
    for body, outcome in [
        (good, "ok"),
        (damaged_frame, "ok"),  # handed back, the batch read
        (good[:-1], "refused"),
        (good + b"\x00", "refused"),
    ]:
        assert fast(body)[0] == slow(body)[0] == hop(body)[0] == outcome
    assert fast(damaged_frame)[2] == slow(damaged_frame)[2] == [MessageRef("/d/t", 5)]


def test_a_frame_at_the_frame_limit_is_read_and_one_past_it_refuses_the_batch() -> None:
    # Too large for the property's inputs: the limit alone decides here (each body is whole).
    for extra, outcome in [(0, "ok"), (1, "refused")]:
        record = encode_record(
            Record(
                payload=b"x" * (MAX_FRAME_PAYLOAD_BYTES - 29 + extra),
                publish_time_ms=1,
                producer="p",
            )
        )
        assert len(record) == MAX_FRAME_PAYLOAD_BYTES + extra
        frame = encode_frame(3, record, max_payload_bytes=len(record))
        body = encode_batch([DeliveredMessage("/d/t", 3, 0, frame)])
        assert fast(body)[0] == slow(body)[0] == hop(body)[0] == outcome
