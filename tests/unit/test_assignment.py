"""The controller's pure assignment logic: placement on live nodes, balance, minimal moves."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.discovery.assignment import ClusterView, Plan, counts, partitions_of, plan
from danube.meta import keys
from danube.meta.records import Assignment, TopicConfig
from danube.names import TopicName

pytestmark = pytest.mark.unit


def _parts(count: int, topic: str = "t") -> list[TopicName]:
    return TopicName("default", topic).partitions(count)


def _view(
    partitions: list[TopicName],
    nodes: Mapping[str, float | None],
    assignments: Mapping[TopicName, str] | None = None,
    owners: Mapping[TopicName, str] | None = None,
) -> ClusterView:
    return ClusterView(frozenset(partitions), dict(nodes), assignments or {}, owners or {})


def _apply(view: ClusterView, result: Plan) -> dict[TopicName, str]:
    after = {p: n for p, n in view.assignments.items() if p not in result.unassign}
    after.update(result.assign)
    return after


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


def test_new_partitions_spread_evenly_in_name_order() -> None:
    parts = _parts(4)
    result = plan(_view(parts, {"b": None, "a": None}))
    # Round robin by count, ties to the first id, partitions in name order.
    assert result.assign == {parts[0]: "a", parts[1]: "b", parts[2]: "a", parts[3]: "b"}
    assert result.moved == ()
    assert result.unassign == ()


def test_a_dead_nodes_partitions_move_to_the_live_ones() -> None:
    parts = _parts(4)
    assignments = {parts[0]: "a", parts[1]: "b", parts[2]: "a", parts[3]: "b"}
    result = plan(_view(parts, {"b": None}, assignments))
    assert result.assign == {parts[0]: "b", parts[2]: "b"}
    assert result.moved == ()  # not moved from a live node: "a" is dead


def test_a_returning_node_gets_partitions_only_when_counts_differ_by_more_than_one() -> None:
    three = _parts(3)
    balanced_enough = plan(_view(three[:1], {"a": None, "b": None}, {three[0]: "a"}))
    assert balanced_enough.empty

    assignments = {p: "b" for p in three}
    result = plan(_view(three, {"a": None, "b": None}, assignments, owners=assignments))
    assert len(result.assign) == 1
    assert list(result.assign.values()) == ["a"]
    assert result.moved == tuple(result.assign)


def test_a_live_owner_without_assignment_is_adopted_in_place() -> None:
    parts = _parts(3)
    owners = {parts[0]: "b", parts[1]: "b"}  # claimed before any controller ran
    result = plan(_view(parts, {"a": None, "b": None}, owners=owners))
    assert result.assign == {parts[0]: "b", parts[1]: "b", parts[2]: "a"}
    assert result.moved == ()


def test_unclaimed_partitions_move_before_claimed_ones() -> None:
    parts = _parts(4)
    assignments = {p: "b" for p in parts}
    owners = {parts[0]: "b", parts[1]: "b", parts[3]: "b"}  # parts[2] not claimed yet
    result = plan(_view(parts, {"a": None, "b": None}, assignments, owners))
    assert set(result.assign) == {parts[2], parts[3]}
    assert set(result.assign.values()) == {"a"}


def test_assignments_of_deleted_partitions_are_forgotten() -> None:
    parts = _parts(2)
    gone = TopicName("default", "deleted")
    result = plan(_view(parts, {"a": None}, {gone: "a", parts[0]: "a"}))
    assert result.unassign == (gone,)
    assert result.assign == {parts[1]: "a"}


def test_without_live_nodes_nothing_is_assigned_and_nothing_kept_is_touched() -> None:
    parts = _parts(2)
    gone = TopicName("default", "deleted")
    result = plan(_view(parts, {}, {parts[0]: "dead", gone: "dead"}))
    assert result.assign == {}
    assert result.unassign == (gone,)


def test_load_breaks_count_ties_once_every_node_reports_it() -> None:
    part = _parts(0)
    assert plan(_view(part, {"a": 9.0, "b": 1.0})).assign == {part[0]: "b"}
    # One node silent: loads are ignored, the first id wins the tie.
    assert plan(_view(part, {"a": 9.0, "b": 1.0, "c": None})).assign == {part[0]: "a"}
    # Counts still come first: "b" is idle but already holds more.
    two = _parts(2)
    result = plan(_view(two, {"a": 9.0, "b": 1.0}, {two[0]: "b"}))
    assert result.assign == {two[1]: "a"}


# --- properties ---------------------------------------------------------------------------

NODE_IDS = [f"n{i}" for i in range(6)]


@st.composite
def cluster_views(draw: st.DrawFn) -> ClusterView:
    partitions = _parts(draw(st.integers(0, 40)))
    live = draw(st.lists(st.sampled_from(NODE_IDS), unique=True, max_size=5))
    loads = draw(st.booleans())
    nodes = {n: (draw(st.floats(0, 100)) if loads else None) for n in live}
    holder = st.none() | st.sampled_from(NODE_IDS)
    assignments: dict[TopicName, str] = {}
    owners: dict[TopicName, str] = {}
    for partition in partitions + _parts(3, "stale"):
        if (assignee := draw(holder)) is not None:
            assignments[partition] = assignee
        if partition in partitions and (owner := draw(holder)) is not None:
            owners[partition] = owner
    return ClusterView(frozenset(partitions), nodes, assignments, owners)


def _min_moves(view: ClusterView) -> int:
    """The fewest partitions that must leave a live node for a balanced placement: the
    nodes holding most keep the larger share (ceil), the others floor."""
    held = counts(
        {p: n for p in view.partitions if (n := _holder(view, p)) is not None}, view.nodes
    )
    total, size = len(view.partitions), len(view.nodes)
    ordered = sorted(held.values(), reverse=True)
    targets = [total // size + (1 if i < total % size else 0) for i in range(size)]
    return sum(max(0, c - t) for c, t in zip(ordered, targets, strict=True))


def _holder(view: ClusterView, partition: TopicName) -> str | None:
    for node in (view.assignments.get(partition), view.owners.get(partition)):
        if node is not None and node in view.nodes:
            return node
    return None


@settings(max_examples=400, deadline=None)
@given(cluster_views())
def test_every_partition_lands_on_a_live_node_balanced_with_minimal_moves(
    view: ClusterView,
) -> None:
    result = plan(view)
    after = _apply(view, result)
    assert set(result.unassign) == {p for p in view.assignments if p not in view.partitions}
    if not view.nodes:
        assert result.assign == {}
        return
    assert set(after) == set(view.partitions)
    assert set(after.values()) <= set(view.nodes)  # dead nodes emptied
    per_node = counts(after, view.nodes)
    assert max(per_node.values()) - min(per_node.values()) <= 1
    assert len(result.moved) == _min_moves(view)
    # A partition already on a live node stays there unless it is one of the moves.
    for partition in view.partitions:
        holder = _holder(view, partition)
        if holder is not None and partition not in result.moved:
            assert after[partition] == holder


@settings(max_examples=200, deadline=None)
@given(cluster_views())
def test_a_plan_applied_is_stable_and_plans_are_deterministic(view: ClusterView) -> None:
    result = plan(view)
    shuffled = ClusterView(
        frozenset(sorted(view.partitions, key=str, reverse=True)),
        dict(reversed(list(view.nodes.items()))),
        dict(reversed(list(view.assignments.items()))),
        dict(reversed(list(view.owners.items()))),
    )
    assert plan(shuffled) == result
    if view.nodes:
        again = ClusterView(view.partitions, view.nodes, _apply(view, result), view.owners)
        assert plan(again).empty


def test_the_assignment_key_sits_beside_the_owner_key_and_round_trips() -> None:
    p0 = TopicName("default", "orders-part-0")
    key = keys.partition_assignment_key(p0)
    assert key == "partitions/default/orders-part-0/assignment"
    assert keys.parse_partition_key(key) == (p0, "assignment")
    record = Assignment(node_id="ingest-1", assigned_ms=5)
    assert Assignment.model_validate_json(record.model_dump_json()) == record
