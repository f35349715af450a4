"""The console's placement count (danube.discovery.doors.http.console.Placement): partitions per
ingest node, under-replicated and leaderless partitions, from partition records alone."""

from __future__ import annotations

import pytest

from danube.discovery.doors.http.console import Placement
from danube.meta import TopicName
from danube.meta.records import Assignment, PartitionState

pytestmark = pytest.mark.unit


def _assignment(*replicas: str) -> Assignment:
    return Assignment(replicas=replicas, assigned_ms=0)


def _state(leader: str, *isr: str) -> PartitionState:
    return PartitionState(leader=leader, leader_epoch=1, isr=isr, updated_ms=0)


def test_counts_leaders_replicas_and_short_partitions() -> None:
    a, b, c = (TopicName("default", f"t-part-{i}") for i in range(3))
    placement = Placement()
    placement.add(a, "assignment", _assignment("i1", "i2"))
    placement.add(a, "state", _state("i1", "i1", "i2"))
    placement.add(a, "owner", None)
    placement.add(b, "assignment", _assignment("i2", "i3"))
    placement.add(b, "state", _state("i2", "i2"))  # i3 fell out of sync
    placement.add(b, "owner", None)
    placement.add(c, "assignment", _assignment("i3"))
    placement.add(c, "state", _state("i3", "i3"))  # no owner: its only replica is down
    placement.add(TopicName("default", "unplaced"), "uploader", None)

    out = placement.out(truncated=False)

    assert (out.partitions, out.under_replicated, out.without_leader) == (3, 1, 1)
    assert [(n.node_id, n.leader_of, n.replica_of) for n in out.nodes] == [
        ("i1", 1, 1),
        ("i2", 1, 2),
        ("i3", 0, 2),
    ]


def test_a_partition_without_state_is_under_replicated() -> None:
    placement = Placement()
    placement.add(TopicName("ns", "t"), "assignment", _assignment("i1"))
    out = placement.out(truncated=True)
    assert (out.partitions, out.under_replicated, out.without_leader, out.truncated) == (
        1,
        1,
        1,
        True,
    )
    assert out.nodes[0].leader_of == 0
