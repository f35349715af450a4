"""Retention decisions without I/O: which WAL segments and objects may go (by the limits, and
under queue retention by the ack floor), which topics count and in which mode."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from danube.meta.records import (
    DroppedCount,
    NamespacePolicy,
    Policies,
    RetentionPolicy,
    RetentionTally,
    TopicConfig,
)
from danube.names import TopicName
from danube.retention.policy import (
    MIB,
    NOTHING,
    Dropped,
    Limits,
    PartitionPolicy,
    StoredObject,
    WalDrop,
    acked_prefix,
    plan_object_expiry,
    plan_wal_drop,
    reliable_partitions,
)
from danube.retention.tally import added
from danube.wire.ingest.control import SegmentInfo

pytestmark = pytest.mark.unit

NOW_MS = 10_000_000_000
MINUTE_MS = 60_000
OLD_MS = NOW_MS - 120 * MINUTE_MS  # two hours ago
NEW_MS = NOW_MS - MINUTE_MS
HOUR = Limits.of(60, None)


def _segments(*specs: tuple[int, int, int]) -> list[SegmentInfo]:
    """Consecutive sealed segments of ``(message count, size, modified_ms)`` from offset 0;
    the last one is the active (unsealed) segment."""
    segments, first = [], 0
    for index, (count, size, modified) in enumerate(specs):
        sealed = index < len(specs) - 1
        segments.append(SegmentInfo(first, first + count, size, sealed, modified))
        first += count
    return segments


def _wal(
    segments: list[SegmentInfo],
    uploaded: int | None,
    limits: Limits = HOUR,
    *,
    listed: int | None = None,
    floor: int | None = None,
    hold_ms: int = 0,
) -> WalDrop | None:
    return plan_wal_drop(
        segments[:listed] if listed is not None else segments,
        segment_count=len(segments),
        disk_bytes=sum(s.size_bytes for s in segments),
        uploaded_through=uploaded,
        limits=limits,
        now_ms=NOW_MS,
        ack_floor=floor,
        ack_hold_ms=hold_ms,
    )


# --- WAL ---------------------------------------------------------------------------------------


def test_only_segments_both_uploaded_and_old_go() -> None:
    wal = _segments((10, 100, OLD_MS), (10, 100, OLD_MS), (10, 100, OLD_MS), (10, 100, NEW_MS))
    # Offsets 0..19 uploaded: the first two segments; the third (20..29) is not wholly uploaded.
    assert _wal(wal, 25) == WalDrop(below_offset=20, segments=2, size_bytes=200)


def test_a_segment_uploaded_up_to_its_last_offset_goes() -> None:
    wal = _segments((10, 100, OLD_MS), (10, 100, OLD_MS), (10, 100, NEW_MS))
    assert _wal(wal, 9) == WalDrop(below_offset=10, segments=1, size_bytes=100)
    assert _wal(wal, 8) is None  # offset 9 is not uploaded: the segment stays whole


def test_no_checkpoint_or_nothing_uploaded_drops_nothing() -> None:
    wal = _segments((10, 100, OLD_MS), (10, 100, OLD_MS), (10, 100, NEW_MS))
    assert _wal(wal, None) is None
    assert _wal(wal, -1) is None


def test_a_young_segment_stops_the_drop_even_if_older_ones_follow() -> None:
    wal = _segments((10, 100, OLD_MS), (10, 100, NEW_MS), (10, 100, OLD_MS), (10, 100, NEW_MS))
    assert _wal(wal, 1000) == WalDrop(below_offset=10, segments=1, size_bytes=100)


def test_the_active_segment_never_goes_even_when_uploaded_and_old() -> None:
    wal = _segments((10, 100, OLD_MS), (10, 100, OLD_MS))
    assert _wal(wal, 1000) == WalDrop(below_offset=10, segments=1, size_bytes=100)
    # Sealed but the newest (e.g. after a restart): still kept.
    only = [SegmentInfo(0, 10, 100, True, OLD_MS)]
    assert _wal(only, 1000) is None


def test_an_unsealed_segment_is_never_dropped() -> None:
    wal = [SegmentInfo(0, 10, 100, False, OLD_MS), SegmentInfo(10, 20, 100, False, OLD_MS)]
    assert _wal(wal, 1000) is None


def test_size_policy_drops_oldest_uploaded_until_under_the_limit() -> None:
    mib = MIB
    wal = _segments(*[(10, mib, NEW_MS)] * 5)  # 5 MiB, nothing old
    assert _wal(wal, 1000, Limits.of(None, 2)) == WalDrop(30, 3, 3 * mib)
    assert _wal(wal, 1000, Limits.of(None, 5)) is None  # at the limit is not over it
    # Size never overrides the upload condition.
    assert _wal(wal, 14, Limits.of(None, 1)) == WalDrop(10, 1, mib)


def test_age_and_size_combine_as_or() -> None:
    mib = MIB
    wal = _segments((10, mib, OLD_MS), (10, mib, NEW_MS), (10, mib, NEW_MS), (10, mib, NEW_MS))
    # 4 MiB, limit 3 MiB: the old one goes by age, and then the WAL is at 3 MiB: enough.
    assert _wal(wal, 1000, Limits.of(60, 3)) == WalDrop(10, 1, mib)
    assert _wal(wal, 1000, Limits.of(60, 2)) == WalDrop(20, 2, 2 * mib)


def test_a_partial_listing_may_drop_every_listed_segment() -> None:
    wal = _segments(*[(10, 100, OLD_MS)] * 6)
    # Only the 3 oldest were listed: the newest is not among them.
    assert _wal(wal, 1000, listed=3) == WalDrop(30, 3, 300)


def test_a_segment_with_an_unknown_end_stops_the_drop() -> None:
    wal = [
        SegmentInfo(0, 10, 100, True, OLD_MS),
        SegmentInfo(10, None, 100, True, OLD_MS),
        SegmentInfo(20, 30, 100, False, NEW_MS),
    ]
    assert _wal(wal, 1000) == WalDrop(10, 1, 100)


def test_age_is_strictly_older_than_the_limit() -> None:
    at_limit = NOW_MS - 60 * MINUTE_MS
    wal = _segments((10, 100, at_limit), (10, 100, at_limit - 1), (10, 100, NEW_MS))
    assert _wal(wal, 1000) is None
    wal = _segments((10, 100, at_limit - 1), (10, 100, at_limit), (10, 100, NEW_MS))
    assert _wal(wal, 1000) == WalDrop(10, 1, 100)


@given(
    sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=20),
    counts=st.lists(st.integers(1, 50), min_size=20, max_size=20),
    ages=st.lists(st.booleans(), min_size=20, max_size=20),
    uploaded=st.integers(-1, 1200),
    max_age=st.one_of(st.none(), st.just(60)),
    max_mb=st.one_of(st.none(), st.integers(1, 3)),
)
def test_wal_plan_never_exceeds_the_upload_or_touches_the_active_segment(
    sizes: list[int],
    counts: list[int],
    ages: list[bool],
    uploaded: int,
    max_age: int | None,
    max_mb: int | None,
) -> None:
    specs = [
        (counts[i], size * 1024, OLD_MS if ages[i] else NEW_MS) for i, size in enumerate(sizes)
    ]
    wal = _segments(*specs)
    plan = _wal(wal, uploaded, Limits.of(max_age, max_mb))
    if plan is None:
        return
    assert plan.below_offset <= uploaded + 1
    assert plan.segments < len(wal)
    assert plan.below_offset == wal[plan.segments - 1].next_offset
    assert plan.size_bytes == sum(s.size_bytes for s in wal[: plan.segments])


def test_queue_retention_drops_uploaded_segments_below_the_ack_floor_however_young() -> None:
    wal = _segments((10, 100, NEW_MS), (10, 100, NEW_MS), (10, 100, NEW_MS), (10, 100, NEW_MS))
    # Every subscription acked below 25: segments 0..9 and 10..19 go, 20..29 holds 25..29.
    assert _wal(wal, 1000, floor=25) == WalDrop(below_offset=20, segments=2, size_bytes=200)
    assert _wal(wal, 1000, floor=20) == WalDrop(below_offset=20, segments=2, size_bytes=200)
    assert _wal(wal, 1000, floor=19) == WalDrop(below_offset=10, segments=1, size_bytes=100)
    assert _wal(wal, 1000, floor=None) is None  # young, and no floor: all stay


def test_queue_retention_never_drops_what_is_not_uploaded_or_the_active_segment() -> None:
    wal = _segments((10, 100, NEW_MS), (10, 100, NEW_MS), (10, 100, NEW_MS))
    assert _wal(wal, 14, floor=30) == WalDrop(below_offset=10, segments=1, size_bytes=100)
    assert _wal(wal, None, floor=30) is None
    # All acked and uploaded: the active segment stays all the same.
    assert _wal(wal, 1000, floor=30) == WalDrop(below_offset=20, segments=2, size_bytes=200)


def test_queue_retention_keeps_the_limits_for_what_is_not_acked() -> None:
    wal = _segments((10, 100, NEW_MS), (10, 100, OLD_MS), (10, 100, OLD_MS), (10, 100, NEW_MS))
    # Acked below 10, and 10..29 old: the limits take on where the acks stop.
    assert _wal(wal, 1000, floor=10) == WalDrop(below_offset=30, segments=3, size_bytes=300)


def test_queue_retention_holds_acked_segments_within_the_message_id_window() -> None:
    wal = _segments((10, 100, OLD_MS), (10, 100, NEW_MS), (10, 100, NEW_MS))
    # Acked, but the segment written a minute ago is within a 10-minute window: it stays.
    assert _wal(wal, 1000, Limits.of(None, None), floor=30, hold_ms=10 * MINUTE_MS) == WalDrop(
        below_offset=10, segments=1, size_bytes=100
    )
    assert _wal(wal, 1000, Limits.of(None, None), floor=30, hold_ms=MINUTE_MS) == WalDrop(
        below_offset=20, segments=2, size_bytes=200
    )


@given(
    counts=st.lists(st.integers(1, 50), min_size=2, max_size=20),
    ages=st.lists(st.booleans(), min_size=20, max_size=20),
    uploaded=st.integers(-1, 1200),
    floor=st.one_of(st.none(), st.integers(0, 1200)),
)
def test_queue_plan_drops_a_prefix_each_unit_acked_old_or_both(
    counts: list[int], ages: list[bool], uploaded: int, floor: int | None
) -> None:
    wal = _segments(*[(c, 100, OLD_MS if ages[i] else NEW_MS) for i, c in enumerate(counts)])
    plan = _wal(wal, uploaded, floor=floor)
    without = _wal(wal, uploaded)
    if plan is None:
        assert without is None
        return
    assert plan.below_offset <= uploaded + 1
    assert plan.segments < len(wal)
    for segment in wal[: plan.segments]:
        assert segment.modified_ms == OLD_MS or (
            floor is not None and segment.next_offset is not None and segment.next_offset <= floor
        )
    assert without is None or without.segments <= plan.segments  # the floor only adds


# --- object storage ----------------------------------------------------------------------------


def _objects(*specs: tuple[int, int]) -> list[StoredObject]:
    """Consecutive objects of 100 offsets each, ``(size, created_ms)``."""
    return [
        StoredObject(i * 100, i * 100 + 99, size, created)
        for i, (size, created) in enumerate(specs)
    ]


def test_expired_objects_go_oldest_first_and_a_young_one_stops_it() -> None:
    objects = _objects((10, OLD_MS), (10, OLD_MS), (10, NEW_MS), (10, OLD_MS), (10, NEW_MS))
    assert plan_object_expiry(objects, complete=True, limits=HOUR, now_ms=NOW_MS) == 2


def test_the_newest_object_stays_even_when_expired() -> None:
    objects = _objects((10, OLD_MS), (10, OLD_MS), (10, OLD_MS))
    assert plan_object_expiry(objects, complete=True, limits=HOUR, now_ms=NOW_MS) == 2
    # When only the oldest were read, the newest is not among them.
    assert plan_object_expiry(objects, complete=False, limits=HOUR, now_ms=NOW_MS) == 3


def test_size_limit_deletes_oldest_until_under_it() -> None:
    objects = _objects(*[(400 * 1024, NEW_MS)] * 5)  # 2000 KiB
    limits = Limits.of(None, 1)  # 1024 KiB
    assert plan_object_expiry(objects, complete=True, limits=limits, now_ms=NOW_MS) == 3
    # Never the newest, even if it alone is over the limit.
    big = _objects((2 * MIB, NEW_MS), (3 * MIB, NEW_MS))
    assert plan_object_expiry(big, complete=True, limits=limits, now_ms=NOW_MS) == 1


def test_no_policy_keeps_everything() -> None:
    objects = _objects((10, 0), (10, 0), (10, 0))
    assert (
        plan_object_expiry(objects, complete=True, limits=Limits.of(None, None), now_ms=NOW_MS) == 0
    )
    assert plan_object_expiry([], complete=True, limits=HOUR, now_ms=NOW_MS) == 0


def test_queue_retention_deletes_objects_below_the_ack_floor_the_newest_too() -> None:
    objects = _objects((10, NEW_MS), (10, NEW_MS), (10, NEW_MS))  # offsets 0..299
    none = Limits.of(None, None)

    def plan(floor: int | None, limits: Limits = none) -> int:
        return plan_object_expiry(
            objects, complete=True, limits=limits, now_ms=NOW_MS, ack_floor=floor
        )

    assert plan(None) == 0
    assert plan(0) == 0
    assert plan(199) == 1  # offset 199 unacked by someone: the second object stays
    assert plan(200) == 2
    assert plan(300) == 3  # all acked: nothing is left, the newest included
    # The limits still apply beyond the floor, but never to the newest.
    old = _objects((10, OLD_MS), (10, OLD_MS), (10, OLD_MS))
    assert plan_object_expiry(old, complete=True, limits=HOUR, now_ms=NOW_MS, ack_floor=50) == 2


def test_acked_prefix_counts_the_units_wholly_below_the_floor() -> None:
    assert acked_prefix([9, 19, 29], 20) == 2
    assert acked_prefix([9, 19, 29], 19) == 1
    assert acked_prefix([9, 19, 29], None) == 0
    assert acked_prefix([], 100) == 0


def test_objects_out_of_order_are_refused() -> None:
    objects = list(reversed(_objects((10, OLD_MS), (10, OLD_MS))))
    with pytest.raises(ValueError, match="offset order"):
        plan_object_expiry(objects, complete=True, limits=HOUR, now_ms=NOW_MS)


# --- partitions --------------------------------------------------------------------------------


def test_only_reliable_topics_are_looked_at_partition_by_partition() -> None:
    week = RetentionPolicy(time_minutes=7 * 24 * 60)
    topics = [
        (TopicName("ns", "plain"), TopicConfig(created_ms=0)),
        (TopicName("ns", "parts"), TopicConfig(partitions=2, retention=week, created_ms=0)),
        (TopicName("ns", "fast"), TopicConfig(dispatch="non_reliable", created_ms=0)),
    ]
    assert reliable_partitions(topics) == [
        PartitionPolicy(TopicName("ns", "plain"), RetentionPolicy()),
        PartitionPolicy(TopicName("ns", "parts-part-0"), week),
        PartitionPolicy(TopicName("ns", "parts-part-1"), week),
    ]


def test_a_topic_inherits_each_retention_limit_it_leaves_unset_from_its_namespace() -> None:
    day, gb = RetentionPolicy(time_minutes=24 * 60), RetentionPolicy(size_mb=1024)
    namespaces = {
        "ns": NamespacePolicy(created_ms=0, retention=RetentionPolicy(time_minutes=60, size_mb=500))
    }
    topics = [
        (TopicName("ns", "bare"), TopicConfig(created_ms=0)),
        (TopicName("ns", "timed"), TopicConfig(retention=day, created_ms=0)),
        (TopicName("ns", "sized"), TopicConfig(retention=gb, created_ms=0)),
        (TopicName("other", "bare"), TopicConfig(created_ms=0)),  # its namespace has none
    ]
    assert reliable_partitions(topics, namespaces) == [
        PartitionPolicy(TopicName("ns", "bare"), RetentionPolicy(time_minutes=60, size_mb=500)),
        PartitionPolicy(
            TopicName("ns", "timed"), RetentionPolicy(time_minutes=24 * 60, size_mb=500)
        ),
        PartitionPolicy(TopicName("ns", "sized"), RetentionPolicy(time_minutes=60, size_mb=1024)),
        PartitionPolicy(TopicName("other", "bare"), RetentionPolicy()),
    ]


def test_retention_mode_is_inherited_from_the_namespace_and_a_topic_may_override_it() -> None:
    queue, limits = Policies(retention_mode="queue"), Policies(retention_mode="time_size")
    namespaces = {"q": NamespacePolicy(created_ms=0, policies=queue)}
    topics = [
        (TopicName("q", "inherits"), TopicConfig(created_ms=0)),
        (TopicName("q", "opts-out"), TopicConfig(created_ms=0, policies=limits)),
        (TopicName("plain", "own"), TopicConfig(created_ms=0, policies=queue, partitions=2)),
        (TopicName("plain", "bare"), TopicConfig(created_ms=0)),
    ]
    partitions = reliable_partitions(topics, namespaces)
    found = {str(item.partition): item.queue for item in partitions}
    assert found == {
        "/q/inherits": True,
        "/q/opts-out": False,
        "/plain/own-part-0": True,
        "/plain/own-part-1": True,
        "/plain/bare": False,
    }
    assert {item.ack_hold_ms for item in partitions} == {0}  # no message-id window set


def test_the_tally_adds_each_drop_to_its_tier_split_by_reason() -> None:
    tally = added(RetentionTally(), "cloud", Dropped(2, 1000, 5000), Dropped(1, 600, 3000), 7)
    tally = added(tally, "wal", Dropped(3, 90, 900), NOTHING, 9)
    tally = added(tally, "cloud", Dropped(1, 10, 50), Dropped(1, 10, 50), 8)
    assert tally.cloud_acked == DroppedCount(messages=610, size_bytes=3050)
    assert tally.cloud_limits == DroppedCount(messages=400, size_bytes=2000)
    assert tally.wal_acked == DroppedCount()
    assert tally.wal_limits == DroppedCount(messages=90, size_bytes=900)
    assert tally.updated_ms == 9  # never backwards


def test_a_queue_topic_holds_acked_wal_data_for_its_message_id_window() -> None:
    policies = Policies(retention_mode="queue", message_id_window_s=120)
    topics = [
        (TopicName("ns", "q"), TopicConfig(created_ms=0, policies=policies)),
        (TopicName("ns", "s"), TopicConfig(created_ms=0, policies=Policies(message_id_window_s=9))),
    ]
    assert [item.ack_hold_ms for item in reliable_partitions(topics)] == [120_000, 0]
