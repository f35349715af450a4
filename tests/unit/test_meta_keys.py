"""The etcd key layout (names checked by danube.names), stored record checks, the txn builder."""

from __future__ import annotations

from typing import Any

import pytest

from danube.meta import keys
from danube.meta.errors import MetaDecodeError, MetaRequestError
from danube.meta.kv import VALUE_BYTES_MAX, KeyValue, decode_model, encode_model
from danube.meta.records import Owner, TopicConfig
from danube.meta.txn import TXN_OPS_MAX, Compare, DeleteOp, GetOp, PutOp, Txn, prefix_range_end
from danube.names import InvalidNameError, TopicName

pytestmark = pytest.mark.unit

ORDERS = TopicName("default", "orders")


# --- the key layout ------------------------------------------------------------------


def test_every_key_of_a_partition_and_topic() -> None:
    p0 = ORDERS.partition_name(0)
    assert keys.namespace_key("default") == "namespaces/default"
    assert keys.topic_key(ORDERS) == "topics/default/orders"
    assert keys.partition_owner_key(p0) == "partitions/default/orders-part-0/owner"
    assert keys.partition_state_key(p0) == "partitions/default/orders-part-0/state"
    assert keys.uploader_assignment_key(p0) == "partitions/default/orders-part-0/uploader"
    assert keys.uploader_checkpoint_key(p0) == "storage/default/orders-part-0/checkpoint"
    assert (
        keys.object_descriptor_key(p0, 42)
        == "storage/default/orders-part-0/objects/00000000000000000042"
    )
    assert keys.subscription_key(ORDERS, "billing") == "subscriptions/default/orders/billing/config"
    assert (
        keys.subscription_owner_key(ORDERS, "billing")
        == "subscriptions/default/orders/billing/owner"
    )
    assert (
        keys.subscription_cursor_key(ORDERS, "billing", p0)
        == "subscriptions/default/orders/billing/cursors/orders-part-0"
    )
    assert keys.node_key("ingest", "ip-10-0-0-1.ec2") == "nodes/ingest/ip-10-0-0-1.ec2"
    assert keys.election_key(keys.CONTROLLER_ELECTION) == "elections/controller"


def test_prefixes_end_with_a_slash_so_siblings_never_match() -> None:
    orders2 = TopicName("default", "orders2")
    assert not keys.topic_key(orders2).startswith(keys.partition_prefix(ORDERS))
    assert not keys.object_descriptor_key(orders2, 0).startswith(
        keys.object_descriptors_prefix(ORDERS)
    )
    assert not keys.subscription_key(ORDERS, "billing2").startswith(
        keys.subscription_prefix(ORDERS, "billing")
    )
    assert keys.topic_key(ORDERS).startswith(keys.topics_prefix("default"))
    assert keys.topics_prefix() == "topics/"
    assert keys.nodes_prefix() == "nodes/"
    assert keys.nodes_prefix("uploader") == "nodes/uploader/"


def test_object_descriptor_keys_sort_by_offset() -> None:
    offsets = [0, 9, 10, 99, 100, 12_345, 2**40, keys.OFFSET_MAX]
    by_key = sorted(offsets, key=lambda o: keys.object_descriptor_key(ORDERS, o))
    assert by_key == offsets
    for offset in offsets:
        key = keys.object_descriptor_key(ORDERS, offset)
        assert keys.parse_object_descriptor_key(key) == (ORDERS, offset)


@pytest.mark.parametrize("offset", [-1, 2**64])
def test_offsets_outside_u64_are_refused(offset: int) -> None:
    with pytest.raises(InvalidNameError):
        keys.object_descriptor_key(ORDERS, offset)


@pytest.mark.parametrize(
    "key",
    ["storage/default/orders/objects/42", "storage/default/orders/objects/99999999999999999999",
     "storage/default/orders/objekts/00000000000000000042", "topics/default/orders",
     "storage/default/orders/objects/0000000000000000004x"],
)  # fmt: skip
def test_bad_object_descriptor_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidNameError):
        keys.parse_object_descriptor_key(key)


def test_parsers_invert_the_builders() -> None:
    p3 = ORDERS.partition_name(3)
    assert keys.parse_topic_key(keys.topic_key(ORDERS)) == ORDERS
    assert keys.parse_partition_key(keys.partition_owner_key(p3)) == (p3, "owner")
    assert keys.parse_node_key(keys.node_key("cloud_reader", "n1")) == ("cloud_reader", "n1")
    cursor = keys.subscription_cursor_key(ORDERS, "s", p3)
    assert keys.parse_subscription_key(cursor) == (ORDERS, "s", "cursors/orders-part-3")
    with pytest.raises(InvalidNameError):
        keys.parse_node_key("nodes/broker/n1")  # not a service kind
    with pytest.raises(InvalidNameError):
        keys.parse_topic_key("topics/default")


