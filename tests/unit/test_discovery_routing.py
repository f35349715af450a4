"""Discovery routing: FNV-1a vectors, key and round-robin spread, and batch splitting."""

from __future__ import annotations

from collections import Counter

import pytest

from danube.discovery.produce.routing import (
    RECORD_FRAMING_BYTES,
    REQUEST_HEAD_BYTES,
    RoundRobin,
    group,
    route,
    split,
)
from danube.routing import fnv1a_32, partition_for_key

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x811C9DC5),  # the offset basis
        (b"a", 0xE40C292C),
        (b"foobar", 0xBF9CF968),
        ("é".encode(), fnv1a_32(b"\xc3\xa9")),
    ],
)
def test_fnv1a_32_reference_vectors(data: bytes, expected: int) -> None:
    assert fnv1a_32(data) == expected


def test_key_routes_by_hash_of_utf8_mod_n() -> None:
    assert partition_for_key("foobar", 7) == 0xBF9CF968 % 7
    assert partition_for_key("a", 1) == 0
    with pytest.raises(ValueError, match="at least 1"):
        partition_for_key("a", 0)


def test_same_key_same_partition_and_keys_spread() -> None:
    robin = RoundRobin()
    keys: list[str | None] = [f"user-{i}" for i in range(4000)]
    first = route(keys, 8, robin)
    assert route(keys, 8, robin) == first  # deterministic, whatever the robin did
    counts = Counter(first)
    assert set(counts) == set(range(8))
    assert min(counts.values()) > 4000 / 8 * 0.8  # roughly even


def test_keyless_messages_take_turns_across_batches() -> None:
    robin = RoundRobin()
    assert route([None, None, None], 4, robin) == [0, 1, 2]
    assert route([None, None], 4, robin) == [3, 0]
    mixed = route([None, "foobar", None], 4, robin)
    assert mixed == [1, 0xBF9CF968 % 4, 2]


def test_unpartitioned_topic_takes_everything() -> None:
    assert route(["k", None, "x"], 0, RoundRobin()) == [0, 0, 0]


def test_group_keeps_message_order_per_partition() -> None:
    assert group([1, 0, 1, 1, 0]) == {1: [0, 2, 3], 0: [1, 4]}


def test_split_by_count_and_bytes_in_order() -> None:
    sizes = [10] * 7
    by_count = split(2, list(range(7)), sizes, max_request_bytes=10_000, max_records=3)
    assert [c.indexes for c in by_count] == [[0, 1, 2], [3, 4, 5], [6]]
    assert {c.partition for c in by_count} == {2}
    per_record = 10 + RECORD_FRAMING_BYTES
    limit = REQUEST_HEAD_BYTES + 2 * per_record  # two records fit, not three
    by_bytes = split(0, [0, 2, 4, 6], sizes, max_request_bytes=limit, max_records=100)
    assert [c.indexes for c in by_bytes] == [[0, 2], [4, 6]]


def test_split_refuses_a_record_that_fits_no_request() -> None:
    with pytest.raises(ValueError, match="record 1"):
        split(0, [0, 1], [1, 100], max_request_bytes=50, max_records=10)
