"""Compressed payloads: the codecs' forms, records and produced frames that carry them (round
trips, the producer's only-if-smaller rule), and every way a compressed payload can lie about
itself (bombs, wrong sizes, trailing bytes, unknown codecs) refused as corrupt."""

from __future__ import annotations

import random
import struct

import lz4.block
import orjson
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.admission.chunks import check_chunked_frames
from danube.discovery.errors import TooLargeError, http_status
from danube.frame import (
    CorruptRecordError,
    InvalidRecordError,
    Record,
    decode_record,
    decode_record_fields,
    encode_record,
)
from danube.frame.compression import (
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_ZSTD,
    codec_id,
    compress,
    compress_if_smaller,
    decompress,
    decompressed_size,
)
from danube.frame.errors import DecompressedTooLargeError
from danube.frame.produce import (
    check_record,
    encode_produce_frame,
    frame_for_produce,
    scan_frames_for_produce,
    stamp_schema,
)
from danube.frame.record import FLAG_CODEC, RECORD_FLAGS_AT
from danube.frame.record_decode import decode_record_at
from danube.wire.chunks import TOTAL_BYTES_ATTRIBUTE
from danube.wire.produce_binary import scan_body

pytestmark = pytest.mark.unit

CODECS = [CODEC_ZSTD, CODEC_LZ4]
NAMES = {CODEC_ZSTD: "zstd", CODEC_LZ4: "lz4"}
_LZ4_SIZE = struct.Struct("<I")  # the LZ4 form's size prefix (not a frame header)


def log_line(index: int) -> bytes:
    """A JSON log line of about 1 KiB, like the benchmark's."""
    return orjson.dumps(
        {
            "ts": f"2026-11-29T04:{index % 60:02d}:00.{index:06d}Z",
            "level": "INFO" if index % 7 else "WARN",
            "service": "checkout",
            "trace_id": f"{index * 7919:032x}",
            "message": "order placed " + f"item=sku-{index} qty={index % 5} " * 30,
        }
    )


@settings(max_examples=200)
@given(payload=st.binary(max_size=4000), codec=st.sampled_from(CODECS))
def test_codec_round_trip_states_its_size(payload: bytes, codec: int) -> None:
    packed = compress(codec, payload)
    assert decompressed_size(codec, packed) == len(payload)
    assert decompress(codec, packed, size_bytes_max=len(payload)) == payload


@settings(max_examples=200)
@given(
    payload=st.binary(max_size=2000) | st.builds(log_line, st.integers(0, 10**6)),
    codec=st.sampled_from(CODECS),
    sequence=st.none() | st.integers(0, 2**64 - 1),
    key=st.none() | st.text(max_size=20),
    # None of them: the scan's fast path (one unpack); any: its general path (check_record).
    attributes=st.sampled_from([[], [(b"a", b"1")]]),
)
def test_produced_frame_round_trips_compressed_only_when_smaller(
    payload: bytes,
    codec: int,
    sequence: int | None,
    key: str | None,
    attributes: list[tuple[bytes, bytes]],
) -> None:
    frame = encode_produce_frame(
        payload,
        producer=b"p",
        publish_time_ms=5,
        key=None if key is None else key.encode(),
        attributes=attributes,
        sequence=sequence,
        codec=codec,
    )
    scanned = scan_frames_for_produce(frame, max_count=1)
    record = scanned.record(0)
    stored_codec = (record[RECORD_FLAGS_AT] & FLAG_CODEC) >> 3
    compressed = compress_if_smaller(codec, payload)
    assert stored_codec == (CODEC_NONE if compressed is None else codec)
    # Everything a reader sees is the message itself, and the scan sizes it as such.
    assert scanned.payload_sizes == [len(payload)]
    assert bytes(scanned.payload(0)) == payload
    assert scanned.keys == [key]
    fields = decode_record_fields(record)
    assert (fields.payload, fields.key, fields.sequence) == (payload, key, sequence)
    assert fields.compression == (None if compressed is None else NAMES[codec])
    assert bytes(decode_record_at(bytes(record), 0, len(record))[4]) == payload
    assert bytes(decode_record_at(record, 0, len(record))[4]) == payload
    if compressed is not None:
        stored = decode_record_fields(record, decompress=False).payload
        assert stored == compressed
        assert len(stored) < len(payload)


def test_log_lines_are_stored_compressed_and_small_payloads_as_is() -> None:
    line = log_line(1)
    for codec in CODECS:
        frame = encode_produce_frame(line, producer=b"p", publish_time_ms=1, codec=codec)
        assert len(frame) < len(line) // 2  # JSON log lines compress at least 2:1
        tiny = encode_produce_frame(b"ok", producer=b"p", publish_time_ms=1, codec=codec)
        assert tiny == encode_produce_frame(b"ok", producer=b"p", publish_time_ms=1)


@given(
    payload=st.binary(max_size=300),
    compression=st.sampled_from(["zstd", "lz4"]),
    schema_id=st.none() | st.integers(0, 2**32 - 1),
)
def test_record_round_trip_keeps_its_compression(
    payload: bytes, compression: str, schema_id: int | None
) -> None:
    record = Record(
        payload=payload,
        publish_time_ms=1,
        producer="p",
        schema_id=schema_id,
        compression=compression,  # type: ignore[arg-type]
    )
    raw = encode_record(record)
    assert decode_record(raw) == record
    assert encode_record(decode_record(raw)) == raw


