"""Key-shared routing, pure: the stable hash, key filters, ring stability and the ordering rule."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.dispatcher.keyshared import (
    HashRing,
    KeyFilter,
    blocked_by,
    deliverable,
    stable_hash,
)
from danube.wire.opens import FILTERS_MAX

pytestmark = pytest.mark.unit

KEYS = [f"key-{i}" for i in range(4000)]


def owners(ring: HashRing) -> dict[str, str | None]:
    return {key: ring.owner(key) for key in KEYS}


def test_the_hash_is_stable_across_processes() -> None:
    # Fixed values: a salted hash (Python's hash()) would differ from run to run.
    assert stable_hash("user-1") == 0x88E1EA21865AAC9A
    assert len({stable_hash(k) for k in KEYS}) == len(KEYS)


def test_keys_spread_over_consumers() -> None:
    ring = HashRing()
    for consumer in ("a", "b", "c"):
        ring.join(consumer)
    counts = {c: 0 for c in "abc"}
    for owner in owners(ring).values():
        assert owner is not None
        counts[owner] += 1
    # 64 points each: every consumer gets a fair share (a third would be 1333).
    assert all(800 < n < 1900 for n in counts.values()), counts


def test_a_joining_consumer_takes_only_keys_and_about_its_share() -> None:
    ring = HashRing()
    for consumer in ("a", "b", "c"):
        ring.join(consumer)
    before = owners(ring)
    ring.join("d")
    after = owners(ring)
    moved = [k for k in KEYS if before[k] != after[k]]
    assert all(after[k] == "d" for k in moved)  # nothing moves between a, b and c
    assert 0.12 * len(KEYS) < len(moved) < 0.40 * len(KEYS)  # about a quarter
    ring.leave("d")
    assert owners(ring) == before  # leaving gives exactly its keys back


def test_a_leaving_consumer_gives_away_only_its_own_keys() -> None:
    ring = HashRing()
    for consumer in ("a", "b", "c"):
        ring.join(consumer)
    before = owners(ring)
    ring.leave("b")
    after = owners(ring)
    for key in KEYS:
        if before[key] != "b":
            assert after[key] == before[key]
        else:
            assert after[key] in ("a", "c")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from("abcdef"), min_size=1, max_size=12),
    st.sampled_from("abcdefg"),
)
def test_ring_changes_move_only_the_changed_arcs(joins: list[str], other: str) -> None:
    ring = HashRing(points_per_consumer=16)
    for consumer in dict.fromkeys(joins):
        ring.join(consumer)
    keys = KEYS[:300]
    before = {k: ring.owner(k) for k in keys}
    if other in ring.consumers:
        ring.leave(other)
        after = {k: ring.owner(k) for k in keys}
        assert all(before[k] == after[k] for k in keys if before[k] != other)
    else:
        ring.join(other)
        after = {k: ring.owner(k) for k in keys}
        assert all(after[k] == other for k in keys if before[k] != after[k])


def test_filters_match_globs_and_no_filter_matches_all() -> None:
    users = KeyFilter(["user-*", "eu-west-?"])
    assert users.matches("user-42")
    assert users.matches("eu-west-1")
    assert not users.matches("eu-west-12")
    assert not users.matches("User-42")  # case-sensitive
    assert not users.matches("order-1")
    assert KeyFilter().matches("anything")
    assert KeyFilter(["*"]).matches("")
    assert KeyFilter(["[ab]?"]).matches("bz")


def test_filters_are_bounded() -> None:
    KeyFilter(["k"] * FILTERS_MAX)
    with pytest.raises(ValueError, match="at most"):
        KeyFilter(["k"] * (FILTERS_MAX + 1))
    with pytest.raises(ValueError, match="characters"):
        KeyFilter(["x" * 257])
    with pytest.raises(ValueError, match="characters"):
        KeyFilter([""])


def test_the_owner_is_chosen_among_the_consumers_whose_filters_match() -> None:
    ring = HashRing()
    ring.join("users", KeyFilter(["user-*"]))
    ring.join("eu", KeyFilter(["eu-*"]))
    ring.join("all")
    assert {ring.owner(f"user-{i}") for i in range(200)} == {"users", "all"}
    assert {ring.owner(f"eu-{i}") for i in range(200)} == {"eu", "all"}
    assert {ring.owner(f"order-{i}") for i in range(200)} == {"all"}
    ring.leave("all")
    assert ring.owner("order-1") is None  # nobody matches: the key waits
    assert ring.owner("user-1") == "users"


@dataclass
class E:
    state: str
    consumer_id: str | None = None


def test_ordering_rule() -> None:
    fresh = [E("fresh"), E("fresh")]
    assert list(deliverable(fresh, "a")) == fresh
    # In flight elsewhere: the whole key waits, even its fresh messages.
    moved = [E("in_flight", "old"), E("fresh")]
    assert blocked_by(moved, "a") == "old"
    assert list(deliverable(moved, "a")) == []
    # In flight to the owner itself: the rest follows.
    mine = [E("in_flight", "a"), E("ready", "a"), E("fresh")]
    assert list(deliverable(mine, "a")) == mine[1:]
    # A delayed redelivery holds back the later messages of its key.
    delayed = [E("ready"), E("scheduled", "a"), E("fresh")]
    assert list(deliverable(delayed, "a")) == delayed[:1]
