"""Replication logic without I/O: epoch histories and where two logs diverge (against a
brute-force model), the leader's ISR and high watermark, and each replica's next step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.ingest.epochs import EpochHistory, EpochHistoryError, divergence
from danube.ingest.isr import IsrTracker
from danube.ingest.leadership import PartitionView
from danube.ingest.roles import DAMAGED_CLAIM_HOLD_MS, Act, decide
from danube.meta.records import TRANSFER_HOLD_MS, Assignment, Owner, PartitionState

pytestmark = pytest.mark.unit


def _hist(*entries: tuple[int, int]) -> EpochHistory:
    return EpochHistory(tuple(entries))


def test_histories_check_their_order_and_attribute_offsets() -> None:
    h = _hist((1, 0), (3, 100), (4, 100), (6, 150))
    assert [h.epoch_at(o) for o in (0, 99, 100, 149, 150, 10**9)] == [1, 1, 4, 4, 6, 6]
    assert _hist((2, 5)).epoch_at(4) == 0
    assert h.truncated(100).entries == ((1, 0),)
    assert h.latest == 6
    with pytest.raises(EpochHistoryError):
        _hist((2, 0), (2, 5))
    with pytest.raises(EpochHistoryError):
        _hist((1, 10), (2, 5))
    assert EpochHistory.from_json(h.to_json()) == h
    with pytest.raises(EpochHistoryError):
        EpochHistory.from_json([[1, True]])


def test_divergence_follows_kip_279_examples() -> None:
    leader = _hist((1, 0), (2, 80), (4, 120))
    # The follower wrote 100..150 under epoch 3, which the leader never saw; and its epoch 1
    # ran to 100 where the leader's ended at 80: they part at 80.
    assert divergence(_hist((1, 0), (3, 100)), 150, leader, 200) == 80
    # Same epochs, the follower only behind: nothing to cut.
    assert divergence(_hist((1, 0), (2, 80)), 90, leader, 200) == 90
    # The follower ahead of the leader within the leader's own epoch: cut to the leader's end.
    assert divergence(_hist((1, 0), (2, 80)), 130, _hist((1, 0), (2, 80)), 110) == 110
    # A wiped replica (no history) keeps nothing the leader attributes to an epoch.
    assert divergence(EpochHistory(), 50, leader, 200) == 0


def _epochs_of(history: EpochHistory, end: int) -> list[int]:
    return [history.epoch_at(o) for o in range(end)]


@st.composite
def _history(draw: st.DrawFn) -> tuple[EpochHistory, int]:
    epochs = sorted(draw(st.sets(st.integers(1, 8), max_size=5)))
    starts = sorted(draw(st.lists(st.integers(0, 40), min_size=len(epochs), max_size=len(epochs))))
    end = draw(st.integers(starts[-1] if starts else 0, 50))
    return EpochHistory(tuple(zip(epochs, starts, strict=True))), end


@settings(max_examples=300, deadline=None)
@given(_history(), _history())
def test_divergence_is_the_longest_prefix_attributed_alike(
    follower: tuple[EpochHistory, int], leader: tuple[EpochHistory, int]
) -> None:
    (f, f_end), (lead, l_end) = follower, leader
    cut = divergence(f, f_end, lead, l_end)
    limit = min(f_end, l_end)
    mine, theirs = _epochs_of(f, limit), _epochs_of(lead, limit)
    expected = next((o for o in range(limit) if mine[o] != theirs[o]), limit)
    assert cut == expected


def _tracker(isr: tuple[str, ...] = ("a", "b", "c"), hw: int = 0) -> IsrTracker:
    return IsrTracker(
        "a", ("a", "b", "c"), isr, lag_max_s=2.0, epoch_start=0, high_watermark=hw, now_s=0.0
    )


def test_the_high_watermark_is_what_every_in_sync_replica_holds_and_never_falls() -> None:
    t = _tracker()
    assert t.advance(10) == 0  # followers not heard from: nothing new is committed
    t.on_fetch("b", 10, 10, 0.1)
    assert t.advance(10) == 0
    t.on_fetch("c", 7, 10, 0.1)
    assert t.advance(10) == 7
    t.on_fetch("c", 3, 10, 0.2)  # a stale report never moves it back
    assert t.advance(10) == 7
    t.validate()
    alone = _tracker(isr=("a",))
    assert alone.advance(42) == 42  # factor 1, or an ISR of one: the leader's own end


def test_a_laggard_leaves_after_lag_max_and_rejoins_once_caught_up() -> None:
    t = _tracker()
    t.on_fetch("b", 10, 10, 1.0)
    t.on_fetch("c", 4, 10, 1.0)
    assert t.to_shrink(1.9) == frozenset()  # the grace from the term start still holds
    t.on_fetch("b", 20, 20, 2.9)
    assert t.to_shrink(3.0) == {"c"}
    t.set_isr(("a", "b"), 3.0)
    assert t.advance(20) == 20
    assert t.to_expand() == frozenset()  # c is at 4, below the watermark
    t.on_fetch("c", 20, 25, 3.5)
    assert t.to_expand() == {"c"}
    t.set_isr(("a", "b", "c"), 3.6)
    assert t.isr == {"a", "b", "c"}
    t.validate()


def test_steady_load_counts_as_caught_up_when_a_fetch_reaches_the_previous_end() -> None:
    t = _tracker()
    t.on_fetch("b", 10, 12, 1.0)  # never exactly at the end under load...
    t.on_fetch("b", 12, 15, 2.0)  # ...but it reached the end of its previous fetch
    assert t.followers["b"].caught_up_s == 1.0
    assert "b" not in t.to_shrink(2.9)


def _view(
    replicas: tuple[str, ...] = ("a", "b"),
    state: tuple[str, int, tuple[str, ...]] | None = None,
    owner: tuple[str, int] | None = None,
) -> PartitionView:
    return PartitionView(
        Assignment(replicas=replicas, assigned_ms=1),
        1,
        None
        if state is None
        else PartitionState(leader=state[0], leader_epoch=state[1], isr=state[2], updated_ms=1),
        0 if state is None else 2,
        None if owner is None else Owner(node_id=owner[0], epoch=owner[1], assigned_ms=1),
        0 if owner is None else 3,
    )


def _decide(view: PartitionView, **kw: object) -> Act:
    args: dict[str, object] = {
        "leading_epoch": None,
        "following_epoch": None,
        "has_history": True,
        "now_ms": 10_000,
    }
    args.update(kw)
    return decide("a", view, **args).act  # type: ignore[arg-type]


def test_each_replica_does_the_one_safe_thing() -> None:
    assert _decide(_view(replicas=("b",))) is Act.STOP
    assert _decide(_view()) is Act.CLAIM  # never led: every replica holds the same empty log
    assert _decide(_view(), has_history=False) is Act.CLAIM
    # A new partition is claimed by its preferred leader first; the others wait a while.
    assert _decide(_view(replicas=("b", "a")), now_ms=1 + TRANSFER_HOLD_MS - 1) is Act.WAIT
    assert _decide(_view(replicas=("b", "a")), now_ms=1 + TRANSFER_HOLD_MS) is Act.CLAIM
    led = ("b", 3, ("a", "b"))
    assert _decide(_view(state=led, owner=("b", 3))) is Act.FOLLOW
    assert _decide(_view(state=led, owner=("b", 3)), following_epoch=3) is Act.KEEP
    assert _decide(_view(state=led, owner=("b", 4)), following_epoch=3) is Act.FOLLOW
    assert _decide(_view(state=led)) is Act.CLAIM  # b is gone, a is in sync
    assert _decide(_view(state=("b", 3, ("b",)))) is Act.WAIT  # a is not in sync
    assert _decide(_view(state=led), has_history=False) is Act.WAIT  # a's disk was wiped
    stale = _view(state=("a", 3, ("a", "b")), owner=("a", 3))
    assert _decide(stale) is Act.CLAIM  # its own earlier incarnation: lead again, epoch + 1
    assert _decide(stale, has_history=False) is Act.DELETE_STALE_OWNER
    assert _decide(stale, leading_epoch=3) is Act.KEEP
    assert _decide(_view(state=("b", 4, ("b",)), owner=("b", 4)), leading_epoch=3) is Act.DEMOTE


def test_after_an_unclean_move_the_new_set_restarts_and_the_rest_waits() -> None:
    moved = _view(replicas=("a", "c"), state=("b", 3, ("a", "c")))
    restart = moved.state.model_copy(update={"restart_at": 120})  # type: ignore[union-attr]
    view = PartitionView(moved.assignment, 1, restart, 2, None, 0)
    assert _decide(view) is Act.RESTART
    assert _decide(view, has_history=False) is Act.RESTART  # an empty, wiped log may start
    outside = restart.model_copy(update={"isr": ("c",)})
    assert _decide(PartitionView(moved.assignment, 1, outside, 2, None, 0)) is Act.WAIT
    # Once one of them claimed, the others follow it (the claim cleared restart_at).
    led = PartitionView(
        moved.assignment, 1, restart, 2, Owner(node_id="c", epoch=4, assigned_ms=1), 3
    )
    assert _decide(led) is Act.FOLLOW


def test_during_a_transfer_only_the_named_replica_claims_until_the_hold_ends() -> None:
    base = _view(replicas=("a", "b", "c"), state=("b", 3, ("a", "b", "c")))
    assert base.state is not None

    def handed(to: str, at_ms: int) -> PartitionView:
        state = base.state.model_copy(update={"transfer_to": to, "transfer_ms": at_ms})  # type: ignore[union-attr]
        return PartitionView(base.assignment, 1, state, 2, None, 0)

    assert _decide(handed("a", 9_000)) is Act.CLAIM  # a is the one named
    assert _decide(handed("c", 9_000)) is Act.WAIT  # c is: a must not race it
    assert _decide(handed("c", 10_000 - TRANSFER_HOLD_MS)) is Act.CLAIM  # c never claimed
    assert _decide(handed("z", 9_000)) is Act.CLAIM  # not a replica: nobody to wait for


def test_a_replica_a_reassignment_retired_deletes_its_copy_others_only_stop() -> None:
    retired = Assignment(replicas=("b", "c"), retired=("a",), assigned_ms=1)
    view = PartitionView(retired, 1, None, 0, None, 0)
    assert _decide(view) is Act.RETIRE
    assert _decide(_view(replicas=("b", "c"))) is Act.STOP  # an unclean move: keep the files


def test_a_damaged_copy_claims_only_when_no_intact_replica_did() -> None:
    led = ("b", 3, ("a", "b"))
    assert _decide(_view(state=led), damaged=True) is Act.WAIT  # b (or another) claims first
    assert _decide(_view(state=led), damaged=True, leaderless_ms=DAMAGED_CLAIM_HOLD_MS - 1) is (
        Act.WAIT
    )
    # Nobody intact claimed in time: better a leader that reads around its damage than none.
    assert _decide(_view(state=led), damaged=True, leaderless_ms=DAMAGED_CLAIM_HOLD_MS) is (
        Act.CLAIM
    )
    assert _decide(_view(state=led), leaderless_ms=0) is Act.CLAIM  # intact: at once
    assert _decide(_view(state=led, owner=("b", 3)), damaged=True) is Act.FOLLOW


def test_a_follower_whose_copy_is_damaged_is_never_handed_leadership() -> None:
    t = _tracker()
    t.on_fetch("b", 10, 10, 1.0, damaged=True)
    t.on_fetch("c", 10, 10, 1.0)
    assert not t.ready_to_lead("b", 1.5, settle_s=0.0)
    assert t.ready_to_lead("c", 1.5, settle_s=0.0)
    assert t.first_ready(["a", "b", "c"], 1.5) == "c"  # never the leader, never damaged
    t.on_fetch("b", 10, 10, 1.6)  # its next fetch says it repaired its copy
    assert t.ready_to_lead("b", 1.7, settle_s=0.0)
    assert t.first_ready(["a", "b", "c"], 1.7) == "b"
