"""Inputs for the fast paths' property tests (tests/unit/test_fastpath_*.py): records with the
text, size and compression edges, and the ways a body of frames is damaged on its way.

A fast path and its slow twin must agree on what breaks them as well as on what they read, so
the damage is of every kind a reader tells apart: a record garbled under a good CRC (the
record checks), a flipped byte (the CRC), a cut (a truncated frame), bytes after the last
frame, a frame with another offset, a header field set to a limit or just past it.
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from danube.frame import (
    FRAME_HEADER_BYTES,
    MAX_ATTRIBUTE_NAME_BYTES,
    MAX_ATTRIBUTE_VALUE_BYTES,
    MAX_ATTRIBUTES,
    MAX_KEY_BYTES,
    MAX_PRODUCER_NAME_BYTES,
    RECORD_HEADER,
    RECORD_VERSION,
    SEQUENCED_RECORD_HEADER,
    SEQUENCED_RECORD_VERSION,
    Record,
    encode_frame,
    walk_frames,
)
from danube.frame.compression import CODEC_LZ4, CODEC_NONE, CODEC_ZSTD, compress
from danube.frame.record import FLAG_CODEC_SHIFT, FLAG_KEY, FLAG_SCHEMA_ID, FLAG_SCHEMA_VERSION

# Text a record carries: empty, one- to four-byte UTF-8, a NUL, a combining mark, and now
# and then one just at or past its byte limit (a 2-byte letter over half the limit is over).
_EDGE_TEXT = ["", "a", "\u00e9", "\u20ac", "\U0001f600", "\x00", "e\u0301", "\ufeff"]
_TEXT = st.one_of(
    st.sampled_from(_EDGE_TEXT),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=6),
)
_PRODUCERS = st.one_of(_TEXT, st.just("p" * MAX_PRODUCER_NAME_BYTES))
_KEYS = st.one_of(st.none(), _TEXT, st.just("k" * MAX_KEY_BYTES))
# Payloads: short, repetitive (which compresses), and binary.
_PAYLOADS = st.one_of(
    st.binary(max_size=48),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=3), st.integers(8, 80)),
)


@st.composite
def records(draw: st.DrawFn, *, schema: bool = True) -> Record:
    """A record the encoder takes: any text, key, attributes, sequence and compression;
    with ``schema``, a schema id or version now and then."""
    sequence = draw(st.none() | st.integers(0, 2**64 - 1))
    return Record(
        payload=draw(_PAYLOADS),
        publish_time_ms=draw(st.integers(0, 2**64 - 1)),
        producer=draw(_PRODUCERS),
        key=draw(_KEYS),
        attributes=draw(st.dictionaries(_TEXT, _TEXT, max_size=3)),
        schema_id=draw(st.none() | st.integers(0, 2**32 - 1)) if schema else None,
        schema_version=draw(st.none() | st.integers(0, 2**32 - 1)) if schema else None,
        sequence=sequence,
        producer_epoch=0 if sequence is None else draw(st.integers(0, 2**32 - 1)),
        compression=draw(st.sampled_from([None, None, "zstd", "lz4"])),
    )


def _at(field_index: int) -> int:
    """Where the record header's field ``field_index`` lies (0: version), from its format."""
    return struct.calcsize(RECORD_HEADER.format[: 1 + field_index])


# The record header's fields (index in RECORD_HEADER, struct code) and values that test its
# checks: 0, small ones, each limit and one past it, the largest the field holds.
_U32_MAX = 2**32 - 1
_LENGTH = struct.Struct("<H")  # before each attribute name and value (danube.frame.record)
_FIELDS = [(i, code) for i, code in enumerate(RECORD_HEADER.format[1:])]
_VALUES = [
    0,
    1,
    2,
    3,
    0b11000,
    MAX_ATTRIBUTES,
    MAX_ATTRIBUTES + 1,
    MAX_PRODUCER_NAME_BYTES + 1,
    MAX_ATTRIBUTE_NAME_BYTES + 1,
    MAX_KEY_BYTES,
    MAX_KEY_BYTES + 1,
    2**16 - 1,
    2**32 - 1,
]


@st.composite
def _garbled_record(draw: st.DrawFn, record: bytes) -> bytes:
    """``record`` with one header field set, a byte set, a cut, or bytes added."""
    raw = bytearray(record)
    ways = ["byte", "cut", "extend"] if raw else ["cut", "extend"]
    how = draw(st.sampled_from(ways + ["field"] * (len(raw) >= RECORD_HEADER.size)))
    if how == "field":
        index, code = draw(st.sampled_from(_FIELDS))
        size = struct.calcsize("<" + code)
        value = draw(st.sampled_from(_VALUES)) % (1 << (8 * size))
        struct.pack_into("<" + code, raw, _at(index), value)
    elif how == "byte":
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        del raw[draw(st.integers(0, len(raw))) :]
    else:
        raw += draw(st.binary(min_size=1, max_size=4))
    return bytes(raw)


