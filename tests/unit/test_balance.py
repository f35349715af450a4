"""The controller's balancer (danube.discovery.controller.balance), round by round over a simulated
cluster where a round's reassignments complete before the next: convergence under the moves
limit, drains, preferred-leader spread, hysteresis (a balanced state plans nothing), and the
partitions it must leave alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pytest

from danube.discovery.controller.balance import (
    BalancePlan,
    BalanceView,
    PartitionView,
    plan_balance,
)
from danube.meta.reassign import completed, reassign
from danube.meta.records import Assignment
from danube.names import TopicName

pytestmark = pytest.mark.unit

Parts = dict[TopicName, PartitionView]


def _settled(replicas: tuple[str, ...]) -> PartitionView:
    """A partition led by its preferred leader with every replica in sync."""
    return PartitionView(Assignment(replicas=replicas, assigned_ms=1), replicas[0], replicas)


def _cluster(count: int, *sets: tuple[str, ...]) -> Parts:
    """``count`` partitions of one topic, the i-th on ``sets[i % len(sets)]``."""
    return {TopicName("ns", f"t-part-{i}"): _settled(sets[i % len(sets)]) for i in range(count)}


def _round(
    parts: Parts,
    nodes: Mapping[str, float | None],
    *,
    drained: frozenset[str] = frozenset(),
    moves_max: int = 4,
    slack: int = 2,
    complete: bool = True,
) -> BalancePlan:
    """Plan, write the plan's reassignments and (``complete``) let each finish."""
    plan = plan_balance(BalanceView(parts, nodes, drained), moves_max=moves_max, slack=slack)
    for move in plan.moves:
        found = parts[move.partition]
        parts[move.partition] = PartitionView(
            reassign(found.assignment, move.target, now_ms=2), found.leader, found.isr
        )
    assert sum(p.assignment.moving for p in parts.values()) <= moves_max
    if complete:
        for name, found in parts.items():
            if found.assignment.moving or found.leader != found.assignment.preferred:
                done = completed(found.assignment, now_ms=3)
                parts[name] = _settled(done.replicas)
    return plan


def _replicas(parts: Parts) -> Counter[str]:
    return Counter(n for p in parts.values() for n in p.assignment.target)


def _leaders(parts: Parts) -> Counter[str]:
    return Counter(p.assignment.preferred for p in parts.values())


def test_two_new_nodes_take_a_third_each_within_the_moves_limit() -> None:
    parts = _cluster(24, ("n1",))
    nodes = {"n1": None, "n2": None, "n3": None}
    rounds = 0
    while _round(parts, nodes, moves_max=4).moves:
        rounds += 1
        assert rounds < 20
    assert _replicas(parts) == {"n1": 8, "n2": 8, "n3": 8}
    assert rounds == 4  # 16 moves, 4 at a time
    assert not plan_balance(BalanceView(parts, nodes), moves_max=4, slack=2).moves


def test_moves_under_way_count_against_the_limit() -> None:
    parts = _cluster(24, ("n1",))
    nodes = {"n1": None, "n2": None, "n3": None}
    first = _round(parts, nodes, moves_max=3, complete=False)
    assert len(first.moves) == 3
    again = plan_balance(BalanceView(parts, nodes), moves_max=3, slack=2)
    assert again.moves == ()
    assert again.under_way == 3
    assert again.imbalance == 21 - 1  # targets count: n1 21, the others 2 and 1
    more = plan_balance(BalanceView(parts, nodes), moves_max=5, slack=2)
    assert len(more.moves) == 2


def test_a_balanced_cluster_plans_nothing() -> None:
    parts = _cluster(9, ("a", "b"), ("b", "c"), ("c", "a"))
    plan = plan_balance(BalanceView(parts, {"a": 5.0, "b": 0.0, "c": None}), moves_max=10, slack=2)
    assert plan.moves == ()
    assert plan.imbalance == 0
    # Within the slack: 5 against 2 replicas is left alone with slack 4, not with 3.
    uneven = _cluster(6, ("a",), ("a",), ("b",)) | {TopicName("ns", "x"): _settled(("a",))}
    assert not plan_balance(BalanceView(uneven, {"a": 0, "b": 0}), moves_max=9, slack=4).moves
    assert plan_balance(BalanceView(uneven, {"a": 0, "b": 0}), moves_max=9, slack=3).moves


def test_hysteresis_stops_within_the_slack_and_never_flaps() -> None:
    parts = _cluster(10, ("a",))
    nodes = {"a": None, "b": None, "c": None}
    seen = []
    for _ in range(10):
        seen.append(len(_round(parts, nodes, moves_max=1, slack=2).moves))
    counts = sorted(_replicas(parts).values())
    assert counts[-1] - counts[0] < 2
    assert seen[-3:] == [0, 0, 0]


