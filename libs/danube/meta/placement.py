"""How busy each ingest node is, and which nodes a partition's replicas should go to: pure,
no I/O. Shared by the controller's balancer (discovery) and the placement of new partitions
(ingest), so both judge a node the same way (docs/controller.md, "Balancing").

A node's score is, in this order: the replicas it holds, the partitions it is the preferred
leader of, its load (``NodeRecord.load``, appended bytes/s; unknown counts as 0), and last a
**per-partition tie-break**. Balancing uses a hash of the partition's name and the node's id;
placing a new partition uses a rotation: the nodes in an order of the topic's own (a hash of
the topic's name and each node's id), turned by the partition's index. Partitions of one topic
placed at the same moment (by different ingest nodes, each reading the same counts) then take
the nodes in turn — 12 partitions at factor 2 on 3 nodes: 8 replicas and 4 preferred
leaderships each — instead of all choosing the alphabetically first node, or as a hash falls.
Placements that read the counts at different moments replay the topic's lower partitions they
cannot see yet (:func:`choose_replicas_after`) instead of herding onto the node that was
least loaded when they looked.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """What one node carries: replicas (of target sets), preferred leaderships, load."""

    replicas: int = 0
    leaders: int = 0
    load: float = 0.0


def tie_break(partition: str, node: str) -> int:
    """A stable number for ``(partition, node)``: the same on every process and run (not
    Python's salted ``hash``), spread evenly over the nodes of one partition."""
    digest = hashlib.blake2b(f"{partition}\x00{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def node_loads(
    replica_sets: Iterable[tuple[str, ...]], nodes: Mapping[str, float | None]
) -> dict[str, NodeLoad]:
    """The load of each node of ``nodes`` (node -> bytes/s or None) given every partition's
    replica set (preferred leader first; a set under reassignment counts as its target).
    Nodes outside ``nodes`` are not counted."""
    replicas = dict.fromkeys(nodes, 0)
    leaders = dict.fromkeys(nodes, 0)
    for replica_set in replica_sets:
        for node in replica_set:
            if node in replicas:
                replicas[node] += 1
        if replica_set and replica_set[0] in leaders:
            leaders[replica_set[0]] += 1
    return {
        node: NodeLoad(replicas[node], leaders[node], float(nodes[node] or 0.0)) for node in nodes
    }


def replica_score(partition: str, node: str, load: NodeLoad) -> tuple[int, int, float, int]:
    """Lower is a better home for one more replica of ``partition``."""
    return (load.replicas, load.leaders, load.load, tie_break(partition, node))


def leader_score(partition: str, node: str, load: NodeLoad) -> tuple[int, int, float, int]:
    """Lower is a better preferred leader for ``partition``."""
    return (load.leaders, load.replicas, load.load, tie_break(partition, node))


_PARTITION_INDEX = re.compile(r"^(?P<topic>.*)-part-(?P<index>\d+)$")


def rotation(partition: str, nodes: Iterable[str]) -> dict[str, int]:
    """Each node's turn for ``partition`` (0 first): the nodes ordered by a hash of the
    topic's name and their id, turned by the partition's index (0 for a topic without
    partitions), so consecutive partitions of one topic start at consecutive nodes."""
    found = _PARTITION_INDEX.match(partition)
    topic, index = (partition, 0) if found is None else (found["topic"], int(found["index"]))
    order = sorted(nodes, key=lambda node: tie_break(topic, node))
    return {node: (turn - index) % len(order) for turn, node in enumerate(order)}


def choose_replicas(partition: str, factor: int, loads: Mapping[str, NodeLoad]) -> tuple[str, ...]:
    """The ``factor`` best nodes of ``loads`` for a new partition, its preferred leader first
    (the fewest preferred leaderships among them; equal nodes by :func:`rotation`). ``loads``
    holds only the nodes allowed (live, not drained); ValueError when there are fewer than
    ``factor``."""
    if factor < 1 or len(loads) < factor:
        raise ValueError(f"{partition}: factor {factor} needs {factor} nodes, {len(loads)} given")
    turn = rotation(partition, loads)

    def as_replica(node: str) -> tuple[int, int, float, int]:
        load = loads[node]
        return (load.replicas, load.leaders, load.load, turn[node])

    def as_leader(node: str) -> tuple[int, int, float, int]:
        load = loads[node]
        return (load.leaders, load.replicas, load.load, turn[node])

    chosen = sorted(loads, key=as_replica)[:factor]
    leader = min(chosen, key=as_leader)
    return (leader, *(n for n in chosen if n != leader))


def choose_replicas_after(
    partition: str, factor: int, loads: Mapping[str, NodeLoad], earlier: Iterable[str]
) -> tuple[str, ...]:
    """:func:`choose_replicas` for ``partition`` as if the partitions ``earlier`` (its
    siblings of lower index that ``loads`` does not count yet, in index order) had been
    placed first. Placements of one topic that run at once each read the counts at some
    moment; counts that differ make plain choices herd onto the node that was least loaded
    then (a run saw 14, 13 and 9 replicas on three nodes). Each placement instead replays
    the siblings it cannot see yet, so placements reading the same counts agree on the
    whole topic and it spreads as if placed one by one."""
    current = dict(loads)
    for other in earlier:
        placed = choose_replicas(other, factor, current)
        for node in placed:
            load = current[node]
            current[node] = NodeLoad(
                load.replicas + 1, load.leaders + (node == placed[0]), load.load
            )
    return choose_replicas(partition, factor, current)