def test_cursor_key_refuses_a_partition_of_another_topic() -> None:
    other = TopicName("default", "payments").partition_name(0)
    with pytest.raises(InvalidNameError, match="not a partition of /default/orders"):
        keys.subscription_cursor_key(ORDERS, "s", other)


def test_node_ids_allow_dots_but_names_do_not() -> None:
    assert keys.validate_node_id("host.example.com") == "host.example.com"
    with pytest.raises(InvalidNameError):
        keys.namespace_key("a.b")
    with pytest.raises(InvalidNameError):
        keys.node_key("ingest", "a/b")


def test_node_ids_have_the_limits_of_a_name() -> None:
    assert keys.validate_node_id("n" * 255) == "n" * 255
    with pytest.raises(InvalidNameError, match="longer than 255"):
        keys.validate_node_id("n" * 256)
    with pytest.raises(InvalidNameError, match="empty"):
        keys.validate_node_id("")


# --- stored records --------------------------------------------------------------------


def _kv(value: bytes, key: str = "k") -> KeyValue:
    return KeyValue(key, value, 1, 1, 1, 0)


def test_model_round_trip_through_json_bytes() -> None:
    config = TopicConfig(partitions=3, dispatch="non_reliable", created_ms=1_700_000_000_000)
    data = encode_model(config)
    assert data.startswith(b"{")
    assert b'"partitions":3' in data
    assert decode_model(_kv(data), TopicConfig) == config


def test_unknown_fields_are_ignored_for_rolling_upgrades() -> None:
    data = b'{"node_id":"n1","epoch":4,"assigned_ms":5,"added_in_v2":true}'
    assert decode_model(_kv(data), Owner) == Owner(node_id="n1", epoch=4, assigned_ms=5)


@pytest.mark.parametrize(
    ("value", "where"),
    [(b"not json", "value"), (b'{"node_id":"n1","epoch":0,"assigned_ms":1}', "epoch"),
     (b'{"epoch":1,"assigned_ms":1}', "node_id")],
)  # fmt: skip
def test_bad_stored_values_raise_decode_errors_naming_the_key(value: bytes, where: str) -> None:
    with pytest.raises(MetaDecodeError) as info:
        decode_model(_kv(value, key="partitions/ns/t/owner"), Owner)
    assert info.value.key == "partitions/ns/t/owner"
    assert info.value.code == "corrupt_metadata"
    assert where in info.value.reason


# --- transactions ----------------------------------------------------------------------


class _NoCommit:
    async def commit(self, txn: Txn) -> Any:
        raise AssertionError("not sent in unit tests")


def test_txn_builder_records_compares_and_both_branches_in_order() -> None:
    txn = (
        Txn(_NoCommit())
        .if_absent("a")
        .if_mod_revision("b", "==", 7)
        .if_value("c", "!=", b"x")
        .then_put("a", b"1")
        .then_delete("p/", prefix=True)
        .else_get("a")
    )
    assert txn.compares == [
        Compare("a", "create_revision", "==", 0),
        Compare("b", "mod_revision", "==", 7),
        Compare("c", "value", "!=", b"x"),
    ]
    assert txn.success == [PutOp("a", b"1"), DeleteOp("p/", prefix=True)]
    assert txn.failure == [GetOp("a")]


def test_txn_refuses_more_ops_than_etcd_accepts() -> None:
    txn = Txn(_NoCommit())
    for i in range(TXN_OPS_MAX):
        txn.then_put(f"k{i}", b"")
    with pytest.raises(MetaRequestError, match="at most 128"):
        txn.then_put("one-more", b"")


def test_txn_refuses_oversize_values_before_sending() -> None:
    Txn(_NoCommit()).then_put("k", b"x" * VALUE_BYTES_MAX)
    with pytest.raises(MetaRequestError, match="over the"):
        Txn(_NoCommit()).else_put("k", b"x" * (VALUE_BYTES_MAX + 1))


@pytest.mark.parametrize(
    ("prefix", "end"),
    [(b"/danube/a/", b"/danube/a0"), (b"a\xff", b"b"), (b"a\xff\xff", b"b"), (b"\xff", b"\0")],
)
def test_prefix_range_end_covers_exactly_the_prefix(prefix: bytes, end: bytes) -> None:
    assert prefix_range_end(prefix) == end


def test_cursor_key_of_a_subscription_of_one_partition() -> None:
    p1 = ORDERS.partition_name(1)  # Danube's clients subscribe to each partition by name
    assert keys.subscription_cursor_key(p1, "s", p1).endswith(
        "/orders-part-1/s/cursors/orders-part-1"
    )
    with pytest.raises(InvalidNameError):
        keys.subscription_cursor_key(p1, "s", ORDERS.partition_name(2))
