"""Fair share of subscriptions among dispatchers (danube.dispatcher.balance): counts to hand-overs
and claim refusals, pure, and a simulated cluster that converges without moving anything twice."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.dispatcher.balance import (
    BalancePolicy,
    Balancer,
    Census,
    ceiling,
    choose_release,
    claim_refusal,
    fair_share,
    release_count,
)

POLICY = BalancePolicy(slack=1, moves_max=4, holdoff_s=30.0)


def test_fair_share_is_the_rounded_up_quotient() -> None:
    assert fair_share(60, 3) == 20
    assert fair_share(61, 3) == 21
    assert fair_share(0, 3) == 0
    with pytest.raises(ValueError, match="over 0 dispatchers"):
        fair_share(5, 0)


def test_release_hands_over_down_to_the_share_a_few_at_a_time() -> None:
    # 60 on one of three: share 20, ceiling 22; four per round.
    assert release_count(60, 60, 3, drained=False, policy=POLICY) == 4
    assert release_count(24, 60, 3, drained=False, policy=POLICY) == 4
    assert release_count(23, 60, 3, drained=False, policy=POLICY) == 3
    # At or under the ceiling nothing moves (hysteresis).
    assert release_count(22, 60, 3, drained=False, policy=POLICY) == 0
    assert release_count(20, 60, 3, drained=False, policy=POLICY) == 0


def test_a_drained_dispatcher_hands_over_everything_unless_nobody_could_take_it() -> None:
    assert release_count(3, 60, 2, drained=True, policy=POLICY) == 3
    assert release_count(30, 60, 2, drained=True, policy=POLICY) == 4
    assert release_count(30, 60, 0, drained=True, policy=POLICY) == 0


def test_release_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="owns 5 of 4"):
        release_count(5, 4, 2, drained=False, policy=POLICY)


def test_the_fewest_unacked_go_first_ties_in_key_order() -> None:
    unacked = {"d": 0, "a": 7, "c": 0, "b": 2}
    assert choose_release(unacked, 3) == ["c", "d", "b"]
    assert choose_release(unacked, 0) == []
    assert choose_release(unacked, 10) == ["c", "d", "b", "a"]


def test_claims_are_refused_at_the_ceiling_when_drained_or_held_off() -> None:
    def refusal(owned: int, *, drained: bool = False, held_off: bool = False) -> str | None:
        return claim_refusal(owned, 60, 3, drained=drained, held_off=held_off, slack=1)

    assert refusal(21) is None
    assert "holds its share" in str(refusal(22))
    assert refusal(0, drained=True) == "this dispatcher is drained"
    assert refusal(20, held_off=True) is not None  # at its share (20): it would go again
    assert refusal(19, held_off=True) is None  # below it: taking one back moves nothing
    # Every live dispatcher drained: someone must serve.
    assert claim_refusal(50, 60, 0, drained=True, held_off=True, slack=1) is None


@given(
    total=st.integers(min_value=0, max_value=10_000),
    eligible=st.integers(min_value=1, max_value=64),
    slack=st.integers(min_value=0, max_value=5),
)
def test_someone_always_has_room_and_a_claim_never_triggers_a_hand_over(
    total: int, eligible: int, slack: int
) -> None:
    most = ceiling(total, eligible, slack)
    # If every eligible dispatcher were one claim short of its ceiling, all would fit one more.
    assert eligible * most >= total + 1
    # The most a claim can leave a dispatcher owning is not beyond what it would hand over.
    policy = BalancePolicy(slack=slack, moves_max=1000, holdoff_s=1.0)
    owned = min(most, total)
    assert release_count(owned, total, eligible, drained=False, policy=policy) == 0
    # And what is handed over leaves it exactly at its share.
    if total >= most + 1:
        over = most + 1
        assert over - release_count(over, total, eligible, drained=False, policy=policy) == (
            fair_share(total, eligible)
        )


def test_the_balancer_does_nothing_before_its_first_count() -> None:
    balancer: Balancer[str] = Balancer("d0", POLICY)
    assert balancer.plan({"a": 0, "b": 0}) == []
    assert balancer.refusal("a", 100, 0.0) is None


def test_the_hold_off_ends_after_holdoff_s() -> None:
    balancer: Balancer[str] = Balancer("d1", POLICY)
    census = Census(live=frozenset({"d0", "d1"}), drained=frozenset(), owned={"d0": 4})
    balancer.observe(census, 0.0)
    balancer.released(["a"], 0.0)
    assert balancer.refusal("a", 2, 10.0) == "this dispatcher handed it over a moment ago"
    assert balancer.refusal("b", 2, 10.0) is None
    assert balancer.refusal("a", 2, 30.0) is None
    balancer.observe(census, 31.0)
    assert balancer.held_off() == []


def test_one_it_let_go_that_every_other_refuses_it_takes_back_below_its_share() -> None:
    # d0 handed "x" over down to 17; d1 and d2 hold 21 each, their ceiling while nobody
    # owns "x" (59 counted): both refuse it. d0 takes it back rather than leave it unserved
    # for the 30 s hold-off.
    census = Census(
        live=frozenset({"d0", "d1", "d2"}),
        drained=frozenset(),
        owned={"d0": 17, "d1": 21, "d2": 21},
    )
    balancers = {n: Balancer[str](n, POLICY) for n in ("d0", "d1", "d2")}
    for balancer in balancers.values():
        balancer.observe(census, 0.0)
    balancers["d0"].released(["x"], 0.0)
    assert balancers["d1"].refusal("x", 21, 1.0) is not None
    assert balancers["d2"].refusal("x", 21, 1.0) is not None
    assert balancers["d0"].refusal("x", 17, 1.0) is None
    assert balancers["d0"].refusal("x", 20, 1.0) is not None  # at its share: held off
    # And taking it back hands nothing over again.
    census = Census(census.live, census.drained, {"d0": 18, "d1": 21, "d2": 21})
    balancers["d0"].observe(census, 2.0)
    assert balancers["d0"].plan({f"s{i}": 0 for i in range(18)}) == []


def test_a_count_that_misses_subscriptions_between_owners_moves_nothing_more() -> None:
    # Seen in tests/e2e/test_dispatcher_spread.py: 60 subscriptions, d1 owns 21; a count
    # taken while 12 were between owners says 48. On such a count d1's ceiling was 18: it
    # handed over, refused claims, and the subscriptions went round for 40 s.
    live = frozenset({"d0", "d1", "d2"})
    balancer: Balancer[str] = Balancer("d1", POLICY)
    balancer.observe(Census(live, frozenset(), {"d0": 20, "d1": 20, "d2": 20}), 0.0)
    balancer.observe(Census(live, frozenset(), {"d0": 14, "d1": 21, "d2": 13}), 1.0)
    assert balancer.plan({f"s{i}": 0 for i in range(21)}) == []
    assert balancer.refusal("x", 21, 1.0) is None  # ceiling 22 of 60, not 18 of 48
    # Forgotten after TOTAL_MEMORY_S (deleted subscriptions stop counting).
    balancer.observe(Census(live, frozenset(), {"d0": 14, "d1": 21, "d2": 13}), 12.0)
    assert len(balancer.plan({f"s{i}": 0 for i in range(21)})) == 4  # down to 16 of 48


def test_own_count_is_taken_from_what_it_serves_not_the_older_census() -> None:
    balancer: Balancer[str] = Balancer("d0", POLICY)
    # The census still says d0 owns 60; it has handed over 37 since (the others own them
    # a moment later: the total stays 60, share 20).
    census = Census(live=frozenset({"d0", "d1", "d2"}), drained=frozenset(), owned={"d0": 60})
    balancer.observe(census, 0.0)
    assert balancer.plan({f"s{i}": 0 for i in range(23)}) == ["s0", "s1", "s10"]
    # And claims since count: d1 claimed 25 the census did not see yet.
    claimer: Balancer[str] = Balancer("d1", POLICY)
    claimer.observe(census, 0.0)
    assert claimer.refusal("x", 25, 0.0) is not None


def _simulate(
    owned: dict[str, set[int]], drained: frozenset[str], rng: random.Random
) -> tuple[int, int]:
    """Rounds of: every dispatcher counts and hands over; each handed-over subscription is
    claimed by random members of the queue group until one accepts (a consumer's retry).
    Returns (rounds until nothing moved, subscriptions moved)."""
    nodes = sorted(owned)
    balancers = {n: Balancer[int](n, POLICY) for n in nodes}
    moved = 0
    for round_ in range(1, 100):
        now_s = float(round_)
        census = Census(
            live=frozenset(nodes),
            drained=drained,
            owned={n: len(subs) for n, subs in owned.items()},
        )
        handed: list[int] = []
        for node in nodes:
            balancer = balancers[node]
            balancer.observe(census, now_s)
            chosen = balancer.plan(dict.fromkeys(owned[node], 0))
            balancer.released(chosen, now_s)
            owned[node].difference_update(chosen)
            handed.extend(chosen)
        for sub in handed:
            for _ in range(1000):
                node = rng.choice(nodes)
                if balancers[node].refusal(sub, len(owned[node]), now_s) is None:
                    owned[node].add(sub)
                    break
            else:
                raise AssertionError(f"nobody claimed {sub}")
        moved += len(handed)
        if not handed:
            return round_, moved
    raise AssertionError("never settled")


@pytest.mark.parametrize("seed", range(20))
def test_two_new_dispatchers_take_a_fair_share_moving_each_subscription_at_most_once(
    seed: int,
) -> None:
    owned: dict[str, set[int]] = {"d0": set(range(60)), "d1": set(), "d2": set()}
    rounds, moved = _simulate(owned, frozenset(), random.Random(seed))
    counts = sorted(len(subs) for subs in owned.values())
    assert sum(counts) == 60
    assert all(18 <= c <= 22 for c in counts), counts
    assert moved <= 42  # 60 - 18: nothing goes back and forth
    assert rounds <= 12  # 40 at 4 a round, then a quiet round


@pytest.mark.parametrize("seed", range(10))
def test_a_drained_dispatcher_ends_with_nothing(seed: int) -> None:
    owned: dict[str, set[int]] = {"d0": set(range(20)), "d1": set(range(20, 40)), "d2": set()}
    _simulate(owned, frozenset({"d1"}), random.Random(seed))
    assert owned["d1"] == set()
    counts = sorted(len(s) for s in owned.values())
    assert counts[0] == 0
    assert sum(counts) == 40
    assert 18 <= counts[1] <= counts[2] <= 22, counts


def test_a_dispatcher_leaving_ends_every_hold_off() -> None:
    balancer: Balancer[str] = Balancer("d0", POLICY)
    three = Census(live=frozenset({"d0", "d1", "d2"}), drained=frozenset(), owned={"d0": 3})
    balancer.observe(three, 0.0)
    balancer.released(["a", "b"], 0.0)
    balancer.observe(three, 1.0)
    assert balancer.refusal("a", 1, 1.0) is not None  # at its share (1 of 3)
    balancer.observe(Census(live=frozenset({"d0", "d1"}), drained=frozenset()), 2.0)
    assert balancer.refusal("a", 2, 2.0) is None  # at its share (2 of 3) too: not held off
