"""The controller's pure plan: replica sets of deleted partitions forgotten, none moved; the
Assignment record's own checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from danube.discovery.controller.assignment import ClusterView, partitions_of, plan, replica_counts
from danube.meta import keys
from danube.meta.records import Assignment, TopicConfig
from danube.names import TopicName

pytestmark = pytest.mark.unit


def test_partitions_of_expands_partitioned_topics_and_keeps_plain_ones() -> None:
    topics = {
        TopicName("default", "a"): TopicConfig(partitions=0, created_ms=1),
        TopicName("ns", "b"): TopicConfig(partitions=3, created_ms=1),
    }
    assert partitions_of(topics) == {
        TopicName("default", "a"),
        TopicName("ns", "b-part-0"),
        TopicName("ns", "b-part-1"),
        TopicName("ns", "b-part-2"),
    }


def test_replica_sets_of_deleted_partitions_are_forgotten_and_none_moves() -> None:
    kept, gone = TopicName("default", "kept"), TopicName("default", "gone")
    view = ClusterView(
        frozenset([kept]),
        {"node-b": None},  # node-a, holding both, is dead: nothing moves to node-b
        {kept: ("node-a",), gone: ("node-a", "node-b")},
    )
    result = plan(view)
    assert result.unassign == (gone,)
    assert not plan(ClusterView(frozenset([kept]), {}, {kept: ("node-a",)})).unassign
    assert plan(ClusterView(frozenset([kept]), {}, {})).empty


def test_replica_counts_count_every_replica_and_idle_nodes() -> None:
    a, b = TopicName("default", "a"), TopicName("default", "b")
    counted = replica_counts({a: ("n1", "n2"), b: ("n2", "n3")}, ["n1", "n2", "n3", "n4"])
    assert counted == {"n1": 1, "n2": 2, "n3": 1, "n4": 0}


def test_an_assignment_needs_distinct_replicas_and_a_reachable_min_insync() -> None:
    record = Assignment(replicas=("a", "b", "c"), min_insync_replicas=2, assigned_ms=5)
    assert Assignment.model_validate_json(record.model_dump_json()) == record
    with pytest.raises(ValidationError, match="distinct"):
        Assignment(replicas=("a", "a"), assigned_ms=1)
    with pytest.raises(ValidationError, match="min_insync_replicas"):
        Assignment(replicas=("a",), min_insync_replicas=2, assigned_ms=1)
    with pytest.raises(ValidationError):
        Assignment(replicas=(), assigned_ms=1)
    key = keys.partition_assignment_key(TopicName("default", "t-part-0"))
    assert key == "partitions/default/t-part-0/assignment"
