"""Producer sessions without I/O: the key layout (a topic and its partitions under one
prefix), ids, the refusal codes, which exclusive producer covers which topic or partition,
the per-instance view of holders (snapshot, watch events, local claims) and the produce
check, and the compares a session's open builds."""

from __future__ import annotations

from typing import Literal

import pytest

from danube.admission.exclusive import ExclusiveView, covers
from danube.admission.sessions import _open_txn, new_producer_id, refusal
from danube.discovery.errors import ConflictError, http_status
from danube.meta import keys
from danube.meta.kv import KeyValue
from danube.meta.txn import Compare, PutOp, Txn, build_request
from danube.meta.watch import WatchEvent
from danube.names import InvalidNameError, TopicName, validate_segment

pytestmark = pytest.mark.unit

ORDERS = TopicName("default", "orders")
P0, P1 = ORDERS.partition_name(0), ORDERS.partition_name(1)
OTHER = TopicName("default", "orders2")
X_ALL = "producers/default/orders/x_all"
X_P1 = "producers/default/orders/x_p1"


def _kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key, value, create_revision=1, mod_revision=1, version=1, lease_id=7)


def _event(kind: Literal["put", "delete"], key: str, value: bytes, revision: int) -> WatchEvent:
    return WatchEvent(kind, key, value, revision, 0 if kind == "delete" else revision, 7)


def test_a_topic_and_its_partitions_share_one_prefix() -> None:
    assert keys.producers_prefix(ORDERS) == keys.producers_prefix(P1) == "producers/default/orders/"
    assert keys.producer_key(ORDERS, "ab12") == "producers/default/orders/all_ab12"
    assert keys.producer_key(P1, "ab12") == "producers/default/orders/p1_ab12"
    assert keys.exclusive_producer_key(ORDERS) == X_ALL
    assert keys.exclusive_producer_key(P1) == X_P1
    assert keys.exclusive_producers_prefix(P1) == "producers/default/orders/x_"
    assert keys.producer_scope_prefix(P1) == "producers/default/orders/p1_"
    # Partition 1's sessions are not partition 10's.
    p10 = keys.producer_key(ORDERS.partition_name(10), "ab")
    assert not p10.startswith(keys.producer_scope_prefix(P1))
    assert not keys.producer_key(OTHER, "ab").startswith(keys.producers_prefix(ORDERS))

    assert keys.parse_producer_key("producers/default/orders/all_ab12") == (ORDERS, "ab12")
    assert keys.parse_producer_key("producers/default/orders/p1_ab12") == (P1, "ab12")
    assert keys.parse_producer_key(X_ALL) == (ORDERS, None)
    assert keys.parse_producer_key(X_P1) == (P1, None)
    for bad in (
        "producers/default/orders",
        "producers/default/orders/q1_ab",
        "producers/d/o/p01_a",
    ):
        with pytest.raises(InvalidNameError):
            keys.parse_producer_key(bad)
    for bad_id in ("", "a/b", "a.b"):
        with pytest.raises(InvalidNameError):
            keys.producer_key(ORDERS, bad_id)


def test_producer_ids_are_short_distinct_segments() -> None:
    ids = {new_producer_id() for _ in range(1000)}
    assert len(ids) == 1000
    for producer_id in ids:
        assert len(producer_id) == 16
        assert validate_segment("producer id", producer_id) == producer_id


def test_refusal_codes() -> None:
    assert refusal("exclusive", holder_exclusive=True).code == "exclusive_producer"
    assert refusal("shared", holder_exclusive=True).code == "exclusive_producer"
    error = refusal("exclusive", holder_exclusive=False)
    assert (error.code, http_status(error)) == ("producer_exists", 409)


def test_what_an_exclusive_producer_covers() -> None:
    # (holder, topic): the whole topic covers every partition; a produce to the whole topic
    # may reach any partition, so a partition's holder covers it too.
    pairs = [(ORDERS, ORDERS), (ORDERS, P1), (P1, P1), (P1, ORDERS), (P1, P0), (ORDERS, OTHER)]
    pairs.append((OTHER.partition_name(1), P1))
    assert [covers(holder, topic) for holder, topic in pairs] == [
        True, True, True, True, False, False, False,
    ]  # fmt: skip


