"""Record encoding and decoding: round trips, versioning, truncation, garbage and limits."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.frame import (
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    MAX_PRODUCER_NAME_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_VERSION,
    CorruptRecordError,
    FrameError,
    InvalidRecordError,
    Record,
    UnsupportedRecordVersionError,
    decode_frames,
    decode_record,
    decode_record_fields,
    encode_frame,
    encode_record,
    record_publish_time_ms,
    record_sequence,
)
from danube.frame.record import is_record_of, sequence_runs
from danube.frame.record_decode import decode_record_at

pytestmark = pytest.mark.unit

# Text that UTF-8 can encode (no lone surrogates), bounded in characters so that even 4-byte
# characters stay within the byte limits.
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
u32s = st.none() | st.integers(min_value=0, max_value=2**32 - 1)
records = st.builds(
    Record,
    payload=st.binary(max_size=500),
    publish_time_ms=st.integers(min_value=0, max_value=2**64 - 1),
    producer=text,
    key=st.none() | text,
    attributes=st.dictionaries(text, text, max_size=8),
    schema_id=u32s,
    schema_version=u32s,
) | st.builds(
    Record,
    payload=st.binary(max_size=500),
    publish_time_ms=st.integers(min_value=0, max_value=2**64 - 1),
    producer=text,
    key=st.none() | text,
    attributes=st.dictionaries(text, text, max_size=8),
    schema_id=u32s,
    schema_version=u32s,
    sequence=st.integers(min_value=0, max_value=2**64 - 1),
    producer_epoch=st.integers(min_value=0, max_value=2**32 - 1),
)

SAMPLE = Record(
    payload=b"\x00\xffpayload",
    publish_time_ms=1_700_000_000_000,
    producer="p-1",
    key="k\u00e9",
    attributes={"a": "1", "\u00fc": ""},
    schema_id=3,
)


def raw_record(
    *,
    version: int = RECORD_VERSION,
    flags: int = 1,
    lengths: tuple[int, int, int, int] | None = None,
    producer: bytes = b"p",
    key: bytes = b"k",
    attributes: list[tuple[bytes, bytes]] | None = None,
    payload: bytes = b"",
) -> bytes:
    """Write record bytes by hand, so that tests can build what the encoder refuses to."""
    pairs = attributes or []
    producer_len, key_len, count, payload_len = lengths or (
        len(producer),
        len(key),
        len(pairs),
        len(payload),
    )
    header = struct.pack(
        "<BBQIIHHHI", version, flags, 0, 0, 0, producer_len, key_len, count, payload_len
    )
    body = b"".join(struct.pack("<H", len(n)) + n + struct.pack("<H", len(v)) + v for n, v in pairs)
    return header + producer + key + body + payload


@given(records)
def test_round_trip(record: Record) -> None:
    encoded = encode_record(record)
    assert encoded[0] == (RECORD_VERSION if record.sequence is None else 2)
    assert decode_record(encoded) == record


def at(raw: bytes) -> tuple[Any, ...]:
    """decode_record_at of ``raw`` lying in a larger body, bytes before and after it."""
    return decode_record_at(b"\x01before" + raw + b"after", 7, 7 + len(raw))


@given(records)
def test_decoding_in_place_gives_the_fields_decode_record_fields_gives(record: Record) -> None:
    encoded = encode_record(record)
    got = at(encoded)
    assert got == tuple(decode_record_fields(encoded))[:7]
    assert type(got[4]) is bytes  # the payload, a copy of its own


def test_decoding_in_place_refuses_a_span_outside_the_buffer() -> None:
    encoded = encode_record(SAMPLE)
    with pytest.raises(CorruptRecordError, match="buffer"):
        decode_record_at(encoded, 0, len(encoded) + 1)
    with pytest.raises(CorruptRecordError, match="buffer"):
        decode_record_at(encoded, 5, 4)


def test_round_trip_inside_a_frame_detaches_the_payload() -> None:
    (frame,), _ = decode_frames(encode_frame(42, encode_record(SAMPLE)))
    record = decode_record(frame.payload)
    assert record == SAMPLE
    assert type(record.payload) is bytes


def test_layout_matches_the_documented_bytes() -> None:
    record = Record(payload=b"P", publish_time_ms=5, producer="ab", key="", attributes={"n": "v"})
    assert encode_record(record) == (
        struct.pack("<BBQIIHHHI", 1, 0b001, 5, 0, 0, 2, 0, 1, 1)
        + b"ab"
        + b"\x01\x00n\x01\x00v"
        + b"P"
    )
    assert RECORD_HEADER_BYTES == 28


def test_absent_key_differs_from_empty_key() -> None:
    base: dict[str, Any] = {"payload": b"", "publish_time_ms": 0, "producer": ""}
    absent = encode_record(Record(**base))
    empty = encode_record(Record(**base, key=""))
    assert absent != empty
    assert decode_record(absent).key is None
    assert decode_record(empty).key == ""


@pytest.mark.parametrize("version", [0, 3, 255])
def test_unknown_version_is_rejected(version: int) -> None:
    encoded = bytearray(encode_record(SAMPLE))
    encoded[0] = version
    with pytest.raises(UnsupportedRecordVersionError) as info:
        decode_record(bytes(encoded))
    assert info.value.version == version
    assert info.value.code == "unsupported_record_version"
    assert isinstance(info.value, CorruptRecordError)
    # Even a record too short for a version-1 header is judged by its version first.
    with pytest.raises(UnsupportedRecordVersionError):
        decode_record(bytes([version]))


def test_every_truncation_is_corrupt() -> None:
    encoded = encode_record(SAMPLE)
    for cut in range(len(encoded)):
        with pytest.raises(CorruptRecordError):
            decode_record(encoded[:cut])
        with pytest.raises(CorruptRecordError):
            at(encoded[:cut])


@pytest.mark.parametrize("extra", [b"\x00", b"garbage"])
def test_trailing_bytes_are_corrupt(extra: bytes) -> None:
    with pytest.raises(CorruptRecordError, match="trailing bytes"):
        decode_record(encode_record(SAMPLE) + extra)
    with pytest.raises(CorruptRecordError, match="trailing bytes"):
        at(encode_record(SAMPLE) + extra)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (raw_record(flags=0x21), "unknown flags"),
        (raw_record(flags=0x19), "unknown compression codec"),
        (raw_record(flags=0), "key length is 1 but flagged absent"),
        (raw_record()[:10] + b"\x07" + raw_record()[11:], "schema_id is 7 but flagged absent"),
        (raw_record(producer=b"\xff"), "producer is not valid UTF-8"),
        (raw_record(attributes=[(b"a", b"\xc3")]), "attribute 0 value is not valid UTF-8"),
        (raw_record(attributes=[(b"a", b"1"), (b"a", b"2")]), "duplicate attribute"),
        (raw_record(lengths=(1, 1, 1, 0)), "truncated in attribute 0 name length"),
        (raw_record(lengths=(1, 1, 0, 1)), "truncated in payload"),
        (raw_record(lengths=(50, 1, 0, 0)), "truncated in producer or key"),
    ],
)
def test_garbled_records_are_corrupt(raw: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordError, match=match):
        decode_record(raw)
    with pytest.raises(CorruptRecordError, match=match):
        at(raw)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (raw_record(producer=b"p" * (MAX_PRODUCER_NAME_BYTES + 1)), "producer length"),
        (raw_record(key=b"k" * (MAX_KEY_BYTES + 1)), "key length"),
        (raw_record(attributes=[(b"%d" % i, b"") for i in range(MAX_ATTRIBUTES + 1)]), "count"),
        (raw_record(attributes=[(b"n" * (MAX_ATTRIBUTE_NAME_BYTES + 1), b"")]), "name length"),
        (raw_record(attributes=[(b"n", b"v" * (MAX_ATTRIBUTE_VALUE_BYTES + 1))]), "value length"),
    ],
)
def test_limits_are_enforced_on_decode(raw: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordError, match=match):
        decode_record(raw)
    with pytest.raises(CorruptRecordError, match=match):
        at(raw)


def at_limit_and_over(limit: int, char: str = "\u00e9") -> tuple[str, str]:
    """Strings of exactly ``limit`` UTF-8 bytes and one byte more (limits count bytes)."""
    at = char * (limit // 2) + "x" * (limit % 2)
    return at, at + "x"


@pytest.mark.parametrize(
    ("field", "limit"),
    [
        ("producer", MAX_PRODUCER_NAME_BYTES),
        ("key", MAX_KEY_BYTES),
        ("attribute name", MAX_ATTRIBUTE_NAME_BYTES),
        ("attribute value", MAX_ATTRIBUTE_VALUE_BYTES),
    ],
)
def test_length_limits_are_enforced_on_encode(field: str, limit: int) -> None:
    def make(value: str) -> Record:
        fields: dict[str, Any] = {"payload": b"", "publish_time_ms": 0, "producer": "p"}
        if field.startswith("attribute"):
            fields["attributes"] = {value: "v"} if field.endswith("name") else {"n": value}
        else:
            fields[field] = value
        return Record(**fields)

    at, over = at_limit_and_over(limit)
    assert decode_record(encode_record(make(at))) == make(at)
    with pytest.raises(InvalidRecordError, match="exceed the limit"):
        encode_record(make(over))


def test_attribute_count_limit_is_enforced_on_encode() -> None:
    attributes = {str(i): "" for i in range(MAX_ATTRIBUTES)}
    record = Record(payload=b"", publish_time_ms=0, producer="", attributes=attributes)
    assert decode_record(encode_record(record)).attributes == attributes
    attributes["one more"] = ""
    with pytest.raises(InvalidRecordError) as info:
        encode_record(Record(payload=b"", publish_time_ms=0, producer="", attributes=attributes))
    assert info.value.field == "attributes"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"publish_time_ms": -1}, "publish_time_ms"),
        ({"publish_time_ms": 2**64}, "publish_time_ms"),
        ({"schema_id": 2**32}, "schema_id"),
        ({"schema_version": -1}, "schema_version"),
        ({"producer": "\ud800"}, "producer"),
        ({"key": 7}, "key"),
        ({"payload": "text"}, "payload"),
        ({"attributes": [("a", "b")]}, "attributes"),
        ({"attributes": {"a": 1}}, "attributes['a']"),
    ],
)
def test_invalid_fields_are_refused_on_encode(changes: dict[str, Any], field: str) -> None:
    fields: dict[str, Any] = {"payload": b"", "publish_time_ms": 0, "producer": "p", **changes}
    with pytest.raises(InvalidRecordError) as info:
        encode_record(Record(**fields))
    assert info.value.field == field
    assert isinstance(info.value, FrameError)


@given(records)
def test_publish_time_is_read_from_the_header_alone(record: Record) -> None:
    encoded = encode_record(record)
    assert record_publish_time_ms(encoded) == record.publish_time_ms
    header_bytes = RECORD_HEADER_BYTES if record.sequence is None else RECORD_HEADER_BYTES + 12
    assert record_publish_time_ms(memoryview(encoded)[:header_bytes]) == record.publish_time_ms


def test_publish_time_of_a_buffer_that_is_no_record_raises() -> None:
    encoded = encode_record(Record(payload=b"x", publish_time_ms=5, producer="p"))
    with pytest.raises(CorruptRecordError):
        record_publish_time_ms(b"")
    with pytest.raises(CorruptRecordError):
        record_publish_time_ms(encoded[: RECORD_HEADER_BYTES - 1])
    with pytest.raises(UnsupportedRecordVersionError):
        record_publish_time_ms(bytes([RECORD_VERSION + 2]) + encoded[1:])


def test_a_sequenced_record_is_version_2_with_its_epoch_and_sequence_after_the_v1_header() -> None:
    plain = encode_record(SAMPLE)
    sequenced = encode_record(
        Record(**{**_fields(SAMPLE), "sequence": 2**40 + 7, "producer_epoch": 3})
    )
    assert plain[0] == RECORD_VERSION == 1
    assert sequenced[0] == 2
    # Version 1's header, then producer_epoch u32 and sequence u64, then the same text.
    assert sequenced[1:RECORD_HEADER_BYTES] == plain[1:RECORD_HEADER_BYTES]
    assert struct.unpack_from("<IQ", sequenced, RECORD_HEADER_BYTES) == (3, 2**40 + 7)
    assert sequenced[RECORD_HEADER_BYTES + 12 :] == plain[RECORD_HEADER_BYTES:]
    assert record_sequence(plain) is None
    assert record_sequence(sequenced) == ("p-1", 3, 2**40 + 7)
    assert record_publish_time_ms(sequenced) == SAMPLE.publish_time_ms


def test_an_epoch_without_a_sequence_is_refused() -> None:
    with pytest.raises(InvalidRecordError, match="producer_epoch"):
        encode_record(Record(**{**_fields(SAMPLE), "producer_epoch": 1}))


@pytest.mark.parametrize("sequence", [-1, 2**64])
def test_a_sequence_outside_u64_is_refused(sequence: int) -> None:
    with pytest.raises(InvalidRecordError, match="sequence"):
        encode_record(Record(**{**_fields(SAMPLE), "sequence": sequence}))


def _sequenced(name: str | None, epoch: int, sequence: int) -> bytes:
    """A record of producer ``name``'s ``sequence`` of ``epoch`` (None: a plain record)."""
    return encode_record(
        Record(
            payload=b"",
            publish_time_ms=0,
            producer=name or "plain",
            sequence=None if name is None else sequence,
            producer_epoch=0 if name is None else epoch,
        )
    )


