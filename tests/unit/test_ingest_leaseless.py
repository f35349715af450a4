"""Serving through an etcd outage, the pure parts: which followers confirm a leader without
its lease, ISR additions counted before their etcd write, and the replica's reclaim and
hold decisions (docs/replication.md, "Serving through an etcd outage")."""

from __future__ import annotations

import pytest

from danube.ingest.isr import IsrTracker
from danube.ingest.leadership import PartitionView
from danube.ingest.roles import Act, decide
from danube.meta.records import Assignment, Owner, PartitionState

pytestmark = pytest.mark.unit


def _tracker(isr: tuple[str, ...] = ("a", "b", "c")) -> IsrTracker:
    return IsrTracker(
        "a", ("a", "b", "c"), isr, lag_max_s=2.0, epoch_start=0, high_watermark=0, now_s=0.0
    )


def test_a_leader_is_confirmed_only_while_every_counted_follower_fetches() -> None:
    t = _tracker()
    assert not t.confirmed(0.1, within_s=1.0)  # nobody fetched this epoch yet
    t.on_fetch("b", 0, 0, 1.0)
    assert not t.confirmed(1.1, within_s=1.0)  # c has not
    t.on_fetch("c", 0, 0, 1.2)
    assert t.confirmed(1.9, within_s=1.0)
    assert not t.confirmed(2.1, within_s=1.0)  # b silent for 1.1 s: it may follow another
    # A replica outside the ISR confirms nothing and is not needed.
    t.set_isr(("a", "c"), 2.0)
    assert t.confirmed(2.1, within_s=1.0)
    # The leader alone in the ISR (factor 1, or the others out): nobody else may claim.
    assert _tracker(isr=("a",)).confirmed(100.0, within_s=1.0)


def test_an_old_leader_cannot_commit_past_what_a_follower_that_left_it_reported() -> None:
    """b claims the next epoch (it stops fetching here) and c follows b: whatever the old
    leader appends afterwards never reaches its high watermark, and it is not confirmed."""
    t = _tracker()
    t.on_fetch("b", 10, 10, 1.0)
    t.on_fetch("c", 10, 10, 1.0)
    assert t.advance(10) == 10
    # b leads now; c keeps fetching here a moment longer (it has not heard yet).
    for step in range(1, 20):
        now = 1.0 + step * 0.1
        t.on_fetch("c", 10 + step, 10 + step, now)
        assert t.advance(10 + step) == 10  # b's last report bounds it
    assert not t.confirmed(2.5, within_s=1.0)
    t.validate()


def test_isr_additions_count_before_their_write_and_until_a_write_drops_them() -> None:
    t = _tracker(isr=("a", "b"))
    t.on_fetch("b", 10, 10, 0.5)
    t.on_fetch("c", 10, 10, 0.5)
    assert t.advance(10) == 10
    assert t.to_expand() == {"c"}
    t.expanding(("a", "b", "c"))  # the write goes out; its answer may never come
    assert t.counted == {"a", "b", "c"}
    assert t.isr == {"a", "b"}
    t.on_fetch("b", 20, 20, 0.6)
    assert t.advance(20) == 10  # c may be in etcd's ISR (a new leader's pool): wait for it
    t.on_fetch("c", 15, 20, 0.6)
    assert t.advance(20) == 15
    assert t.to_expand() == {"c"}  # written again at the next ISR change
    assert t.to_shrink(3.0) == {"b", "c"}  # a pending addition lags like a member
    t.set_isr(("a", "b"), 3.0)  # a write that leaves c out succeeded
    assert t.counted == {"a", "b"}
    assert t.advance(20) == 20
    t.validate()


def _view(
    state: tuple[str, int] | None,
    owner: tuple[str, int] | None,
    *,
    transfer_to: str | None = None,
) -> PartitionView:
    return PartitionView(
        Assignment(replicas=("a", "b", "c"), assigned_ms=1),
        1,
        None
        if state is None
        else PartitionState(
            leader=state[0],
            leader_epoch=state[1],
            isr=("a", "b", "c"),
            updated_ms=1,
            transfer_to=transfer_to,
            transfer_ms=None if transfer_to is None else 1,
        ),
        2,
        None if owner is None else Owner(node_id=owner[0], epoch=owner[1], assigned_ms=1),
        0 if owner is None else 3,
    )


def _act(me: str, view: PartitionView, **kw: object) -> Act:
    args: dict[str, object] = {
        "leading_epoch": None,
        "following_epoch": None,
        "has_history": True,
        "now_ms": 10_000,
    }
    args.update(kw)
    return decide(me, view, **args).act  # type: ignore[arg-type]


def test_a_leader_whose_owner_key_lapsed_reclaims_only_its_own_untouched_epoch() -> None:
    assert _act("a", _view(("a", 5), ("a", 5)), leading_epoch=5) is Act.KEEP
    assert _act("a", _view(("a", 5), None), leading_epoch=5) is Act.RECLAIM
    # Another epoch began, a transfer is under way, or the key names another: never again.
    assert _act("a", _view(("b", 6), None), leading_epoch=5) is Act.DEMOTE
    assert _act("a", _view(("a", 5), None, transfer_to="b"), leading_epoch=5) is Act.DEMOTE
    assert _act("a", _view(("b", 6), ("b", 6)), leading_epoch=5) is Act.DEMOTE


def test_followers_hold_while_the_leader_of_the_state_answers_them() -> None:
    lapsed = _view(("a", 5), None)
    assert _act("b", lapsed, following_epoch=5, leader_heard=True) is Act.HOLD
    # The leader silent (dead, frozen) or the grace over: an in-sync replica claims.
    assert _act("b", lapsed, following_epoch=5, leader_heard=False) is Act.CLAIM
    # Following an older epoch, or nothing: this is no confirmation of the state's leader.
    assert _act("b", lapsed, following_epoch=4, leader_heard=True) is Act.CLAIM
    assert _act("b", lapsed, following_epoch=None, leader_heard=True) is Act.CLAIM
    # A transfer names a target: it claims, the others wait as before.
    handed = _view(("a", 5), None, transfer_to="b")
    assert _act("b", handed, following_epoch=5, leader_heard=True) is Act.CLAIM
    assert _act("c", handed, following_epoch=5, leader_heard=True, now_ms=1000) is Act.WAIT
