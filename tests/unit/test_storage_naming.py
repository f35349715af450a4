"""Object keys: their exact shape, round trips through parse, offset order, and what is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.errors import DanubeError
from danube.storage import (
    InvalidObjectKeyError,
    ObjectName,
    StorageError,
    normalize_root,
    object_key,
    parse_object_key,
    topic_prefix,
)
from danube.storage.naming import MAX_OFFSET

pytestmark = pytest.mark.unit

offsets = st.integers(min_value=0, max_value=MAX_OFFSET)
names = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)


def test_key_has_the_documented_shape() -> None:
    key = object_key("/danube-data", "default", "orders-part-0", 0, 41)
    assert key == (
        "danube-data/topics/default/orders-part-0/00000000000000000000-00000000000000000041.dnb"
    )


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        ("/danube-data", "danube-data/topics/ns/t/"),
        ("danube-data/", "danube-data/topics/ns/t/"),
        ("/a/b/c/", "a/b/c/topics/ns/t/"),
        ("/", "topics/ns/t/"),
        ("", "topics/ns/t/"),
    ],
)
def test_root_prefix_loses_its_outer_slashes(root: str, expected: str) -> None:
    assert topic_prefix(root, "ns", "t") == expected
    assert object_key(root, "ns", "t", 5, 5).startswith(expected)


def test_largest_offset_fits_the_padding() -> None:
    key = object_key("r", "ns", "t", MAX_OFFSET, MAX_OFFSET)
    assert key.endswith(f"{MAX_OFFSET}-{MAX_OFFSET}.dnb")
    assert parse_object_key(key) == ObjectName("ns", "t", MAX_OFFSET, MAX_OFFSET)


@given(
    root=st.sampled_from(["", "/x", "/danube-data", "a/topics/b"]),
    ns=names,
    topic=names,
    start=offsets,
    length=st.integers(min_value=0, max_value=10**6),
)
def test_parse_inverts_object_key(root: str, ns: str, topic: str, start: int, length: int) -> None:
    end = min(start + length, MAX_OFFSET)
    key = object_key(root, ns, topic, start, end)
    parsed = parse_object_key(key, root_prefix=root)
    assert parsed == ObjectName(ns, topic, start, end)
    assert (parsed.ns, parsed.topic, parsed.start_offset, parsed.end_offset) == (
        ns,
        topic,
        start,
        end,
    )


@given(ranges=st.lists(st.tuples(offsets, offsets).map(sorted), min_size=2, max_size=30))
def test_keys_of_a_topic_sort_by_offset(ranges: list[list[int]]) -> None:
    keys = [object_key("/danube-data", "ns", "t", start, end) for start, end in ranges]
    by_text = [parse_object_key(key) for key in sorted(keys)]
    by_offset = sorted(by_text, key=lambda name: (name.start_offset, name.end_offset))
    assert by_text == by_offset


def test_start_after_end_is_refused() -> None:
    with pytest.raises(InvalidObjectKeyError, match="after end offset") as info:
        object_key("r", "ns", "t", 10, 9)
    assert info.value.code == "invalid_object_key"
    assert not info.value.retriable
    assert isinstance(info.value, StorageError)
    assert isinstance(info.value, DanubeError)


@pytest.mark.parametrize(
    ("ns", "topic", "start", "end"),
    [
        ("", "t", 0, 1),
        ("ns", "", 0, 1),
        ("n/s", "t", 0, 1),
        ("ns", "t.x", 0, 1),
        ("ns", "t", -1, 1),
        ("ns", "t", 0, MAX_OFFSET + 1),
        ("ns", "t", True, 1),
    ],
)
def test_bad_parts_are_refused(ns: str, topic: str, start: int, end: int) -> None:
    with pytest.raises(InvalidObjectKeyError):
        object_key("r", ns, topic, start, end)


@pytest.mark.parametrize("root", ["a//b", "/a/../b", "./a", "a/\x00"])
def test_bad_roots_are_refused(root: str) -> None:
    with pytest.raises(InvalidObjectKeyError):
        normalize_root(root)
    with pytest.raises(InvalidObjectKeyError):
        object_key(root, "ns", "t", 0, 0)


@pytest.mark.parametrize(
    "key",
    [
        "",
        "00000000000000000000-00000000000000000001.dnb",
        "r/topic/ns/t/00000000000000000000-00000000000000000001.dnb",  # "topic", not "topics"
        "r/topics/ns/t/0-1.dnb",  # not padded
        "r/topics/ns/t/00000000000000000000-00000000000000000001.dat",
        "r/topics/ns/t/00000000000000000000-00000000000000000001.dnb/",
        "r/topics/ns/t/00000000000000000000_00000000000000000001.dnb",
        "r/topics/ns/t/00000000000000000002-00000000000000000001.dnb",  # start > end
        "r/topics/ns/t/99999999999999999999-99999999999999999999.dnb",  # over u64
        "r/topics/n.s/t/00000000000000000000-00000000000000000001.dnb",
        "/r/topics/ns/t/00000000000000000000-00000000000000000001.dnb",  # leading slash
        "r//topics/ns/t/00000000000000000000-00000000000000000001.dnb",
    ],
)
def test_parse_refuses_what_object_key_cannot_make(key: str) -> None:
    with pytest.raises(InvalidObjectKeyError) as info:
        parse_object_key(key)
    assert info.value.key == key


def test_parse_checks_the_root_when_given() -> None:
    key = object_key("/danube-data", "ns", "t", 1, 2)
    assert parse_object_key(key, root_prefix="danube-data/").start_offset == 1
    with pytest.raises(InvalidObjectKeyError, match="not under root prefix"):
        parse_object_key(key, root_prefix="/other")


def test_root_may_contain_a_topics_segment() -> None:
    key = object_key("/topics/topics", "topics", "topics", 3, 4)
    assert parse_object_key(key, root_prefix="topics/topics") == ObjectName(
        "topics", "topics", 3, 4
    )
