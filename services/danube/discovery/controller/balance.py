"""The controller's balancer: which partitions to reassign, pure, no I/O (docs/controller.md,
"Balancing").

:func:`plan_balance` takes what the controller read from etcd (each partition's assignment,
live leader and ISR; the live ingest nodes with their load; the drained nodes) and answers the
reassignments to write, in three passes that share one budget:

1. **drain**: every replica on a drained node goes to the best undrained live node (a
   reassignment under way toward a drained node is redirected, taking no budget);
2. **spread**: while the most loaded node holds at least ``slack`` more replicas than the
   least loaded, one of its replicas goes to a node that holds ``slack`` fewer (hysteresis: a
   state within ``slack`` plans nothing, so counts never flap);
3. **leaders**: a partition whose preferred leader (``replicas[0]``) prefers ``slack`` more
   partitions than another in-sync replica of it is reordered to prefer that one.

Nodes are judged by :mod:`danube.meta.placement` (replicas, preferred leaderships, bytes/s, a
per-partition hash), the same scores new partitions are placed by. A replica that leaves goes
to the end of the set and its replacement joins there, so a move never makes a node that is
still catching up the preferred leader; the leaders pass fixes the order later.

Limits: at most ``moves_max`` reassignments under way at once (those already under way
count); never a partition without a live leader (nothing would carry the move out), one
already moving (but for the redirect above), or one that would end with fewer live nodes
than its factor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from danube.meta.placement import NodeLoad, node_loads, replica_score, tie_break
from danube.meta.records import Assignment
from danube.names import TopicName

Reason = Literal["drain", "spread", "leader"]
REASONS: tuple[Reason, ...] = ("drain", "spread", "leader")


@dataclass(frozen=True)
class PartitionView:
    """One partition as the controller reads it: its assignment, the node leading it now
    (its ``owner`` key; None: no live leader) and its in-sync replicas."""

    assignment: Assignment
    leader: str | None = None
    isr: tuple[str, ...] = ()


@dataclass(frozen=True)
class BalanceView:
    """The cluster at one moment: partitions, live ingest nodes (id -> load, bytes/s or
    None), and the drained nodes (live or not)."""

    partitions: Mapping[TopicName, PartitionView]
    nodes: Mapping[str, float | None]
    drained: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Move:
    """Reassign ``partition`` to ``target`` (preferred leader first)."""

    partition: TopicName
    target: tuple[str, ...]
    reason: Reason


@dataclass(frozen=True)
class BalancePlan:
    """The moves to start, with what the view showed: reassignments already under way and
    the imbalance (most minus fewest replicas over the live undrained nodes)."""

    moves: tuple[Move, ...]
    under_way: int
    imbalance: int


@dataclass
class _Planner:
    view: BalanceView
    slack: int
    budget: int
    loads: dict[str, NodeLoad]  # the live undrained nodes, updated as moves are planned
    moves: list[Move] = field(default_factory=list)
    touched: set[TopicName] = field(default_factory=set)

    def movable(self, partition: TopicName) -> bool:
        found = self.view.partitions[partition]
        return (
            partition not in self.touched
            and not found.assignment.moving
            and found.leader is not None
            and found.leader in self.view.nodes
        )

    def sorted_partitions(self) -> Iterator[tuple[TopicName, PartitionView]]:
        for partition in sorted(self.view.partitions, key=str):
            if self.movable(partition):
                yield partition, self.view.partitions[partition]

    def add(self, move: Move) -> None:
        self.moves.append(move)
        self.touched.add(move.partition)
        self.budget -= 1

    def shift(self, node: str, replicas: int = 0, leaders: int = 0) -> None:
        if node in self.loads:
            old = self.loads[node]
            self.loads[node] = NodeLoad(old.replicas + replicas, old.leaders + leaders, old.load)

    def best_home(
        self, partition: TopicName, exclude: tuple[str, ...], most: int | None = None
    ) -> str | None:
        """The best node outside ``exclude`` (holding at most ``most`` replicas)."""
        name = str(partition)
        candidates = [
            n
            for n, load in self.loads.items()
            if n not in exclude and (most is None or load.replicas <= most)
        ]
        return min(candidates, key=lambda n: replica_score(name, n, self.loads[n]), default=None)

    def replace(self, target: tuple[str, ...], old: str, new: str) -> tuple[str, ...]:
        """``target`` without ``old``, ``new`` joining last; the counts follow."""
        kept = tuple(n for n in target if n != old)
        self.shift(old, replicas=-1, leaders=-1 if target[0] == old else 0)
        self.shift(new, replicas=1)
        result = (*kept, new)
        if target[0] == old:
            self.shift(result[0], leaders=1)
        return result

    def drain(self) -> None:
        """Replace drained nodes in target sets. A reassignment under way toward a drained
        node is redirected at once (it is under way already: it takes no budget)."""
        drained = self.view.drained
        for partition in sorted(self.view.partitions, key=str):
            found = self.view.partitions[partition]
            moving = found.assignment.moving
            if partition in self.touched or found.leader not in self.view.nodes:
                continue
            if not moving and self.budget <= 0:
                continue
            target = found.assignment.target
            staying = tuple(n for n in target if n not in drained)
            if len(staying) == len(target) or any(n not in self.view.nodes for n in staying):
                continue
            homes: list[str] = []
            for _ in range(len(target) - len(staying)):
                home = self.best_home(partition, (*target, *homes))
                if home is None:  # too few undrained live nodes for the factor: it stays
                    break
                homes.append(home)
                self.shift(home, replicas=1)
            if len(staying) + len(homes) < len(target):
                for home in homes:
                    self.shift(home, replicas=-1)
                continue
            new = (*staying, *homes)
            if target[0] != new[0]:
                self.shift(new[0], leaders=1)
            self.moves.append(Move(partition, new, "drain"))
            self.touched.add(partition)
            if not moving:
                self.budget -= 1

    def spread(self) -> None:
        while self.budget > 0 and self._spread_one():
            pass

    def _spread_one(self) -> bool:
        if len(self.loads) < 2:
            return False
        fewest = min(load.replicas for load in self.loads.values())
        heavy_first = sorted(
            self.loads, key=lambda n: (-self.loads[n].replicas, -self.loads[n].load, n)
        )
        for heavy in heavy_first:
            most = self.loads[heavy].replicas - self.slack
            if most < fewest:
                return False
            # A partition the heavy node does not lead by preference first: no transfer.
            candidates = sorted(
                (
                    (partition, found)
                    for partition, found in self.sorted_partitions()
                    if heavy in found.assignment.target
                    and all(n in self.view.nodes for n in found.assignment.target)
                ),
                key=lambda item: (item[1].assignment.target[0] == heavy, str(item[0])),
            )
            for partition, found in candidates:
                target = found.assignment.target
                home = self.best_home(partition, target, most=most)
                if home is not None:
                    self.add(Move(partition, self.replace(target, heavy, home), "spread"))
                    return True
        return False

    def leaders(self) -> None:
        while self.budget > 0:
            best: tuple[tuple[int, int], TopicName, tuple[str, ...]] | None = None
            for partition, found in self.sorted_partitions():
                target = found.assignment.target
                if any(n not in self.loads for n in target):
                    continue  # a dead or drained replica: the drain pass or nothing
                preferred = self.loads[target[0]].leaders
                name = str(partition)
                for node in target[1:]:
                    gain = preferred - self.loads[node].leaders
                    if gain < self.slack or node not in found.isr:
                        continue
                    key = (gain, -tie_break(name, node))
                    if best is None or key > best[0]:
                        order = (node, *(n for n in target if n != node))
                        best = (key, partition, order)
            if best is None:
                return
            _, partition, order = best
            self.shift(self.view.partitions[partition].assignment.target[0], leaders=-1)
            self.shift(order[0], leaders=1)
            self.add(Move(partition, order, "leader"))


def imbalance(loads: Mapping[str, NodeLoad]) -> int:
    """Most minus fewest replicas over ``loads`` (0 for fewer than two nodes)."""
    counts = [load.replicas for load in loads.values()]
    return max(counts) - min(counts) if len(counts) > 1 else 0


def plan_balance(
    view: BalanceView, *, moves_max: int, slack: int, spread: bool = True
) -> BalancePlan:
    """The reassignments to start now (see the module docstring); ``spread`` False (the
    balancer switched off): only drains, an operator's explicit request, are carried out."""
    eligible = {n: load for n, load in view.nodes.items() if n not in view.drained}
    targets = [p.assignment.target for p in view.partitions.values()]
    loads = node_loads(targets, eligible)
    under_way = sum(1 for p in view.partitions.values() if p.assignment.moving)
    planner = _Planner(view, slack=slack, budget=moves_max - under_way, loads=loads)
    before = imbalance(loads)
    if eligible:  # each pass keeps to the budget (a redirect takes none)
        planner.drain()
        if spread:
            planner.spread()
            planner.leaders()
    return BalancePlan(tuple(planner.moves), under_way, before)
