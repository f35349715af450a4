"""The mesh's naming rules in danube.names: segments, limits, topic names, partitions, the error."""

from __future__ import annotations

import pytest

import danube.bus
import danube.meta
from danube.errors import DanubeError
from danube.names import (
    MAX_NAME_CHARS,
    MAX_TOPIC_NAME_CHARS,
    InvalidNameError,
    TopicName,
    topic_name,
    validate_segment,
    validate_user_topic,
)

pytestmark = pytest.mark.unit

ORDERS = TopicName("default", "orders")


# --- the error -----------------------------------------------------------------------


def test_invalid_name_error_is_typed_and_not_retriable() -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_segment("subscription", "a.b")
    error = info.value
    assert isinstance(error, DanubeError)
    assert error.code == "invalid_name"
    assert error.retriable is False
    assert (error.name_kind, error.value) == ("subscription", "a.b")
    assert "letters, digits" in error.reason
    assert error.message == f"invalid subscription 'a.b': {error.reason}"


def test_bus_and_meta_re_export_the_same_objects() -> None:
    # One implementation: a name the bus accepts is a name the key layout accepts, and one
    # `except InvalidNameError` catches what either raises.
    assert danube.bus.TopicName is danube.meta.TopicName is TopicName
    assert danube.bus.InvalidNameError is danube.meta.InvalidNameError is InvalidNameError
    assert danube.bus.topic_name is topic_name


def test_a_huge_value_is_cut_short_in_the_error() -> None:
    with pytest.raises(InvalidNameError) as info:
        TopicName.parse("/default/" + "x" * 100_000)
    assert len(info.value.value) <= 64 + len("...")
    assert info.value.value.endswith("...")


# --- segments ------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["a", "Z", "0", "_", "-", "orders_v2-x", "sales-eu"])
def test_segments_of_letters_digits_underscore_and_dash_are_accepted(good: str) -> None:
    assert validate_segment("namespace", good) == good


@pytest.mark.parametrize(
    "bad", ["", "a.b", "a/b", "a b", "a*", ">", "ordérs", "ä", "orders\n", "a\x00b"]
)
def test_segments_with_anything_else_are_refused(bad: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        validate_segment("topic", bad)
    assert info.value.name_kind == "topic"
    assert info.value.code == "invalid_name"


def test_name_length_limits_are_inclusive() -> None:
    assert MAX_NAME_CHARS == 255
    assert MAX_TOPIC_NAME_CHARS == 255
    assert validate_segment("namespace", "x" * 255) == "x" * 255
    assert len(str(TopicName("a", "x" * 252))) == 255
    with pytest.raises(InvalidNameError, match="longer than 255"):
        validate_segment("subscription", "x" * 256)
    with pytest.raises(InvalidNameError, match="longer than 255"):
        TopicName("ab", "x" * 252)


def test_a_caller_may_set_a_tighter_limit() -> None:
    assert validate_segment("operation", "x" * 64, max_chars=64) == "x" * 64
    with pytest.raises(InvalidNameError, match="longer than 64"):
        validate_segment("operation", "x" * 65, max_chars=64)


# --- topic names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "namespace", "topic"),
    [("/default/orders_v2-x", "default", "orders_v2-x"), ("/sales-eu/orders_v2", "sales-eu",
     "orders_v2"), ("/a_b/c-d", "a_b", "c-d"), ("/a/b-part-03", "a", "b-part-03")],
)  # fmt: skip
def test_topic_name_parses_and_prints_back(name: str, namespace: str, topic: str) -> None:
    parsed = TopicName.parse(name)
    assert (parsed.namespace, parsed.topic) == (namespace, topic)
    assert str(parsed) == name


def test_plain_topic_is_its_own_base_and_parent() -> None:
    name = TopicName.parse("/default/orders_v2-x")
    assert name.partition is None
    assert name.base == "orders_v2-x"
    assert name.parent == name