def test_draining_a_node_moves_every_replica_off_it() -> None:
    parts = _cluster(12, ("a", "b"), ("b", "c"), ("c", "a"))
    nodes = {"a": None, "b": None, "c": None, "d": None}
    drained = frozenset({"c"})
    for _ in range(10):
        _round(parts, nodes, drained=drained, moves_max=2)
    held = _replicas(parts)
    assert held["c"] == 0
    assert sum(held.values()) == 24
    assert max(held.values()) - min(held[n] for n in ("a", "b", "d")) < 2
    for found in parts.values():
        assert len(set(found.assignment.replicas)) == 2


def test_a_drained_leader_leaves_the_preferred_place_to_a_replica_that_stays() -> None:
    parts = {TopicName("ns", "t"): _settled(("a", "b"))}
    plan = plan_balance(
        BalanceView(parts, {"a": None, "b": None, "c": None}, frozenset({"a"})),
        moves_max=4,
        slack=2,
    )
    assert [m.target for m in plan.moves] == [("b", "c")]
    assert plan.moves[0].reason == "drain"


def test_a_drain_with_too_few_nodes_left_moves_nothing() -> None:
    parts = _cluster(4, ("a", "b", "c"))
    plan = plan_balance(
        BalanceView(parts, dict.fromkeys("abc"), frozenset({"c"})), moves_max=4, slack=2
    )
    assert plan.moves == ()


def test_a_dead_drained_node_is_replaced_from_the_leader() -> None:
    parts = _cluster(2, ("a", "b"))
    plan = plan_balance(
        BalanceView(parts, {"a": None, "c": None}, frozenset({"b"})), moves_max=4, slack=2
    )
    assert [m.target for m in plan.moves] == [("a", "c"), ("a", "c")]


def test_preferred_leaders_spread_by_reordering_in_sync_replicas() -> None:
    parts = _cluster(6, ("a", "b", "c"))
    nodes = dict.fromkeys("abc")
    plan = _round(parts, nodes, moves_max=10)
    assert {m.reason for m in plan.moves} == {"leader"}
    assert _leaders(parts) == {"a": 2, "b": 2, "c": 2}
    assert _replicas(parts) == {"a": 6, "b": 6, "c": 6}
    assert not _round(parts, nodes, moves_max=10).moves


def test_a_replica_out_of_sync_is_not_made_preferred() -> None:
    lagging = PartitionView(Assignment(replicas=("a", "b"), assigned_ms=1), "a", ("a",))
    parts = {TopicName("ns", f"t-part-{i}"): lagging for i in range(4)}
    assert not plan_balance(BalanceView(parts, dict.fromkeys("ab")), moves_max=4, slack=2).moves


def test_partitions_without_a_leader_or_with_a_dead_replica_are_left_alone() -> None:
    leaderless = PartitionView(Assignment(replicas=("a",), assigned_ms=1), None, ("a",))
    parts = {TopicName("ns", f"t-part-{i}"): leaderless for i in range(6)}
    assert not plan_balance(BalanceView(parts, dict.fromkeys("ab")), moves_max=4, slack=2).moves
    dead_peer = _cluster(6, ("a", "gone"))
    plan = plan_balance(BalanceView(dead_peer, dict.fromkeys("ab")), moves_max=4, slack=2)
    assert plan.moves == ()


def test_load_breaks_ties_between_equally_full_nodes() -> None:
    parts = _cluster(4, ("a",))
    plan = plan_balance(
        BalanceView(parts, {"a": 0.0, "busy": 5e6, "idle": 10.0}), moves_max=1, slack=2
    )
    assert [m.target for m in plan.moves] == [("idle",)]


def test_plans_are_deterministic() -> None:
    nodes = {"a": None, "b": None, "c": None, "d": 3.0}
    first = plan_balance(BalanceView(_cluster(30, ("a", "b")), nodes), moves_max=7, slack=2)
    second = plan_balance(BalanceView(_cluster(30, ("a", "b")), nodes), moves_max=7, slack=2)
    assert first == second
    assert len(first.moves) == 7


def test_a_move_toward_a_node_drained_meanwhile_is_redirected_without_budget() -> None:
    moving = reassign(Assignment(replicas=("a",), assigned_ms=1), ("c",), now_ms=2)
    parts = {
        TopicName("ns", "t"): PartitionView(moving, "a", ("a",)),
        TopicName("ns", "u"): _settled(("b",)),
    }
    plan = plan_balance(
        BalanceView(parts, {"a": 100.0, "b": 0.0, "c": 0.0, "d": 0.0}, frozenset({"c"})),
        moves_max=1,
        slack=2,
    )
    assert [(m.partition.topic, m.target, m.reason) for m in plan.moves] == [("t", ("d",), "drain")]
    assert plan.under_way == 1
    redirected = reassign(moving, ("d",), now_ms=3)
    assert redirected.adding == ("d",)
    assert set(redirected.removing) == {"a", "c"}
