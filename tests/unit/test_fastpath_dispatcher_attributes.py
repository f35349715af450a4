"""The dispatcher's header-only reads of a record (expiry_ms: when it expires; due_of: when
a delayed one is due) against their slow twin, the record decoded whole: the same time for
every record that decodes, whatever its attributes; for a damaged one, no error, and None
when its header or its attributes do not read (the rest is not checked: expiry_ms says why)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.dispatcher.due_time import due_of
from danube.dispatcher.expiring import expiry_ms
from danube.frame import (
    RECORD_HEADER_BYTES,
    FrameError,
    RawFrame,
    Record,
    RecordFields,
    decode_record_fields,
    encode_frame,
    encode_record,
)
from danube.frame.record import RECORD_FLAGS_AT, RECORD_PUBLISH_TIME_AT
from danube.wire.delay import (
    DELAY_MS_MAX,
    DELIVER_AFTER_ATTRIBUTE,
    DELIVER_AT_ATTRIBUTE,
    deliver_at_ms,
)
from danube.wire.delivery import TTL_ATTRIBUTE, TTL_MS_MAX
from tests.fastpath import damaged, hand_records, records

pytestmark = pytest.mark.unit


def _decoded(record: bytes) -> RecordFields | None:
    try:
        return decode_record_fields(record, decompress=False)
    except FrameError:
        return None


def slow_expiry(record: bytes, policy_ttl_ms: int | None) -> int | None:
    """expiry_ms's rule read off the whole record: its own whole number of ms in bounds wins
    over the policy's; a record that does not decode never expires."""
    fields = _decoded(record)
    if fields is None:
        return None
    own = fields.attributes.get(TTL_ATTRIBUTE)
    ttl_ms = policy_ttl_ms
    if own is not None and own.isdigit() and 1 <= int(own) <= TTL_MS_MAX:
        ttl_ms = int(own)
    return None if ttl_ms is None else fields.publish_time_ms + ttl_ms


def slow_due(record: bytes) -> int | None:
    fields = _decoded(record)
    return None if fields is None else deliver_at_ms(fields.attributes, fields.publish_time_ms)


# The attributes these reads look for, with values in and out of bounds, and their names in
# places other than an attribute name (a value, the key, the payload, the producer).
_NAMES = [TTL_ATTRIBUTE, DELIVER_AT_ATTRIBUTE, DELIVER_AFTER_ATTRIBUTE]
_VALUES = st.sampled_from(
    [
        *("0", "1", "250", "-5", "1e3", "", "\u0661"),  # in bounds, or not whole numbers
        *(str(n) for n in (TTL_MS_MAX, TTL_MS_MAX + 1, DELAY_MS_MAX + 1, 2**70)),
    ]
)


@st.composite
def timed_records(draw: st.DrawFn) -> bytes:
    record: Record = draw(records(schema=False))
    attributes = dict(record.attributes)
    for name in draw(st.lists(st.sampled_from(_NAMES), max_size=3, unique=True)):
        attributes[name] = draw(_VALUES)
    decoy = draw(st.sampled_from(_NAMES))
    where = draw(st.sampled_from(["none", "value", "key", "payload", "producer"]))
    if where == "value":
        attributes["x"] = decoy
    return encode_record(
        Record(
            payload=decoy.encode() if where == "payload" else record.payload,
            publish_time_ms=draw(st.integers(0, 2**62)),
            producer=decoy if where == "producer" else record.producer,
            key=decoy if where == "key" else record.key,
            attributes=attributes,
            sequence=record.sequence,
            producer_epoch=record.producer_epoch,
            compression=record.compression,
        )
    )


@st.composite
def damaged_records(draw: st.DrawFn) -> bytes:
    """A record garbled under a good CRC: what a frame carries when the damage was done
    before it was framed (a hand-written record, or a field or a byte set)."""
    record = draw(st.one_of(timed_records(), hand_records()))
    body = draw(damaged(encode_frame(0, record)))
    return body[16:] if len(body) >= 16 else b""


_POLICY = st.none() | st.sampled_from([1, 60_000, TTL_MS_MAX])


@settings(max_examples=200, deadline=None)
@given(timed_records(), _POLICY)
def test_the_header_read_times_a_record_as_the_whole_record_does(
    record: bytes, policy_ttl_ms: int | None
) -> None:
    assert expiry_ms(record, policy_ttl_ms) == slow_expiry(record, policy_ttl_ms)
    assert due_of(record) == slow_due(record)
    frame = RawFrame(3, memoryview(encode_frame(3, record)))  # as the runtime hands it
    assert (expiry_ms(frame, policy_ttl_ms), due_of(frame)) == (
        expiry_ms(record, policy_ttl_ms),
        due_of(record),
    )


@settings(max_examples=200, deadline=None)
@given(damaged_records(), _POLICY)
def test_a_damaged_record_is_timed_as_decoded_or_by_its_header_alone(
    record: bytes, policy_ttl_ms: int | None
) -> None:
    expires, due = expiry_ms(record, policy_ttl_ms), due_of(record)  # never raises
    if _decoded(record) is not None:
        assert (expires, due) == (slow_expiry(record, policy_ttl_ms), slow_due(record))
    elif len(record) < RECORD_HEADER_BYTES:
        assert (expires, due) == (None, None)
    elif expires is not None:  # the header's time, and a TTL from the policy or the record
        (time_ms,) = struct.unpack_from("<Q", record, RECORD_PUBLISH_TIME_AT)
        assert expires - time_ms == policy_ttl_ms or 1 <= expires - time_ms <= TTL_MS_MAX


def test_a_record_damaged_outside_its_attributes_is_still_timed_by_its_header() -> None:
    # What the header-only read does not check (expiry_ms's docstring): here a producer that
    # is not UTF-8. A damaged attribute region, though, never expires.
    good = encode_record(Record(payload=b"x", publish_time_ms=10, producer="\u00e9"))
    bad_producer = good[:-3] + b"\xff" + good[-2:]
    assert _decoded(bad_producer) is None
    assert expiry_ms(bad_producer, 5) == 15
    own = encode_record(
        Record(payload=b"x", publish_time_ms=10, producer="p", attributes={TTL_ATTRIBUTE: "7"})
    )
    assert expiry_ms(own, 5) == 17
    unknown_flag = bytearray(own)
    unknown_flag[RECORD_FLAGS_AT] |= 0x80
    assert _decoded(bytes(unknown_flag)) is None
    assert expiry_ms(bytes(unknown_flag), 5) == 17  # the flags are not checked
    cut_attribute = own.replace(b"\x01\x00" + b"7", b"\x09\x00" + b"7")  # runs past the end
    assert _decoded(cut_attribute) is None
    assert expiry_ms(cut_attribute, 5) is None