@pytest.mark.parametrize(
    "bad",
    ["", "/", "orders", "default/orders", "default/orders/", "/default", "/default/", "//orders",
     "/a/", "/a/b/c", "/default/orders/x", "/de.fault/orders", "/def ault/orders",
     "/default/or.ders", "/a/b.c", "/default/or ders", "/default/orders*", "/default/>",
     "/default/ordérs", "/ä/b", "/default/orders\n",
     "/" + "n" * 10 + "/" + "t" * (MAX_TOPIC_NAME_CHARS - 11),  # 256 characters
     "/a/" + "x" * 253, "/x/" + "y" * 253, "/" + "x" * 256 + "/t"],
)  # fmt: skip
def test_invalid_topic_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        TopicName.parse(bad)
    assert info.value.code == "invalid_name"
    assert info.value.retriable is False


def test_longest_topic_name_is_accepted() -> None:
    name = "/" + "n" * 10 + "/" + "t" * (MAX_TOPIC_NAME_CHARS - 12)
    assert len(name) == MAX_TOPIC_NAME_CHARS
    assert str(TopicName.parse(name)) == name
    assert str(TopicName.parse("/x/" + "y" * 252)) == "/x/" + "y" * 252


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(InvalidNameError):
        TopicName("default", "a.b")
    with pytest.raises(InvalidNameError):
        TopicName("", "orders")


def test_topic_name_accepts_a_name_or_its_string_form() -> None:
    assert topic_name(ORDERS) is ORDERS
    assert topic_name("/default/orders") == ORDERS
    with pytest.raises(InvalidNameError):
        topic_name("/default/or.ders")


# --- partitions ----------------------------------------------------------------------


def test_partition_names() -> None:
    part = ORDERS.partition_name(3)
    assert str(part) == "/default/orders-part-3"
    assert (part.base, part.partition) == ("orders", 3)
    assert part.parent == ORDERS
    assert TopicName.parse("/a/b-part-3").partition == 3
    with pytest.raises(InvalidNameError, match="no partitions of its own"):
        part.partition_name(0)
    with pytest.raises(InvalidNameError):
        ORDERS.partition_name(-1)


def test_partitions_of_a_topic() -> None:
    assert ORDERS.partitions(0) == [ORDERS]
    parts = ORDERS.partitions(3)
    assert [str(p) for p in parts] == [
        "/default/orders-part-0",
        "/default/orders-part-1",
        "/default/orders-part-2",
    ]
    assert [p.partition for p in parts] == [0, 1, 2]
    assert all(p.base == "orders" and p.parent == ORDERS for p in parts)
    assert ORDERS.partition is None
    assert ORDERS.parent == ORDERS
    with pytest.raises(InvalidNameError):
        ORDERS.partitions(-1)


@pytest.mark.parametrize(
    "topic",
    ["orders-part-03", "orders-part-01", "orders-part-", "orders-part-x", "-part-1x", "t-part-x"],
)
def test_names_that_only_look_like_partitions_are_plain_topics(topic: str) -> None:
    name = TopicName("default", topic)
    assert name.partition is None
    assert name.base == topic


def test_only_the_last_suffix_makes_a_partition() -> None:
    name = TopicName("ns", "a-part-1-part-2")
    assert (name.base, name.partition) == ("a-part-1", 2)


@pytest.mark.parametrize(
    "topic",
    ["orders-part-03", "orders-part-", "orders-part-x", "a-part--b", "a-part-1x", "part--1"],
)
def test_a_user_may_name_topics_that_only_look_like_partitions(topic: str) -> None:
    assert validate_user_topic(topic) == topic


@pytest.mark.parametrize(
    "topic", ["orders-part-0", "orders-part-3", "x-part--1", "x-part--0", "a-part--1-part--2", ""]
)
def test_a_user_may_not_name_a_partition_nor_a_negative_one(topic: str) -> None:
    with pytest.raises(InvalidNameError) as refused:
        validate_user_topic(topic)
    assert refused.value.code == "invalid_name"
    assert refused.value.name_kind == "topic"