def test_view_from_a_snapshot_then_events() -> None:
    view = ExclusiveView()
    view.reset(
        [
            _kv("producers/default/orders/all_aa", b"{}"),
            _kv(X_ALL, b"aa"),
            _kv("producers/default/orders2/all_bb", b"{}"),
        ],
        revision=10,
    )
    assert (view.holder(ORDERS), view.holder(OTHER), len(view)) == ("aa", None, 1)
    view.check(OTHER, None)  # no holder: anyone produces
    view.check(ORDERS, "aa")
    view.check(P1, "aa")  # the whole topic's holder produces to any partition
    for topic, other in ((ORDERS, None), (ORDERS, "bb"), (P1, None)):
        with pytest.raises(ConflictError) as refused:
            view.check(topic, other)
        assert refused.value.code == "producer_fenced"

    view.apply(_event("delete", X_ALL, b"", 11))
    view.apply(_event("put", "producers/default/orders2/all_cc", b"{}", 12))  # a shared one
    assert (view.holder(ORDERS), view.holder(OTHER), view.seen_revision) == (None, None, 12)
    view.check(ORDERS, None)
    with pytest.raises(InvalidNameError):  # logged and skipped by the follower
        view.apply(_event("put", "producers/bad", b"", 14))

    view.reset([], revision=20)  # a fresh read replaces everything
    assert (len(view), view.seen_revision) == (0, 20)


def test_a_partition_holder_fences_its_partition_and_whole_topic_produces() -> None:
    view = ExclusiveView()
    view.apply(_event("put", X_P1, b"p1holder", 5))
    assert (view.holder(P1), view.holder(ORDERS), view.holders_over(ORDERS)) == (
        "p1holder",
        None,
        ["p1holder"],
    )
    view.check(P0, None)  # another partition is free
    view.check(P1, "p1holder")
    view.check(ORDERS, "p1holder")
    for topic in (P1, ORDERS):
        with pytest.raises(ConflictError):
            view.check(topic, None)
    view.apply(_event("delete", X_P1, b"", 6))
    assert len(view) == 0
    view.check(ORDERS, None)


def test_a_local_claim_is_applied_only_before_the_watch_passes_it() -> None:
    view = ExclusiveView()
    view.reset([], revision=5)
    view.claimed(ORDERS, "aa", revision=6)  # the watch has not delivered 6 yet
    assert view.holder(ORDERS) == "aa"
    view.apply(_event("put", X_ALL, b"aa", 6))
    view.apply(_event("delete", X_ALL, b"", 7))  # closed
    # A claim the watch already passed (and maybe undid) is not applied again.
    view.claimed(ORDERS, "aa", revision=6)
    assert view.holder(ORDERS) is None


def _compares(topic: TopicName, mode: Literal["shared", "exclusive"]) -> list[Compare]:
    return _open_txn(Txn(committer=None), topic, mode).compares  # type: ignore[arg-type]


def test_the_compares_of_an_open() -> None:
    every = "producers/default/orders/"
    holders = "producers/default/orders/x_"
    assert _compares(ORDERS, "exclusive") == [Compare(every, "create_revision", "==", 0, True)]
    assert _compares(ORDERS, "shared") == [Compare(holders, "create_revision", "==", 0, True)]
    absent = [Compare(X_ALL, "create_revision", "==", 0), Compare(X_P1, "create_revision", "==", 0)]
    assert _compares(P1, "shared") == absent
    assert _compares(P1, "exclusive") == [
        *absent,
        Compare("producers/default/orders/all_", "create_revision", "==", 0, True),
        Compare("producers/default/orders/p1_", "create_revision", "==", 0, True),
    ]


def test_a_prefix_compare_and_a_bare_lease_reach_etcd() -> None:
    txn = Txn(committer=None)  # type: ignore[arg-type]
    prefix = keys.producers_prefix(ORDERS)
    txn.if_prefix_empty(prefix).then_put(X_ALL, b"aa", lease=0x1234)
    assert txn.success == [PutOp(X_ALL, b"aa", 0x1234)]
    request = build_request(txn, lambda key: ("/danube/" + key).encode())
    compare = request.compare[0]
    assert compare.key == b"/danube/producers/default/orders/"
    assert compare.range_end == b"/danube/producers/default/orders0"  # "/" + 1
    assert request.success[0].request_put.lease == 0x1234
