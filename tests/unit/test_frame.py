"""Frame encoding, the streaming decoder and the scan helper: round trips, flips, truncations."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from danube.errors import DanubeError
from danube.frame import (
    FRAME_HEADER_BYTES,
    MAX_FRAME_PAYLOAD_BYTES,
    CorruptFrameError,
    Frame,
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
    RawFrame,
    append_frame,
    decode_frames,
    encode_frame,
    scan_frames,
    verify_frame,
    walk_frames,
)

pytestmark = pytest.mark.unit

offsets = st.integers(min_value=0, max_value=2**64 - 1)
payloads = st.binary(max_size=300)
frame_lists = st.lists(st.tuples(offsets, payloads), max_size=8)

# Representative streams for the exhaustive flip and cut tests: empty, tiny and larger payloads.
SAMPLES = [(0, b""), (7, b"x"), (2**64 - 1, bytes(range(40))), (123_456, b"\x00" * 17)]


def stream_of(frames: list[tuple[int, bytes]]) -> bytes:
    buf = bytearray()
    for offset, payload in frames:
        append_frame(buf, offset, payload)
    return bytes(buf)


def as_pairs(frames: list[Frame]) -> list[tuple[int, bytes]]:
    return [(frame.offset, bytes(frame.payload)) for frame in frames]


def boundaries(frames: list[tuple[int, bytes]]) -> list[int]:
    """Stream positions where each frame ends."""
    ends, pos = [], 0
    for _, payload in frames:
        pos += FRAME_HEADER_BYTES + len(payload)
        ends.append(pos)
    return ends


def test_layout_matches_the_documented_bytes() -> None:
    frame = encode_frame(0x0102030405060708, b"hello")
    header = struct.pack("<QI", 0x0102030405060708, 5)
    # The CRC covers offset and length, then the payload (docs/formats.md).
    assert frame == header + struct.pack("<I", crc32c(header + b"hello")) + b"hello"
    assert FRAME_HEADER_BYTES == 16


def test_zero_filled_tail_is_not_an_empty_frame() -> None:
    # With a payload-only CRC, 16 zero bytes would read as a valid empty frame at offset 0.
    with pytest.raises(CorruptFrameError):
        decode_frames(bytes(FRAME_HEADER_BYTES))


@given(frame_lists)
def test_round_trip_through_decode_frames(frames: list[tuple[int, bytes]]) -> None:
    stream = stream_of(frames)
    decoded, end = decode_frames(stream)
    assert as_pairs(decoded) == frames
    assert end == len(stream)
    assert sum(frame.size_bytes for frame in decoded) == len(stream)


@given(frame_lists, st.lists(st.integers(min_value=1, max_value=64), min_size=1))
def test_round_trip_through_the_decoder_whatever_the_chunking(
    frames: list[tuple[int, bytes]], chunk_sizes: list[int]
) -> None:
    stream = stream_of(frames)
    decoder = FrameDecoder()
    decoded: list[Frame] = []
    pos, i = 0, 0
    while pos < len(stream):
        size = chunk_sizes[i % len(chunk_sizes)]
        decoder.feed(bytearray(stream[pos : pos + size]))
        pos, i = pos + size, i + 1
        decoded.extend(decoder)
    assert as_pairs(decoded) == frames
    assert decoder.buffered_bytes == 0
    assert decoder.position == len(stream)


@given(offsets, payloads)
def test_append_frame_writes_what_encode_frame_returns(offset: int, payload: bytes) -> None:
    buf = bytearray(b"prefix")
    size = append_frame(buf, offset, memoryview(payload))
    assert bytes(buf) == b"prefix" + encode_frame(offset, payload)
    assert size == len(buf) - len(b"prefix")


@pytest.mark.parametrize("offset", [-1, 2**64])
def test_encode_rejects_offsets_outside_u64(offset: int) -> None:
    with pytest.raises(FrameError, match="offset"):
        encode_frame(offset, b"")
    buf = bytearray(b"kept")
    with pytest.raises(FrameError):
        append_frame(buf, offset, b"")
    assert buf == b"kept"


def test_encode_rejects_payload_over_the_limit() -> None:
    encode_frame(1, b"abcd", max_payload_bytes=4)
    with pytest.raises(FrameTooLargeError) as info:
        encode_frame(1, b"abcde", max_payload_bytes=4)
    assert (info.value.size_bytes, info.value.limit_bytes) == (5, 4)
    assert info.value.code == "frame_too_large"
    assert isinstance(info.value, DanubeError)
    with pytest.raises(FrameTooLargeError):
        encode_frame(1, bytes(MAX_FRAME_PAYLOAD_BYTES + 1))


def test_length_over_the_limit_in_a_header_is_corruption() -> None:
    good = encode_frame(1, b"ok")
    # A header alone, announcing more than the limit: corrupt at once, not "wait for more".
    bad = struct.pack("<QII", 9, MAX_FRAME_PAYLOAD_BYTES + 1, 0)
    with pytest.raises(CorruptFrameError) as info:
        decode_frames(good + bad)
    assert (info.value.position, info.value.offset) == (len(good), 9)
    assert "exceeds the limit" in str(info.value)
    with pytest.raises(CorruptFrameError):
        decode_frames(encode_frame(1, b"12345"), max_payload_bytes=4)


def decode_outcome(stream: bytes) -> tuple[list[tuple[int, bytes]], str]:
    """Decode with both readers, check they agree, and name the outcome."""
    decoder = FrameDecoder()
    decoder.feed(stream)
    streamed: list[Frame] = []
    try:
        for frame in decoder:
            streamed.append(frame)
    except CorruptFrameError:
        streamed_outcome = "corrupt"
    else:
        streamed_outcome = "incomplete" if decoder.buffered_bytes else "clean"
    try:
        frames, end = decode_frames(stream)
    except CorruptFrameError:
        outcome = "corrupt"
    else:
        outcome = "incomplete" if end < len(stream) else "clean"
        assert as_pairs(frames) == as_pairs(streamed)
    assert outcome == streamed_outcome
    return as_pairs(streamed), outcome


@pytest.mark.parametrize("alone", [True, False], ids=["alone", "in_a_stream"])
@pytest.mark.parametrize("index", range(len(SAMPLES)))
@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_single_byte_flip_inside_a_frame_is_detected(
    alone: bool, index: int, mask: int
) -> None:
    frames = [SAMPLES[index]] if alone else SAMPLES
    target = 0 if alone else index
    stream = stream_of(frames)
    end = boundaries(frames)[target]
    start = end - FRAME_HEADER_BYTES - len(frames[target][1])
    length_field = range(start + 8, start + 12)
    for pos in range(start, end):
        flipped = bytearray(stream)
        flipped[pos] ^= mask
        decoded, outcome = decode_outcome(bytes(flipped))
        # The flipped frame is never yielded; the frames before it always are.
        assert decoded == frames[:target], pos
        if outcome != "corrupt":
            # Only a length flipped beyond the bytes present can pass for an incomplete tail.
            assert outcome == "incomplete", pos
            assert pos in length_field, pos
            (length,) = struct.unpack_from("<I", flipped, start + 8)
            assert start + FRAME_HEADER_BYTES + length > len(flipped)


def test_every_truncation_point_decodes_as_an_incomplete_tail() -> None:
    stream = stream_of(SAMPLES)
    ends = [0, *boundaries(SAMPLES)]
    for cut in range(len(stream) + 1):
        whole = max(i for i, end in enumerate(ends) if end <= cut)
        decoded, outcome = decode_outcome(stream[:cut])
        assert decoded == SAMPLES[:whole], cut
        assert outcome == ("clean" if cut == ends[whole] else "incomplete"), cut
        scan = scan_frames(stream[:cut])
        assert (scan.good_end, scan.tail_bytes, scan.error) == (
            ends[whole],
            cut - ends[whole],
            None,
        )


def test_scan_reports_the_last_good_frame_before_a_torn_tail() -> None:
    stream = stream_of(SAMPLES)
    scan = scan_frames(stream + encode_frame(99, b"torn payload")[:-3])
    assert scan.good_end == len(stream)
    assert (scan.frame_count, scan.first_offset, scan.last_offset) == (4, 0, 123_456)
    assert scan.tail_bytes == FRAME_HEADER_BYTES + len(b"torn payload") - 3
    assert scan.error is None


@pytest.mark.parametrize("garbage", [b"\xff" * 40, bytes(64), b"\x01" * 16])
def test_scan_reports_the_last_good_frame_before_garbage(garbage: bytes) -> None:
    stream = stream_of(SAMPLES)
    scan = scan_frames(stream + garbage)
    assert (scan.good_end, scan.frame_count, scan.tail_bytes) == (len(stream), 4, len(garbage))
    assert scan.error is not None
    assert scan.error.position == len(stream)


def test_scan_of_many_frames_and_from_a_start_position() -> None:
    frames = [(n, n.to_bytes(4, "little")) for n in range(10_000)]
    stream = b"junk" + stream_of(frames)
    scan = scan_frames(stream, 4)
    assert (scan.good_end, scan.frame_count, scan.tail_bytes) == (len(stream), 10_000, 0)
    assert (scan.first_offset, scan.last_offset) == (0, 9_999)
    empty = scan_frames(b"")
    assert (empty.good_end, empty.frame_count, empty.first_offset) == (0, 0, None)


def test_decoder_reports_stream_positions_and_stays_broken_after_corruption() -> None:
    good = stream_of(SAMPLES[:2])
    bad = bytearray(encode_frame(5, b"payload"))
    bad[-1] ^= 1
    decoder = FrameDecoder(position=1000)
    decoder.feed(good + bytes(bad))
    seen: list[Frame] = []
    frames = iter(decoder)
    seen.extend(next(frames) for _ in range(2))
    with pytest.raises(CorruptFrameError) as info:
        next(frames)
    assert as_pairs(seen) == SAMPLES[:2]
    assert (info.value.position, info.value.offset) == (1000 + len(good), 5)
    assert "crc mismatch" in info.value.message
    decoder.feed(encode_frame(6, b"later"))
    with pytest.raises(CorruptFrameError):
        list(decoder)


def test_decoder_loses_no_frame_when_the_consumer_stops_early() -> None:
    decoder = FrameDecoder()
    decoder.feed(stream_of(SAMPLES))
    first = next(iter(decoder))
    assert first.offset == SAMPLES[0][0]
    assert as_pairs(list(decoder)) == SAMPLES[1:]


def test_decoder_payloads_outlive_later_feeds_and_caller_buffer_reuse() -> None:
    big = bytes(range(256)) * 4
    stream = stream_of([(1, big), (2, b"tail")])
    buf = bytearray(stream[:700])
    decoder = FrameDecoder(max_payload_bytes=2048)
    decoder.feed(buf)
    assert list(decoder) == []
    assert decoder.buffered_bytes == 700
    buf[:] = b"\x00" * len(buf)  # the caller reuses its buffer: the decoder kept a copy
    decoder.feed(stream[700:])
    frames = list(decoder)
    decoder.feed(encode_frame(3, b"more"))
    assert [bytes(f.payload) for f in [*frames, *decoder]] == [big, b"tail", b"more"]
    assert frames[0].payload.readonly


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_payload_bytes"):
        FrameDecoder(max_payload_bytes=-1)
    with pytest.raises(ValueError, match="max_payload_bytes"):
        decode_frames(b"", max_payload_bytes=2**32)


def test_start_outside_the_buffer_is_refused() -> None:
    stream = encode_frame(1, b"x")
    assert decode_frames(stream, len(stream)) == ([], len(stream))
    with pytest.raises(ValueError, match="start"):
        decode_frames(stream, len(stream) + 1)
    with pytest.raises(ValueError, match="start"):
        scan_frames(stream, -1)


def test_walk_frames_splits_whole_frames_without_copying_or_checking() -> None:
    """A hop splits frames by their headers: views of the buffer, a partial tail left, a
    flipped payload bit carried (found by verify_frame, where the record is decoded)."""
    buf = bytearray(encode_frame(7, b"abc") + encode_frame(8, b"") + encode_frame(9, b"xy"))
    buf[FRAME_HEADER_BYTES + 1] ^= 0x01  # a payload bit of offset 7
    frames, end = walk_frames(bytes(buf[:-1]))  # offset 9 cut short
    assert [(f.offset, bytes(f.data)) for f in frames] == [
        (7, bytes(buf[: FRAME_HEADER_BYTES + 3])),
        (8, encode_frame(8, b"")),
    ]
    assert end == 2 * FRAME_HEADER_BYTES + 3
    assert frames[1].data.obj is not None  # a view, not a copy
    assert bytes(verify_frame(frames[1].data)) == b""
    with pytest.raises(CorruptFrameError):
        verify_frame(frames[0].data)
    with pytest.raises(CorruptFrameError):
        verify_frame(encode_frame(1, b"abc")[:-1])  # the header's length disagrees
    with pytest.raises(CorruptFrameError):
        walk_frames(encode_frame(1, b"abcd"), max_payload_bytes=3)


@given(frame_lists, st.lists(st.integers(min_value=1, max_value=64), min_size=1))
def test_decoder_whole_frames_are_the_fed_bytes_whatever_the_chunking(
    frames: list[tuple[int, bytes]], chunk_sizes: list[int]
) -> None:
    """The whole-frame mode yields each frame as it lies in the stream, header and CRC
    included, views of the decoder's blocks that later feeds leave intact."""
    stream = stream_of(frames)
    decoder = FrameDecoder()
    taken: list[RawFrame] = []
    pos, i = 0, 0
    while pos < len(stream):
        size = chunk_sizes[i % len(chunk_sizes)]
        decoder.feed(bytearray(stream[pos : pos + size]))
        pos, i = pos + size, i + 1
        taken.extend(decoder.whole_frames())
    assert [f.offset for f in taken] == [offset for offset, _ in frames]
    assert b"".join(bytes(f.data) for f in taken) == stream
    assert [bytes(verify_frame(f.data)) for f in taken] == [p for _, p in frames]
    assert decoder.position == len(stream)


def test_decoder_whole_frames_are_checked_and_lose_nothing_when_stopped_early() -> None:
    good = stream_of(SAMPLES)
    bad = bytearray(encode_frame(5, b"payload"))
    bad[-1] ^= 1
    decoder = FrameDecoder(position=1000)
    decoder.feed(good + bytes(bad))
    first = next(decoder.whole_frames())
    assert first.data.readonly
    rest = decoder.whole_frames()
    taken = [first, *(next(rest) for _ in SAMPLES[1:])]
    assert b"".join(bytes(f.data) for f in taken) == good
    with pytest.raises(CorruptFrameError) as info:
        next(rest)  # never yielded: a frame whose CRC fails
    assert (info.value.position, info.value.offset) == (1000 + len(good), 5)
    with pytest.raises(CorruptFrameError):
        list(decoder)  # broken for both modes
