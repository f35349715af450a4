"""Decode throughput of a ~100 MB frame stream, printed in MB/s, with a conservative floor."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from danube.frame import FrameDecoder, append_frame, decode_frames

pytestmark = pytest.mark.unit

STREAM_BYTES = 100_000_000
PAYLOAD_BYTES = 1024
CHUNK_BYTES = 1024 * 1024  # what a reader of a WAL segment or an object would feed at a time
# The target is 200 MB/s (measured around 1 GB/s on a laptop); the floor only catches an
# accidental per-byte or per-frame copy, since a shared CI box can be slow for a moment.
FLOOR_MB_PER_S = 50.0


@pytest.fixture(scope="module")
def stream() -> tuple[bytes, int]:
    payload = os.urandom(PAYLOAD_BYTES)
    buf = bytearray()
    count = 0
    while len(buf) < STREAM_BYTES:
        append_frame(buf, count, payload)
        count += 1
    return bytes(buf), count


def best_mb_per_s(decode: Callable[[], int], size_bytes: int, expected: int) -> float:
    """Best of two runs, so that one scheduling hiccup does not decide the result."""
    best_s = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        assert decode() == expected
        best_s = min(best_s, time.perf_counter() - started)
    return size_bytes / 1e6 / best_s


def test_decode_frames_throughput(
    stream: tuple[bytes, int], capsys: pytest.CaptureFixture[str]
) -> None:
    data, count = stream

    def decode() -> int:
        frames, end = decode_frames(data)
        assert end == len(data)
        return len(frames)

    rate = best_mb_per_s(decode, len(data), count)
    with capsys.disabled():
        print(f"\ndecode_frames: {rate:.0f} MB/s over {len(data) / 1e6:.0f} MB, {count} frames")
    assert rate >= FLOOR_MB_PER_S


def test_streaming_decoder_throughput(
    stream: tuple[bytes, int], capsys: pytest.CaptureFixture[str]
) -> None:
    data, count = stream
    view = memoryview(data)

    def decode() -> int:
        decoder, seen = FrameDecoder(), 0
        for start in range(0, len(data), CHUNK_BYTES):
            decoder.feed(view[start : start + CHUNK_BYTES])
            for _frame in decoder:
                seen += 1
        assert decoder.buffered_bytes == 0
        return seen

    rate = best_mb_per_s(decode, len(data), count)
    with capsys.disabled():
        print(f"\nFrameDecoder, 1 MiB chunks: {rate:.0f} MB/s over {len(data) / 1e6:.0f} MB")
    assert rate >= FLOOR_MB_PER_S