@st.composite
def damaged(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` (whole frames) as it may arrive: intact about a third of the time, else with
    one or two kinds of damage."""
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        frames, end = walk_frames(body, max_payload_bytes=_U32_MAX)
        how = draw(st.sampled_from(["record", "record", "flip", "cut", "garbage", "offset"]))
        if how in ("record", "offset") and frames:
            at = draw(st.integers(0, len(frames) - 1))
            offset, record = frames[at].offset, bytes(frames[at].record)
            if how == "record":  # framed again: a good CRC over a bad record
                record = draw(_garbled_record(record))
            else:  # another offset, a good CRC
                offset = (offset + draw(st.integers(1, 2**64 - 1))) % 2**64
            pieces = [bytes(f.data) for f in frames]
            pieces[at] = encode_frame(offset, record, max_payload_bytes=_U32_MAX)
            body = b"".join(pieces) + body[end:]
        elif how == "flip" and body:
            flipped = bytearray(body)
            flipped[draw(st.integers(0, len(body) - 1))] ^= draw(st.integers(1, 255))
            body = bytes(flipped)
        elif how == "cut":
            body = body[: draw(st.integers(0, max(0, len(body) - 1)))]
        elif how == "garbage":
            body += draw(st.binary(min_size=1, max_size=FRAME_HEADER_BYTES + 4))
    return body


# Text as bytes a hand-written record carries: valid UTF-8 of each width, and what is not
# UTF-8 (a lone continuation byte, a surrogate encoded, an overlong NUL, a cut sequence).
_RAW_TEXT = st.sampled_from(
    [
        b"",
        b"a",
        "\u00e9".encode(),
        "\U0001f600".encode(),
        b"\x80",
        b"\xed\xa0\x80",
        b"\xc0\x80",
        b"\xe2\x82",
    ]
)


def _raw_text(limit: int) -> st.SearchStrategy[bytes]:
    """Text bytes of any kind, or exactly ``limit`` bytes, or one byte more."""
    return st.one_of(_RAW_TEXT, _RAW_TEXT, st.sampled_from([b"t" * limit, b"t" * (limit + 1)]))


@st.composite
def hand_records(draw: st.DrawFn) -> bytes:
    """A record written by hand, its lengths agreeing with its text: what the encoder would
    refuse to write (text past a limit or not UTF-8, too many or repeated attribute names,
    a schema field without its flag) as well as what it writes."""
    version = draw(st.sampled_from([RECORD_VERSION, SEQUENCED_RECORD_VERSION]))
    producer = draw(_raw_text(MAX_PRODUCER_NAME_BYTES))
    # Plain records (no key, no attributes) half the time: a fast path's own loop reads them.
    plain = draw(st.booleans())
    key = None if plain else draw(st.none() | _raw_text(MAX_KEY_BYTES))
    count = 0 if plain else draw(st.sampled_from([0, 1, 2, MAX_ATTRIBUTES, MAX_ATTRIBUTES + 1]))
    if count <= 2:  # any text, the same name twice now and then
        names = draw(st.lists(_raw_text(MAX_ATTRIBUTE_NAME_BYTES), min_size=count, max_size=count))
        values = draw(
            st.lists(_raw_text(MAX_ATTRIBUTE_VALUE_BYTES), min_size=count, max_size=count)
        )
    else:  # the count at its limit or past it, with nothing else wrong, or one name repeated
        names = [b"n%d" % i for i in range(count)]
        values = [b"v"] * count
        names[-1] = draw(st.sampled_from([names[-1], names[0]]))
    payload = draw(_PAYLOADS)
    codec = draw(st.sampled_from([CODEC_NONE, CODEC_NONE, CODEC_ZSTD, CODEC_LZ4]))
    if codec != CODEC_NONE:
        payload = compress(codec, payload)
    schema_id, schema_version = draw(st.sampled_from([(0, 0), (5, 0), (0, 6)]))
    flags = (
        (0 if key is None else FLAG_KEY)
        | (FLAG_SCHEMA_ID if schema_id and draw(st.booleans()) else 0)
        | (FLAG_SCHEMA_VERSION if schema_version and draw(st.booleans()) else 0)
        | codec << FLAG_CODEC_SHIFT
    )
    head = (
        version,
        flags,
        draw(st.integers(0, 2**64 - 1)),
        schema_id,
        schema_version,
        len(producer),
        0 if key is None else len(key),
        count,
        len(payload),
    )
    if version == SEQUENCED_RECORD_VERSION:
        header = SEQUENCED_RECORD_HEADER.pack(
            *head, draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**64 - 1))
        )
    else:
        header = RECORD_HEADER.pack(*head)
    pairs = b"".join(
        _LENGTH.pack(len(n)) + n + _LENGTH.pack(len(v)) + v
        for n, v in zip(names, values, strict=True)
    )
    return header + producer + (key or b"") + pairs + payload
