"""Reassignment records (danube.meta.reassign): start, reorder, change under way, cancel,
complete; the target checks; and the placement scores (danube.meta.placement)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.meta.placement import (
    NodeLoad,
    choose_replicas,
    choose_replicas_after,
    node_loads,
    tie_break,
)
from danube.meta.reassign import ReassignError, cancel, check_target, completed, reassign
from danube.meta.records import REPLICAS_MAX, Assignment

pytestmark = pytest.mark.unit

NODES = [f"n{i}" for i in range(10)]


def _record(*replicas: str, mir: int = 1) -> Assignment:
    return Assignment(replicas=replicas, min_insync_replicas=mir, assigned_ms=1)


def test_a_reassignment_holds_the_union_target_first() -> None:
    moved = reassign(_record("a", "b", "c", mir=2), ("d", "b", "c"), now_ms=5)
    assert moved.replicas == ("d", "b", "c", "a")
    assert moved.adding == ("d",)
    assert moved.removing == ("a",)
    assert moved.target == ("d", "b", "c")
    assert moved.original == ("b", "c", "a")
    assert moved.preferred == "d"
    assert moved.moving
    assert moved.min_insync_replicas == 2
    assert moved.assigned_ms == 5


def test_a_reorder_changes_only_the_preferred_leader() -> None:
    moved = reassign(_record("a", "b", "c"), ("c", "a", "b"), now_ms=5)
    assert moved.replicas == ("c", "a", "b")
    assert not moved.moving
    same = _record("a", "b")
    assert reassign(same, ("a", "b"), now_ms=9) is same


def test_a_reassignment_on_top_of_one_under_way_keeps_the_original() -> None:
    first = reassign(_record("a", "b", "c"), ("d", "b", "c"), now_ms=2)
    second = reassign(first, ("e", "b", "c"), now_ms=3)
    assert set(second.replicas) == {"a", "b", "c", "d", "e"}
    assert second.target == ("e", "b", "c")
    assert second.adding == ("e",)  # d was being added, and now leaves
    assert set(second.removing) == {"a", "d"}
    assert second.original == tuple(n for n in second.replicas if n != "e")
    back = reassign(first, ("a", "b", "c"), now_ms=4)  # back to the original: a cancel
    assert back.adding == ()
    assert back.removing == ("d",)
    assert back.target == ("a", "b", "c")


def test_cancel_goes_back_to_the_original_and_removes_what_was_added() -> None:
    moving = reassign(_record("a", "b"), ("c", "d"), catchup_bytes_s=4096, now_ms=2)
    undone = cancel(moving, now_ms=3)
    assert set(undone.target) == {"a", "b"}
    assert set(undone.removing) == {"c", "d"}
    assert undone.adding == ()
    assert undone.catchup_bytes_s == 4096
    with pytest.raises(ReassignError) as caught:
        cancel(_record("a"), now_ms=1)
    assert caught.value.code == "not_reassigning"


def test_completion_keeps_the_target_and_retires_the_removed() -> None:
    moving = reassign(_record("a", "b"), ("c", "b"), now_ms=2)
    done = completed(moving, now_ms=3)
    assert done.replicas == ("c", "b")
    assert done.retired == ("a",)
    assert not done.moving
    # A node that left last time may come back: it is no longer retired.
    again = reassign(done, ("a", "b"), now_ms=4)
    assert again.retired == ()
    assert again.adding == ("a",)


def test_targets_are_checked_against_the_cluster() -> None:
    live = {"a", "b", "c", "d"}
    check_target(("a", "b"), live=live, drained={"c"}, factor=2)
    cases = {
        ("a", "a"): "duplicate_replicas",
        ("a", "x"): "node_not_live",
        ("a", "c"): "node_drained",
        ("a", "b", "d"): "factor_mismatch",
    }
    for target, code in cases.items():
        with pytest.raises(ReassignError) as caught:
            check_target(target, live=live, drained={"c"}, factor=2)
        assert caught.value.code == code, target


def test_a_union_too_big_for_a_record_is_refused() -> None:
    seven = tuple(NODES[:7])
    first = reassign(_record(*seven), tuple(f"m{i}" for i in range(7)), now_ms=2)
    with pytest.raises(ReassignError) as caught:
        reassign(first, tuple(f"k{i}" for i in range(7)), now_ms=3)
    assert caught.value.code == "too_many_replicas"


_sets = st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True).map(tuple)


@given(_sets, st.lists(_sets, min_size=1, max_size=4))
def test_any_chain_of_reassignments_keeps_the_original_and_ends_on_the_target(
    start: tuple[str, ...], targets: list[tuple[str, ...]]
) -> None:
    current = _record(*start)
    seen = set(start)
    for target in targets:
        refused: str | None = None
        try:
            current = reassign(current, target, now_ms=2)
        except ReassignError as exc:
            refused = exc.code
        if refused is not None:
            assert refused == "too_many_replicas"
            continue
        seen |= set(target)
        # The original holds the start; after a step back it also holds the nodes still
        # leaving (a cancel's original is what holds copies now).
        assert current.target == target
        assert set(start) <= set(current.original) <= seen
        assert set(current.replicas) == set(current.original) | set(target)
    if current.moving and len(current.original) <= REPLICAS_MAX:
        assert set(cancel(current, now_ms=3).target) == set(current.original)
        assert completed(current, now_ms=3).replicas == current.target


def test_choose_replicas_prefers_empty_nodes_and_spreads_leaders() -> None:
    loads = {
        "a": NodeLoad(replicas=5, leaders=5),
        "b": NodeLoad(replicas=1, leaders=1),
        "c": NodeLoad(replicas=1, leaders=0),
        "d": NodeLoad(replicas=1, leaders=1, load=900.0),
    }
    chosen = choose_replicas("ns/t-part-0", 2, loads)
    assert set(chosen) == {"b", "c"}
    assert chosen[0] == "c"
    with pytest.raises(ValueError, match="needs 5 nodes"):
        choose_replicas("ns/t", 5, loads)


def test_equal_nodes_are_chosen_differently_for_each_partition() -> None:
    loads = dict.fromkeys(["a", "b", "c"], NodeLoad())
    firsts = {choose_replicas(f"ns/t-part-{i}", 1, loads)[0] for i in range(30)}
    assert firsts == {"a", "b", "c"}
    assert tie_break("p", "a") == tie_break("p", "a")


def test_node_loads_count_replicas_and_preferred_leaders_of_known_nodes() -> None:
    counted = node_loads([("a", "b"), ("b", "a"), ("b", "gone")], {"a": 10.0, "b": None})
    assert counted == {"a": NodeLoad(2, 1, 10.0), "b": NodeLoad(3, 2, 0.0)}


def test_partitions_of_one_topic_placed_at_once_take_the_nodes_in_turn() -> None:
    # Every placement reads the same (empty) counts: the rotation alone spreads them.
    loads = {node: NodeLoad() for node in ("n1", "n2", "n3")}
    placed = [choose_replicas(f"/default/spread-part-{i}", 2, loads) for i in range(12)]
    replicas = Counter(node for replica_set in placed for node in replica_set)
    leaders = Counter(replica_set[0] for replica_set in placed)
    assert replicas == {"n1": 8, "n2": 8, "n3": 8}
    assert leaders == {"n1": 4, "n2": 4, "n3": 4}


def _place_topic(snapshots: list[int]) -> list[tuple[str, ...]]:
    """Place partitions 0..11 of one topic at factor 2 on three nodes, partition k seeing
    only the placements of partitions below ``snapshots[k]`` (as concurrent placements do)."""
    placed: list[tuple[str, ...]] = []
    for k, seen in enumerate(snapshots):
        loads = node_loads(placed[:seen], dict.fromkeys("abc"))
        earlier = [f"ns/t-part-{j}" for j in range(seen, k)]
        placed.append(choose_replicas_after(f"ns/t-part-{k}", 2, loads, earlier))
    return placed


def test_concurrent_placements_that_see_different_counts_agree_with_one_by_one() -> None:
    one_by_one = _place_topic(list(range(12)))
    counts = node_loads(one_by_one, dict.fromkeys("abc"))
    assert counts == {node: NodeLoad(8, 4, 0.0) for node in "abc"}
    # Each placement read the counts at another moment: 4 were placed when the rest looked.
    assert _place_topic([0, 1, 2, 3] + [4] * 8) == one_by_one
    assert _place_topic([0] * 12) == one_by_one
    # Without the replay the eight that looked at once herd onto one node.
    herd = [
        choose_replicas(f"ns/t-part-{k}", 2, node_loads(one_by_one[:4], dict.fromkeys("abc")))
        for k in range(4, 12)
    ]
    assert len({replicas for replicas in herd}) < len(set(one_by_one[4:]))