def test_unknown_compression_name_is_refused() -> None:
    with pytest.raises(InvalidRecordError, match="compression"):
        encode_record(Record(payload=b"x", publish_time_ms=1, producer="p", compression="gz"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compression must be one of"):
        codec_id("snappy")


def _with_payload(codec: int, stored: bytes) -> bytes:
    """A record whose stored payload is ``stored`` under ``codec``: written by hand, as a
    hostile producer could."""
    raw = bytearray(encode_record(Record(payload=stored, publish_time_ms=1, producer="p")))
    raw[RECORD_FLAGS_AT] |= codec << 3
    return bytes(raw)


def _bomb(codec: int, size: int) -> bytes:
    zeros = b"\0" * size
    if codec == CODEC_ZSTD:
        return zstandard.ZstdCompressor().compress(zeros)
    packed: bytes = lz4.block.compress(zeros, store_size=True)
    return packed


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_is_refused_before_it_is_inflated(codec: int) -> None:
    # 80 MiB of zeros in a few kilobytes: over every reader's bound (64 MiB).
    raw = _with_payload(codec, _bomb(codec, 80 * 1024 * 1024))
    assert len(raw) < 400_000
    with pytest.raises(DecompressedTooLargeError) as caught:
        decode_record(raw)
    assert caught.value.size_bytes == 80 * 1024 * 1024
    # The produce scan holds it to the producer's limit, and discovery answers 413.
    small = _with_payload(codec, _bomb(codec, 600 * 1024))
    with pytest.raises(DecompressedTooLargeError):
        scan_frames_for_produce(frame_for_produce(small), max_count=1, payload_bytes_max=512 * 1024)
    with pytest.raises(TooLargeError) as refused:
        scan_body(frame_for_produce(small), max_messages=10, max_payload_bytes=512 * 1024)
    assert (http_status(refused.value), refused.value.code) == (413, "payload_too_large")


@pytest.mark.parametrize("codec", CODECS)
def test_a_payload_that_lies_about_its_size_is_corrupt(codec: int) -> None:
    payload = log_line(3)
    packed = bytearray(compress(codec, payload))
    if codec == CODEC_LZ4:
        for stated in (len(payload) - 1, len(payload) + 1, 0):
            _LZ4_SIZE.pack_into(packed, 0, stated)
            with pytest.raises(CorruptRecordError):
                decode_record(_with_payload(codec, bytes(packed)))
    else:
        unsized = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
        with pytest.raises(CorruptRecordError, match="content size"):
            decode_record(_with_payload(codec, unsized))
    # The produce check inflates what it admits: a lie is refused before it is stored.
    lying = _with_payload(codec, bytes(packed) + b"\0")
    with pytest.raises(CorruptRecordError):
        check_record(memoryview(lying), 0, len(lying))


def test_bytes_after_a_zstd_frame_are_corrupt() -> None:
    packed = compress(CODEC_ZSTD, log_line(4))
    raw = _with_payload(CODEC_ZSTD, packed + packed)
    with pytest.raises(CorruptRecordError, match="unused data"):
        decode_record(raw)
    with pytest.raises(CorruptRecordError):
        scan_frames_for_produce(frame_for_produce(raw), max_count=1)


def test_codec_three_is_unknown() -> None:
    raw = _with_payload(3, b"abc")
    with pytest.raises(CorruptRecordError, match="unknown compression codec"):
        decode_record(raw)
    with pytest.raises(CorruptRecordError, match="unknown compression codec"):
        scan_frames_for_produce(frame_for_produce(raw), max_count=1)


@settings(max_examples=300)
@given(
    codec=st.sampled_from(CODECS),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1),
)
def test_garbled_compressed_payloads_never_escape_as_other_errors(
    codec: int, flips: list[tuple[int, int]]
) -> None:
    packed = bytearray(compress(codec, log_line(5)))
    for at, xor in flips:
        packed[at % len(packed)] ^= xor
    raw = _with_payload(codec, bytes(packed))
    try:
        payload = decode_record(raw).payload
    except CorruptRecordError:
        return
    assert len(payload) == decompressed_size(codec, bytes(packed))


def test_schema_stamp_keeps_the_codec() -> None:
    line = log_line(6)
    frame = encode_produce_frame(line, producer=b"p", publish_time_ms=1, codec=CODEC_ZSTD)
    record = scan_frames_for_produce(frame, max_count=1).record(0)
    stamped = stamp_schema(record, 7, 2)
    fields = decode_record_fields(stamped)
    assert (fields.payload, fields.schema_id, fields.compression) == (line, 7, "zstd")
    scanned = scan_frames_for_produce(frame_for_produce(stamped), max_count=1, stamped=True)
    assert bytes(scanned.payload(0)) == line


@pytest.mark.parametrize("records", [1, 2, 5])
def test_a_compressed_chunk_is_held_to_the_chunked_message_limit(records: int) -> None:
    """The front door finds a chunk's total among its attributes, before its payload: for a
    compressed record the stored payload, not the message, is what follows them."""
    rng = random.Random(records)
    text = bytes(rng.choice(b"acgt") for _ in range(64 * 1024))  # ~4:1, still ~16 KiB stored
    attributes = [(TOTAL_BYTES_ATTRIBUTE.encode(), b"999999999")]
    body = b"".join(
        encode_produce_frame(
            text, producer=b"p", publish_time_ms=1, attributes=attributes, codec=codec
        )
        for codec in [CODEC_ZSTD, CODEC_LZ4][:records] * records
    )
    frames = scan_frames_for_produce(body, max_count=20)
    spans = zip(frames.starts, frames.ends, strict=True)
    assert all(1024 < end - start < len(text) * 0.6 for start, end in spans)
    with pytest.raises(TooLargeError) as refused:
        check_chunked_frames(frames, 1024 * 1024)
    assert refused.value.code == "chunked_message_too_large"
