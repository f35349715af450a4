"""danube.runtime.topic_metrics: the label caps (the first N topics and subscriptions by
name, the rest summed under _other) and gauge snapshots that sum coinciding label sets and
drop the label sets that went away."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from danube.config import MetricsConfig
from danube.names import TopicName
from danube.runtime import topic_metrics
from danube.runtime.topic_metrics import OTHER, GaugeSnapshot, LabelCap

pytestmark = pytest.mark.unit


@pytest.fixture
def caps() -> Iterator[None]:
    """Fresh caps of 2 topics and 1 subscription; the defaults again afterwards."""
    saved = (topic_metrics._TOPICS, topic_metrics._SUBSCRIPTIONS)
    topic_metrics._TOPICS, topic_metrics._SUBSCRIPTIONS = LabelCap(0), LabelCap(0)
    topic_metrics.configure(MetricsConfig(topics_max=2, subscriptions_max=1))
    yield
    topic_metrics._TOPICS, topic_metrics._SUBSCRIPTIONS = saved


def test_a_cap_admits_the_first_values_and_keeps_them() -> None:
    cap = LabelCap(2)
    assert [cap.of(v) for v in ("a", "b", "c", "a", "b", "c")] == ["a", "b", OTHER, "a", "b", OTHER]
    assert cap.admitted == 2
    cap.resize(3)
    assert cap.of("c") == "c"
    assert LabelCap(0).of("a") == OTHER


def test_topics_subscriptions_and_partitions_share_the_topic_cap(caps: None) -> None:
    assert topic_metrics.topic_label("/ns/orders-part-3") == "/ns/orders"  # the topic's name
    assert topic_metrics.partition_labels(TopicName.parse("/ns/orders-part-1")) == (
        "/ns/orders",
        "/ns/orders-part-1",
    )
    assert topic_metrics.topic_label("/ns/b") == "/ns/b"
    assert topic_metrics.topic_label("/ns/c") == OTHER  # the third topic
    part = TopicName.parse("/ns/c-part-0")
    assert topic_metrics.partition_labels(part) == (OTHER, OTHER)
    assert topic_metrics.subscription_labels("/ns/b", "s1") == ("/ns/b", "s1")
    assert topic_metrics.subscription_labels("/ns/b", "s2") == ("/ns/b", OTHER)
    assert topic_metrics.subscription_labels("/ns/c", "s1") == (OTHER, OTHER)


def test_a_snapshot_sums_what_coincides_and_removes_what_went() -> None:
    registry = CollectorRegistry()
    gauge = Gauge("backlog", "test", ["topic"], registry=registry)
    snapshot = GaugeSnapshot(gauge)
    snapshot.publish([(("a",), 3.0), ((OTHER,), 4.0), ((OTHER,), 5.0)])
    assert registry.get_sample_value("backlog", {"topic": "a"}) == 3.0
    assert registry.get_sample_value("backlog", {"topic": OTHER}) == 9.0
    snapshot.publish([((OTHER,), 1.0)])
    assert registry.get_sample_value("backlog", {"topic": "a"}) is None
    assert registry.get_sample_value("backlog", {"topic": OTHER}) == 1.0
