"""Subjects of danube.bus.subjects: building, wildcards, parsing, the prefix and op tokens."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.bus import (
    DispatchOp,
    InvalidNameError,
    InvalidSubjectError,
    Kind,
    Subjects,
    TopicName,
)
from danube.bus.subjects import MAX_OP_CHARS, node_token

pytestmark = pytest.mark.unit

S = Subjects()


def nats_match(pattern: str, subject: str) -> bool:
    """NATS subject matching: '*' is one token, a final '>' is one or more tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


# --- building subjects ---------------------------------------------------------------


def test_subjects_of_a_plain_topic_and_of_a_partition() -> None:
    assert S.produce("/default/orders") == "danube.produce.default.orders._"
    assert S.produce("/default/orders-part-3") == "danube.produce.default.orders.3"
    assert S.live("/default/orders-part-0") == "danube.live.default.orders.0"
    assert S.wal_fetch("/ns/t") == "danube.wal.fetch.ns.t._"
    assert S.wal_drop_below("/ns/t") == "danube.wal.drop.ns.t._"
    assert S.wal_stats("/ns/t-part-12") == "danube.wal.stats.ns.t.12"
    assert S.cloud_fetch("/ns/t") == "danube.cloud.fetch.ns.t._"
    assert S.cloud_offset_for_time("/ns/t-part-2") == "danube.cloud.time.ns.t.2"
    assert S.ownership("/ns/t-part-1") == "danube.ctl.owner.ns.t.1"
    assert S.subscription_ownership("/ns/t", "s1") == "danube.ctl.subowner.ns.t._.s1"
    assert S.subscription_claimed("/ns/t", "s1") == "danube.ctl.subclaimed.ns.t._.s1"
    assert S.dispatch("/ns/t", "sub-1", DispatchOp.POLL) == "danube.disp.ns.t._.sub-1.poll"
    assert S.dispatch_all_ops("/ns/t", "sub-1") == "danube.disp.ns.t._.sub-1.*"


def test_prefix_comes_from_config_and_is_validated() -> None:
    assert Subjects("staging").live("/ns/t") == "staging.live.ns.t._"
    for bad in ["", "a.b", "a*", ">", "a b"]:
        with pytest.raises(InvalidNameError):
            Subjects(bad)


def test_builders_refuse_bad_names() -> None:
    with pytest.raises(InvalidNameError):
        S.produce("/ns/a.b")
    with pytest.raises(InvalidNameError):
        S.dispatch("/ns/t", "sub.x", "poll")
    with pytest.raises(InvalidNameError):
        S.dispatch("/ns/t", "sub", "*")
    with pytest.raises(InvalidNameError):
        S.for_topic(Kind.DISPATCH, "/ns/t")  # needs a subscription and an op


def test_op_tokens_are_segments_of_at_most_64_characters() -> None:
    assert S.dispatch("/ns/t", "s", "x" * MAX_OP_CHARS).endswith("." + "x" * MAX_OP_CHARS)
    with pytest.raises(InvalidNameError, match=f"longer than {MAX_OP_CHARS}"):
        S.dispatch("/ns/t", "s", "x" * (MAX_OP_CHARS + 1))


# --- wildcards -----------------------------------------------------------------------


def test_all_partitions_matches_every_partition_and_nothing_else() -> None:
    pattern = S.all_partitions(Kind.LIVE, "/ns/orders")
    assert pattern == "danube.live.ns.orders.*"
    for i in (0, 1, 17):
        assert nats_match(pattern, S.live(f"/ns/orders-part-{i}"))
    assert not nats_match(pattern, S.live("/ns/orders2-part-0"))
    assert not nats_match(pattern, S.live("/other/orders-part-0"))
    assert not nats_match(pattern, S.produce("/ns/orders-part-0"))


def test_all_partitions_of_a_dispatch_kind_covers_subscription_and_op() -> None:
    pattern = S.all_partitions(Kind.DISPATCH, "/ns/orders")
    assert nats_match(pattern, S.dispatch("/ns/orders-part-2", "s", "ack"))
    assert not nats_match(pattern, S.dispatch("/ns/other-part-2", "s", "ack"))


def test_all_partitions_refuses_a_partition() -> None:
    with pytest.raises(InvalidNameError):
        S.all_partitions(Kind.LIVE, "/ns/orders-part-1")


