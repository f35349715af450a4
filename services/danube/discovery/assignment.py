"""Which ingest node should serve each topic partition: the controller's decisions, no I/O.

:func:`plan` takes a snapshot of the cluster (:class:`ClusterView`: the partitions that exist,
the live ingest nodes with their optional load, the current assignments and owners) and
returns the changes to make (:class:`Plan`). The controller reads the snapshot from etcd and
writes the plan back; everything here is pure, deterministic and tested on its own.

Rules, in order (docs/controller.md):

1. **Keep** what is placed on a live node: its assignment, or, when it has none (or a dead
   one), its live owner (a partition claimed before any controller ran is adopted where it
   is, without a move).
2. **Place** the rest (new partitions, those of dead nodes) one by one, in name order, on the
   node with the fewest partitions.
3. **Rebalance** while the busiest node has two or more partitions more than the idlest:
   move one partition from the busiest to the idlest. This moves as few partitions as a
   balanced result allows (max - min <= 1); a node that comes back empty gets partitions
   only through this step, so none move to it while the counts differ by at most one.
   Partitions not yet claimed by their node move first (moving them costs nothing).
4. **Forget** assignments of partitions that no longer exist.

Ties are broken by load (lower first for placing, higher first for shedding) once *every*
live node reports one (``NodeRecord.load``), then by node id; partitions go in name order.
Count balance stays the invariant: without per-partition load, load only decides among
nodes the counts cannot tell apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from danube.meta.records import TopicConfig
from danube.names import TopicName


@dataclass(frozen=True)
class ClusterView:
    """What the controller knows at one moment.

    ``nodes`` maps each live ingest node id to its reported load (``None``: not reported);
    ``assignments`` and ``owners`` map partitions to the node id their key names.
    """

    partitions: frozenset[TopicName]
    nodes: Mapping[str, float | None]
    assignments: Mapping[TopicName, str] = field(default_factory=dict)
    owners: Mapping[TopicName, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """The changes to make: write ``assign`` (partition -> node), delete ``unassign``.

    ``moved`` lists the partitions taken from one live node to give to another (a subset
    of ``assign``); ``placement`` is the whole assignment once the plan is applied.
    """

    assign: dict[TopicName, str]
    unassign: tuple[TopicName, ...]
    moved: tuple[TopicName, ...]
    placement: dict[TopicName, str]

    @property
    def empty(self) -> bool:
        """Nothing to write."""
        return not self.assign and not self.unassign


def partitions_of(topics: Mapping[TopicName, TopicConfig]) -> frozenset[TopicName]:
    """Every partition the topics are served as (the topic itself when not partitioned)."""
    return frozenset(
        p for topic, config in topics.items() for p in topic.partitions(config.partitions)
    )


def plan(view: ClusterView) -> Plan:
    """The assignment changes that place every partition on a live node, balanced."""
    unassign = tuple(sorted((p for p in view.assignments if p not in view.partitions), key=str))
    if not view.nodes:
        # Nowhere to put anything: keep the assignments as they are until a node registers.
        return Plan({}, unassign, (), {})
    balancer = _Balancer(view.nodes)
    unplaced: list[TopicName] = []
    for partition in sorted(view.partitions, key=str):
        current = _live_holder(view, partition)
        if current is None:
            unplaced.append(partition)
        else:
            balancer.put(partition, current)
    for partition in unplaced:
        balancer.put(partition, balancer.idlest())
    balancer.rebalance(view.owners)
    placement = balancer.placement()
    assign = {p: n for p, n in placement.items() if view.assignments.get(p) != n}
    moved = tuple(
        p for p in sorted(assign, key=str) if _live_holder(view, p) not in (None, placement[p])
    )
    return Plan(assign, unassign, moved, placement)


def _live_holder(view: ClusterView, partition: TopicName) -> str | None:
    """Where the partition already is: its live assignee, else its live owner."""
    for holder in (view.assignments.get(partition), view.owners.get(partition)):
        if holder is not None and holder in view.nodes:
            return holder
    return None


class _Balancer:
    """Partitions per node, with the node order used for placing and shedding."""

    def __init__(self, nodes: Mapping[str, float | None]) -> None:
        # Load breaks ties only when every node reports it: a mix would favour the silent.
        self._load = {node: load or 0.0 for node, load in nodes.items()}
        self._use_load = all(load is not None for load in nodes.values())
        self._held: dict[str, list[TopicName]] = {node: [] for node in sorted(nodes)}

    def _load_of(self, node: str) -> float:
        return self._load[node] if self._use_load else 0.0

    def put(self, partition: TopicName, node: str) -> None:
        self._held[node].append(partition)

    def idlest(self) -> str:
        return min(self._held, key=lambda n: (len(self._held[n]), self._load_of(n), n))

    def busiest(self) -> str:
        # Highest count, then highest load; among equals the *last* id, mirroring idlest().
        return max(self._held, key=lambda n: (len(self._held[n]), self._load_of(n), n))

    def rebalance(self, owners: Mapping[TopicName, str]) -> None:
        """Move partitions from the busiest to the idlest node until max - min <= 1."""
        while True:
            source, target = self.busiest(), self.idlest()
            if len(self._held[source]) - len(self._held[target]) <= 1:
                return
            held = self._held[source]
            # Prefer one the source has not claimed yet (nothing to hand over), then the
            # last by name, so repeated plans pick the same partitions.
            index = max(
                range(len(held)), key=lambda i: (owners.get(held[i]) != source, str(held[i]))
            )
            partition = held.pop(index)
            self._held[target].append(partition)

    def placement(self) -> dict[TopicName, str]:
        return {p: node for node, held in self._held.items() for p in held}


def counts(placement: Mapping[TopicName, str], nodes: Iterable[str]) -> dict[str, int]:
    """Partitions per node (0 for a node with none): for checks and logs."""
    result = dict.fromkeys(nodes, 0)
    for node in placement.values():
        result[node] = result.get(node, 0) + 1
    return result
