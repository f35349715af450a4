"""Producer sessions without I/O: the key layout, ids, the refusal codes, the per-instance
view of exclusive holders (snapshot, watch events, local claims) and the produce check, and
the transaction a session's open builds."""

from __future__ import annotations

import pytest

from danube.discovery.errors import ConflictError
from danube.discovery.producers import ExclusiveView, new_producer_id, refusal
from danube.meta import keys
from danube.meta.kv import KeyValue
from danube.meta.txn import Compare, PutOp, Txn, build_request
from danube.meta.watch import WatchEvent
from danube.names import InvalidNameError, TopicName, validate_segment

pytestmark = pytest.mark.unit

ORDERS = TopicName("default", "orders")
OTHER = TopicName("default", "orders2")
EXCL = "producers/default/orders/exclusive"


def _kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key, value, create_revision=1, mod_revision=1, version=1, lease_id=7)


def _event(kind: str, key: str, value: bytes, revision: int) -> WatchEvent:
    return WatchEvent(kind, key, value, revision, 0 if kind == "delete" else revision, 7)  # type: ignore[arg-type]


def test_keys_of_a_topic_producers() -> None:
    assert keys.producers_prefix(ORDERS) == "producers/default/orders/"
    assert keys.producer_key(ORDERS, "ab12") == "producers/default/orders/ab12"
    assert keys.exclusive_producer_key(ORDERS) == EXCL
    assert keys.parse_producer_key("producers/default/orders/ab12") == (ORDERS, "ab12")
    assert keys.parse_producer_key(EXCL) == (ORDERS, "exclusive")
    assert not keys.exclusive_producer_key(OTHER).startswith(keys.producers_prefix(ORDERS))
    with pytest.raises(InvalidNameError):
        keys.producer_key(ORDERS, "exclusive")  # reserved for the holder key
    for bad in ("", "a/b", "a.b"):
        with pytest.raises(InvalidNameError):
            keys.producer_key(ORDERS, bad)
    with pytest.raises(InvalidNameError):
        keys.parse_producer_key("producers/default/orders")


def test_producer_ids_are_short_distinct_segments() -> None:
    ids = {new_producer_id() for _ in range(1000)}
    assert len(ids) == 1000
    for producer_id in ids:
        assert len(producer_id) == 16
        assert validate_segment("producer id", producer_id) == producer_id
        assert producer_id != keys.EXCLUSIVE_PRODUCER


def test_refusal_codes() -> None:
    assert refusal("exclusive", holder_exclusive=True).code == "exclusive_producer"
    assert refusal("shared", holder_exclusive=True).code == "exclusive_producer"
    error = refusal("exclusive", holder_exclusive=False)
    assert (error.code, error.status) == ("producer_exists", 409)


def test_view_from_a_snapshot_then_events() -> None:
    view = ExclusiveView()
    view.reset(
        [
            _kv("producers/default/orders/aa", b"{}"),
            _kv(EXCL, b"aa"),
            _kv("producers/default/orders2/bb", b"{}"),
        ],
        revision=10,
    )
    assert (view.holder(ORDERS), view.holder(OTHER), len(view)) == ("aa", None, 1)
    view.check(OTHER, None)  # no holder: anyone produces
    view.check(ORDERS, "aa")
    for other in (None, "bb"):
        with pytest.raises(ConflictError) as refused:
            view.check(ORDERS, other)
        assert refused.value.code == "producer_fenced"

    view.apply(_event("delete", EXCL, b"", 11))
    view.apply(_event("put", "producers/default/orders2/cc", b"{}", 12))  # a shared one
    assert (view.holder(ORDERS), view.holder(OTHER), view.seen_revision) == (None, None, 12)
    view.check(ORDERS, None)
    view.apply(_event("put", "producers/default/orders2/exclusive", b"cc", 13))
    assert view.holder(OTHER) == "cc"
    with pytest.raises(InvalidNameError):  # logged and skipped by the follower
        view.apply(_event("put", "producers/bad", b"", 14))

    view.reset([], revision=20)  # a fresh read replaces everything
    assert (view.holder(OTHER), len(view), view.seen_revision) == (None, 0, 20)


def test_a_local_claim_is_applied_only_before_the_watch_passes_it() -> None:
    view = ExclusiveView()
    view.reset([], revision=5)
    view.claimed(ORDERS, "aa", revision=6)  # the watch has not delivered 6 yet
    assert view.holder(ORDERS) == "aa"
    view.apply(_event("put", EXCL, b"aa", 6))
    view.apply(_event("delete", EXCL, b"", 7))  # closed
    # A claim the watch already passed (and maybe undid) is not applied again.
    view.claimed(ORDERS, "aa", revision=6)
    assert view.holder(ORDERS) is None


def test_an_exclusive_open_compares_the_whole_prefix() -> None:
    txn = Txn(committer=None)  # type: ignore[arg-type]
    prefix = keys.producers_prefix(ORDERS)
    txn.if_prefix_empty(prefix).then_put(EXCL, b"aa", lease=0x1234)
    assert txn.compares == [Compare(prefix, "create_revision", "==", 0, prefix=True)]
    assert txn.success == [PutOp(EXCL, b"aa", 0x1234)]
    request = build_request(txn, lambda key: ("/danube/" + key).encode())
    compare = request.compare[0]
    assert compare.key == b"/danube/producers/default/orders/"
    assert compare.range_end == b"/danube/producers/default/orders0"  # "/" + 1
    assert request.success[0].request_put.lease == 0x1234
