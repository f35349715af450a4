"""Subscription listing from etcd records and live stats: grouping, backlog, live over stored."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from danube.discovery.doors.http.subscriptions import StoredSubscription, group_records, summarize
from danube.meta import KeyValue, TopicName, encode_model
from danube.meta import keys as meta_keys
from danube.meta.records import Owner, SubscriptionConfig, SubscriptionCursor
from danube.wire.dispatcher import protocol

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "orders")
P0, P1 = TOPIC.partitions(2)
CONFIG = SubscriptionConfig(type="shared", initial_position="earliest", created_ms=5)


def _kv(key: str, record: BaseModel) -> KeyValue:
    return KeyValue(key, encode_model(record), 1, 1, 1, 0)


def _cursor(next_offset: int, *acked: int) -> SubscriptionCursor:
    return SubscriptionCursor(next_offset=next_offset, acked_beyond=acked, updated_ms=1)


def test_records_are_grouped_by_subscription_and_an_owner_alone_is_no_subscription() -> None:
    owner = Owner(node_id="d1", epoch=2, assigned_ms=1)
    kvs = [
        _kv(meta_keys.subscription_key(TOPIC, "b"), CONFIG),
        _kv(meta_keys.subscription_owner_key(TOPIC, "b"), owner),
        _kv(meta_keys.subscription_cursor_key(TOPIC, "b", P1), _cursor(4, 6)),
        _kv(meta_keys.subscription_key(TOPIC, "a"), CONFIG),
        # A claim left by a request for a subscription that was never created (or deleted).
        _kv(meta_keys.subscription_owner_key(TOPIC, "ghost"), owner),
    ]
    grouped = group_records(kvs)
    assert list(grouped) == ["a", "b"]
    assert grouped["b"].owner == owner
    assert grouped["b"].cursors == {"orders-part-1": _cursor(4, 6)}
    assert (grouped["a"].owner, grouped["a"].cursors) == (None, {})


def test_a_stored_subscription_backlog_per_partition_and_total() -> None:
    stored = StoredSubscription(
        "s", CONFIG, cursors={"orders-part-0": _cursor(3, 5, 6), "orders-part-1": _cursor(2)}
    )
    out = summarize(TOPIC, stored, [P0, P1], {P0: 10, P1: None}, None)
    rows = [(r.name, r.cursor, r.acked_beyond, r.end_offset, r.backlog) for r in out.partitions]
    assert rows == [
        ("/default/orders-part-0", 3, 2, 10, 5),  # 10 - 3 - 2 acked beyond
        ("/default/orders-part-1", 2, 0, None, None),  # its owner did not answer
    ]
    assert (out.name, out.type, out.backlog, out.owner, out.consumers) == (
        "s",
        "shared",
        5,
        None,
        [],
    )


def test_live_stats_win_over_stored_cursors_and_name_consumers_by_public_id() -> None:
    stored = StoredSubscription("s", CONFIG, cursors={"orders-part-0": _cursor(0)})
    live = protocol.SubscriptionStats(
        type="shared",
        partitions=[
            protocol.PartitionStats(
                partition="orders-part-0",
                next_offset=7,
                read_position=9,
                acked_beyond=1,
                wal_start=0,
                wal_next=9,
                backlog=1,
            )
        ],
        consumers=[protocol.ConsumerStats(consumer_id="abc", name="w", unacked=2)],
    )
    out = summarize(TOPIC, stored, [P0, P1], {P0: 9, P1: 4}, live)
    assert [(r.cursor, r.backlog) for r in out.partitions] == [(7, 1), (None, None)]
    assert out.backlog == 1
    assert [(c.consumer_id, c.name, c.unacked) for c in out.consumers] == [
        ("default.orders.s.abc", "w", 2)
    ]
