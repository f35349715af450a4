"""Pure parts of moving partitions: the catch-up token bucket, the tracker's view of who may
be handed leadership, and a replica set that changes under a leader."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.ingest.isr import IsrTracker
from danube.ingest.load import LoadMeter
from danube.ingest.throttle import TokenBucket
from danube.meta.records import Assignment


def test_bucket_grants_its_burst_then_paces_at_its_rate() -> None:
    bucket = TokenBucket(1000.0, 250.0, now_s=0.0, grant_min_bytes=10)
    assert bucket.wait_s(0.0) == 0.0
    assert bucket.grant(10_000, 0.0) == 250  # the burst
    bucket.charge(250, 0.0)
    assert bucket.wait_s(0.0) > 0  # empty: wait
    assert bucket.wait_s(0.1) == 0.0  # 100 bytes back after 0.1 s
    assert bucket.grant(10_000, 0.1) == 100
    bucket.charge(600, 0.1)  # a reply may overshoot: the debt is paid in time
    assert bucket.wait_s(0.5) == pytest.approx(0.001 + 0.1, abs=1e-6)
    assert bucket.grant(5, 10.0) == 5  # never more than asked


@given(st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=200))
def test_bucket_never_lets_more_than_rate_times_time_plus_burst_and_one_reply(
    replies: list[int],
) -> None:
    rate, burst = 1000.0, 500.0
    bucket = TokenBucket(rate, burst, now_s=0.0, grant_min_bytes=1)
    now, sent = 0.0, 0
    for size in replies:
        now += bucket.wait_s(now)
        granted = bucket.grant(size, now)
        bucket.charge(granted, now)
        sent += granted
        assert sent <= rate * now + burst + 1


def test_bucket_refuses_a_rate_of_zero() -> None:
    with pytest.raises(ValueError, match="positive"):
        TokenBucket(0.0, 1.0, now_s=0.0)


def _tracker() -> IsrTracker:
    return IsrTracker(
        "a", ("a", "b", "c"), ("a", "b"), lag_max_s=2.0, epoch_start=0, high_watermark=0, now_s=0.0
    )


def test_only_a_fetching_follower_long_in_sync_may_be_handed_leadership() -> None:
    t = _tracker()
    assert not t.ready_to_lead("b", 0.1, settle_s=0.0)  # in sync, but has not fetched
    t.on_fetch("b", 0, 0, 0.2)
    assert t.ready_to_lead("b", 0.3, settle_s=0.0)
    assert not t.ready_to_lead("b", 0.3, settle_s=1.0)  # not in sync for long enough
    assert t.ready_to_lead("b", 1.1, settle_s=1.0)
    assert not t.ready_to_lead("b", 5.0, settle_s=1.0)  # silent since 0.2: maybe gone
    t.on_fetch("c", 0, 0, 0.2)
    assert not t.ready_to_lead("c", 0.3, settle_s=0.0)  # outside the ISR
    t.set_isr(("a", "b", "c"), 0.4)
    assert t.ready_to_lead("c", 0.5, settle_s=0.0)
    assert not t.ready_to_lead("c", 0.5, settle_s=0.5)  # its time in sync starts at 0.4
    assert not t.ready_to_lead("z", 0.5, settle_s=0.0)
    t.validate()


def test_a_replica_set_change_follows_new_nodes_and_drops_removed_ones() -> None:
    t = _tracker()
    t.set_replicas(("a", "b", "d"), 1.0)
    assert set(t.followers) == {"b", "d"}
    assert "d" not in t.isr  # a new copy starts outside the ISR
    t.on_fetch("d", 0, 0, 1.1)
    assert t.to_expand() == {"d"}
    assert t.to_shrink(1.2) == frozenset()
    t.set_isr(("a", "b", "c"), 1.3)
    assert t.to_shrink(1.3) == {"c"}  # no longer a replica: out at once


def test_a_reassignment_record_knows_its_target_and_origin() -> None:
    moving = Assignment(
        replicas=("d", "e", "a", "b"), adding=("d", "e"), removing=("a", "b"), assigned_ms=1
    )
    assert moving.target == ("d", "e")
    assert moving.original == ("a", "b")
    assert moving.preferred == "d"
    assert moving.moving
    with pytest.raises(ValueError, match="both added and removed"):
        Assignment(replicas=("a", "b"), adding=("a",), removing=("a",), assigned_ms=1)
    with pytest.raises(ValueError, match="must be replicas"):
        Assignment(replicas=("a",), adding=("z",), assigned_ms=1)
    with pytest.raises(ValueError, match="retired"):
        Assignment(replicas=("a",), retired=("a",), assigned_ms=1)
    with pytest.raises(ValueError, match="min_insync"):
        Assignment(replicas=("a", "b"), removing=("b",), min_insync_replicas=2, assigned_ms=1)


def test_load_meter_reports_bytes_per_second_and_only_real_changes() -> None:
    meter = LoadMeter(total_bytes=0.0, at_s=0.0)
    rate = meter.rate(1_000_000.0, 10.0)
    assert rate == 100_000.0
    assert meter.worth_reporting(rate)  # the first report
    meter.reported = rate
    assert not meter.worth_reporting(110_000.0)  # within a fifth
    assert meter.worth_reporting(130_000.0)
    assert meter.rate(1_000_000.0, 10.0) == 0.0  # no time passed
    assert meter.rate(500.0, 20.0) == 0.0  # a counter never goes back: no negative rate
    meter.reported = 1000.0
    assert not meter.worth_reporting(20_000.0)  # both under the floor: noise