def test_all_topics_and_all_of_kind() -> None:
    pattern = S.all_topics(Kind.LIVE, "ns")
    assert pattern == "danube.live.ns.>"
    assert nats_match(pattern, S.live("/ns/a"))
    assert nats_match(pattern, S.live("/ns/b-part-4"))
    assert not nats_match(pattern, S.live("/ns2/a"))
    assert not nats_match(pattern, S.wal_fetch("/ns/a"))
    every_fetch = S.all_of_kind(Kind.CLOUD_FETCH)
    assert every_fetch == "danube.cloud.fetch.>"
    assert nats_match(every_fetch, S.cloud_fetch("/x/y-part-9"))
    assert not nats_match(every_fetch, S.wal_fetch("/x/y"))


def test_dispatch_all_ops_matches_each_op_of_one_subscription() -> None:
    pattern = S.dispatch_all_ops("/ns/t", "s1")
    for op in DispatchOp:
        assert nats_match(pattern, S.dispatch("/ns/t", "s1", op))
    assert not nats_match(pattern, S.dispatch("/ns/t", "s2", "poll"))


# --- parsing -------------------------------------------------------------------------


def test_parse_takes_each_kind_apart() -> None:
    for kind in Kind:
        for topic in ("/ns/orders", "/ns/orders-part-7"):
            if kind is Kind.DISPATCH:
                subject = S.dispatch(topic, "sub", "nack")
            elif kind is Kind.SUBSCRIPTION_OWNERSHIP:
                subject = S.subscription_ownership(topic, "sub")
            elif kind is Kind.SUBSCRIPTION_CLAIMED:
                subject = S.subscription_claimed(topic, "sub")
            elif kind is Kind.REPL_READ:
                subject = S.repl_read(topic, "sub")  # the replica's node token
            else:
                subject = S.for_topic(kind, topic)
            parsed = S.parse(subject)
            assert parsed.kind is kind
            assert str(parsed.name) == topic
            assert parsed.namespace == "ns"
            assert parsed.topic == topic.rsplit("/", 1)[1]
            assert parsed.subscription == (None if kind.extra_tokens == 0 else "sub")
            assert parsed.op == ("nack" if kind is Kind.DISPATCH else None)


@pytest.mark.parametrize(
    ("subject", "why"),
    [
        ("other.live.ns.t._", "prefix"),
        ("danube", "no kind"),
        ("danube.nope.ns.t._", "unknown kind"),
        ("danube.wal.ns.t._", "half a kind"),
        ("danube.live.ns.t", "too few tokens"),
        ("danube.live.ns.t._.x", "too many tokens"),
        ("danube.disp.ns.t._.sub", "dispatch without op"),
        ("danube.live.ns.*._", "wildcard"),
        ("danube.live.ns.>", "wildcard"),
        ("danube.live.ns.t.03", "leading zero"),
        ("danube.live.ns.t.-1", "negative partition"),
        ("danube.live.ns.t.x", "bad partition"),
        ("danube.live.ns.t-part-3._", "a partition written as a plain topic"),
        ("danube.live..t._", "empty namespace"),
    ],
)
def test_parse_refuses_what_is_not_a_mesh_subject(subject: str, why: str) -> None:
    with pytest.raises(InvalidSubjectError) as info:
        S.parse(subject)
    assert info.value.code == "invalid_subject", why
    assert info.value.subject == subject


segment = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
    min_size=1,
    max_size=40,
)


@given(
    namespace=segment,
    topic=segment,
    partition=st.none() | st.integers(min_value=0, max_value=100_000),
    kind=st.sampled_from([k for k in Kind if k.extra_tokens == 0]),
)
def test_every_valid_name_round_trips_through_its_subject(
    namespace: str, topic: str, partition: int | None, kind: Kind
) -> None:
    name = TopicName(namespace, topic)
    if partition is not None and name.partition is None:
        name = name.partition_name(partition)
    parsed = S.parse(S.for_topic(kind, name))
    assert parsed.kind is kind
    assert parsed.name == name


def test_repl_read_addresses_one_node_by_a_token() -> None:
    assert S.repl_read("/ns/t-part-2", "ingest-0") == "danube.repl.read.ns.t.2.ingest-0"
    assert S.parse(S.repl_read("/ns/t", "ingest-0")).subscription == "ingest-0"
    # A node id that is no segment (dots, spaces) is named by a stable hash of itself.
    dotted = S.repl_read("/ns/t", "ingest.example.org")
    assert dotted == S.repl_read("/ns/t", "ingest.example.org")
    assert dotted.startswith("danube.repl.read.ns.t._.n-")
    assert dotted.count(".") == 6
    assert node_token("a.b") != node_token("a.c")