def _fields(record: Record) -> dict[str, Any]:
    return {name: getattr(record, name) for name in Record.__dataclass_fields__}


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3), st.integers(0, 6)),
        max_size=25,
    )
)
def test_sequence_runs_agree_with_reading_each_record(
    shapes: list[tuple[str | None, int, int]],
) -> None:
    """The fast run reader against its slow twin, record_sequence on every record."""
    records = [_sequenced(name, epoch, sequence) for name, epoch, sequence in shapes]
    expanded = [
        (run.producer.decode(), run.producer_epoch, run.first_sequence + i, run.first_index + i)
        for run in sequence_runs(records)
        for i in range(run.length)
    ]
    slow = [
        (found.producer, found.producer_epoch, found.sequence, index)
        for index, record in enumerate(records)
        if (found := record_sequence(record)) is not None
    ]
    assert expanded == slow
    for before, after in itertools.pairwise(sequence_runs(records)):  # runs are maximal
        assert not (
            after.first_index == before.first_index + before.length
            and (after.producer, after.producer_epoch) == (before.producer, before.producer_epoch)
            and after.first_sequence == before.first_sequence + before.length
        )


@given(
    st.sampled_from(["a", "ab", "b", None]),
    st.integers(0, 3),
    st.integers(0, 6),
    st.sampled_from(["a", "ab", "b"]),
    st.integers(0, 3),
    st.integers(0, 6),
)
def test_is_record_of_agrees_with_reading_the_record(
    name: str | None, epoch: int, sequence: int, asked: str, asked_epoch: int, asked_seq: int
) -> None:
    """The quick check against its slow twin, record_sequence (a plain record is nobody's)."""
    record = _sequenced(name, epoch, sequence)
    found = record_sequence(record)
    expected = found == (asked, asked_epoch, asked_seq)
    assert is_record_of(record, asked.encode(), asked_epoch, asked_seq) is expected
    assert is_record_of(memoryview(record), asked.encode(), asked_epoch, asked_seq) is expected
    assert not is_record_of(record[:10], asked.encode(), asked_epoch, asked_seq)
