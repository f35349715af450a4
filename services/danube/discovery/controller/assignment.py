"""What the controller changes about partition replicas: pure, no I/O.

Since replication (docs/replication.md) a partition's replica set is written once, when the
partition is first produced to (by the ingest node that answers the claim request), and then
only by an operator: the controller never moves a replica on its own — a partition whose
replicas are gone waits for them (or for an operator) rather than starting an empty log
elsewhere. What is left for the controller is to **forget** the replica sets (and the
leadership state) of partitions whose topic no longer exists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from danube.meta.records import TopicConfig
from danube.names import TopicName


@dataclass(frozen=True)
class ClusterView:
    """What the controller knows at one moment: the partitions that exist, the live
    ingest nodes with their load, and each partition's replica set."""

    partitions: frozenset[TopicName]
    nodes: Mapping[str, float | None]
    assignments: Mapping[TopicName, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """The changes to make: forget ``unassign`` (its assignment and state keys)."""

    unassign: tuple[TopicName, ...]

    @property
    def empty(self) -> bool:
        """Nothing to write."""
        return not self.unassign


def partitions_of(topics: Mapping[TopicName, TopicConfig]) -> frozenset[TopicName]:
    """Every partition the topics are served as (the topic itself when not partitioned)."""
    return frozenset(
        p for topic, config in topics.items() for p in topic.partitions(config.partitions)
    )


def plan(view: ClusterView) -> Plan:
    """Forget the replica sets of partitions that no longer exist."""
    return Plan(tuple(sorted((p for p in view.assignments if p not in view.partitions), key=str)))


def replica_counts(
    assignments: Mapping[TopicName, tuple[str, ...]], nodes: Iterable[str]
) -> dict[str, int]:
    """Replicas per node (0 for a node with none): for checks, logs and the cluster page."""
    result = dict.fromkeys(nodes, 0)
    for replicas in assignments.values():
        for node in replicas:
            result[node] = result.get(node, 0) + 1
    return result
