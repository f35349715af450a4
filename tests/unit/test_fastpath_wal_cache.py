"""The WAL cache's split of the frames the writer wrote (no CRC computed again) against its
slow twin, framing each payload anew: the same messages held and served; and the split of
any bytes against walk_frames: the run of frames, or None for anything but exactly it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.frame import encode_frame, walk_frames
from danube.ingest.wal.cache import MessageCache, _split
from tests.fastpath import damaged

pytestmark = pytest.mark.unit

_EVERYTHING = 2**63


def _held(cache: MessageCache) -> tuple[list[tuple[int, bytes]], int, int]:
    first = cache.first_offset or 0
    served, _ = cache.fetch(
        first, limit_offset=_EVERYTHING, max_bytes=_EVERYTHING, max_count=_EVERYTHING
    )
    return served, len(cache), cache.payload_bytes


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=5), min_size=1, max_size=4),
    st.integers(0, 8),
    st.integers(0, 200),
    st.integers(0, 2**40),
)
def test_the_writers_frames_are_held_as_frames_made_anew(
    runs: list[list[bytes]], capacity: int, max_bytes: int, first: int
) -> None:
    split, framed = MessageCache(capacity, max_bytes), MessageCache(capacity, max_bytes)
    offset = first
    for payloads in runs:
        written = b"".join(encode_frame(offset + i, p) for i, p in enumerate(payloads))
        split.extend(offset, payloads, written)
        framed.extend(offset, payloads)
        offset += len(payloads)
    assert _held(split) == _held(framed)


def _walked(written: bytes, count: int) -> list[tuple[int, bytes]] | None:
    frames, end = walk_frames(written, max_payload_bytes=2**32 - 1)
    if len(frames) != count or end != len(written):
        return None
    return [(f.offset, bytes(f.data)) for f in frames]


@st.composite
def writes(draw: st.DrawFn) -> tuple[bytes, int]:
    payloads = draw(st.lists(st.binary(max_size=30), max_size=4))
    written = b"".join(encode_frame(i, p) for i, p in enumerate(payloads))
    return draw(damaged(written)), len(payloads) + draw(st.sampled_from([0, 0, 0, -1, 1]))


@settings(max_examples=200, deadline=None)
@given(writes())
def test_the_split_is_the_walk_of_exactly_count_frames(drawn: tuple[bytes, int]) -> None:
    written, count = drawn
    assert _split(written, count) == _walked(written, count)
