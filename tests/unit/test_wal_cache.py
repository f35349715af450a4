"""The WAL's message cache: count and byte bounds, eviction order, fetch across gaps and limits,
and the frames it serves (checked, offsets in their headers)."""

from __future__ import annotations

import pytest

from danube.frame import verify_frame
from danube.ingest.wal.cache import MessageCache

pytestmark = pytest.mark.unit


def fetch(
    cache: MessageCache, from_offset: int, **limits: int
) -> tuple[list[tuple[int, bytes]], int]:
    """The cache's fetch with each frame checked and opened: ``(offset, payload)``."""
    frames, next_offset = cache.fetch(from_offset, **limits)
    out = []
    for offset, frame in frames:
        assert int.from_bytes(frame[:8], "little") == offset
        out.append((offset, bytes(verify_frame(frame))))
    return out, next_offset


def filled(capacity: int, max_bytes: int, offsets: range) -> MessageCache:
    cache = MessageCache(capacity, max_bytes)
    cache.extend(offsets.start, [str(o).encode() for o in offsets])
    return cache


def test_keeps_the_newest_messages_up_to_its_capacity() -> None:
    cache = filled(4, 1 << 20, range(10))
    assert (len(cache), cache.first_offset, cache.payload_bytes) == (4, 6, 4)
    messages, next_offset = fetch(cache, 6, limit_offset=10, max_bytes=1 << 20, max_count=100)
    assert messages == [(6, b"6"), (7, b"7"), (8, b"8"), (9, b"9")]
    assert next_offset == 10


def test_a_run_larger_than_the_capacity_keeps_only_its_tail() -> None:
    cache = MessageCache(3, 1 << 20)
    cache.extend(100, [b"a", b"b", b"c", b"d", b"e"])
    assert fetch(cache, 102, limit_offset=105, max_bytes=100, max_count=10)[0] == [
        (102, b"c"),
        (103, b"d"),
        (104, b"e"),
    ]


def test_the_byte_bound_evicts_oldest_first() -> None:
    cache = MessageCache(100, 10)
    cache.extend(0, [b"12345", b"12345"])
    cache.extend(2, [b"1"])
    assert (cache.first_offset, cache.payload_bytes) == (1, 6)
    cache.extend(3, [b"x" * 11])  # alone over the bound: nothing can stay
    assert (len(cache), cache.first_offset, cache.payload_bytes) == (0, None, 0)


def test_capacity_zero_holds_nothing() -> None:
    cache = filled(0, 1 << 20, range(5))
    assert (len(cache), cache.first_offset) == (0, None)


def test_fetch_skips_a_gap_and_stops_at_the_limit() -> None:
    cache = MessageCache(10, 1 << 20)
    cache.extend(0, [b"a", b"b"])
    cache.extend(7, [b"h", b"i"])  # offsets 2..6 are a gap (advance_to)
    assert fetch(cache, 3, limit_offset=9, max_bytes=100, max_count=10) == (
        [(7, b"h"), (8, b"i")],
        9,
    )
    # The limit hides what is not durable yet: stop before it.
    assert fetch(cache, 1, limit_offset=8, max_bytes=100, max_count=10) == (
        [(1, b"b"), (7, b"h")],
        8,
    )
    # Nothing below the limit at or after from_offset: skip to the limit.
    assert fetch(cache, 9, limit_offset=12, max_bytes=100, max_count=10) == ([], 12)


def test_fetch_honours_count_and_bytes_but_always_returns_one() -> None:
    cache = filled(10, 1 << 20, range(10, 20))
    assert fetch(cache, 10, limit_offset=20, max_bytes=100, max_count=3) == (
        [(10, b"10"), (11, b"11"), (12, b"12")],
        13,
    )
    assert fetch(cache, 10, limit_offset=20, max_bytes=5, max_count=10) == (
        [(10, b"10"), (11, b"11")],
        12,
    )
    assert fetch(cache, 10, limit_offset=20, max_bytes=1, max_count=10) == ([(10, b"10")], 11)


def test_trim_below_forgets_older_messages() -> None:
    cache = filled(10, 1 << 20, range(10))
    cache.trim_below(7)
    assert (cache.first_offset, len(cache), cache.payload_bytes) == (7, 3, 3)
    cache.clear()
    assert (len(cache), cache.payload_bytes) == (0, 0)
