"""The fault tests' history checker (tests/history.py): each anomaly, what is allowed, dump/load."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.history import Delivery, History, Produce, Report

pytestmark = pytest.mark.unit

T = "/default/t"
U = "/default/u"


def _clean(count: int = 5, partition: str = T) -> History:
    """`count` acked messages at offsets 0.., each delivered once, in order, to consumer c."""
    history = History()
    for offset in range(count):
        history.produced(f"m{offset}", partition=partition, offset=offset, acked=True)
    for offset in range(count):
        history.delivered(f"m{offset}", partition=partition, offset=offset, consumer="c")
    return history


def test_a_clean_history_is_ok() -> None:
    report = _clean().check(expect_contiguous_from={T: 0})
    assert report == Report()
    assert report.ok
    assert report.summary().startswith("ok=True lost=0")


def test_an_acked_message_never_delivered_is_lost() -> None:
    history = _clean(3)
    history.produced("late", partition=T, offset=3, acked=True)
    report = history.check()
    assert report.lost == [Produce("late", T, 3, True)]
    assert not report.ok
    assert "lost: late at /default/t@3" in report.summary()


def test_two_acks_for_one_offset_conflict() -> None:
    history = _clean(2)
    history.produced("other", partition=T, offset=1, acked=True)
    report = history.check()
    assert report.conflicts == ["/default/t@1 acked for both m1 and other"]
    # The second ack's message was never delivered under its id either.
    assert report.lost == [Produce("other", T, 1, True)]
    assert not report.ok


def test_a_delivery_disagreeing_with_the_ack_conflicts() -> None:
    history = History()
    history.produced("a", partition=T, offset=0, acked=True)
    history.delivered("b", partition=T, offset=0)
    report = history.check()
    assert report.conflicts == ["/default/t@0 acked for a, delivered b"]
    assert report.lost == [Produce("a", T, 0, True)]


def test_two_deliveries_disagreeing_conflict() -> None:
    history = History()
    history.delivered("a", partition=T, offset=0, consumer="c1")
    history.delivered("b", partition=T, offset=0, consumer="c2")
    report = history.check()
    assert report.conflicts == ["/default/t@0 delivered both a and b"]
    assert report.duplicates == 0


def test_a_first_delivery_below_the_previous_one_is_an_order_violation() -> None:
    history = History()
    for offset in (0, 2, 1, 3):
        history.delivered(f"m{offset}", partition=T, offset=offset, consumer="c")
    report = history.check()
    assert report.order_violations == ["consumer 'c' got /default/t@1 after offset 2"]
    assert report.gaps == []
    assert not report.ok


def test_order_is_per_consumer_and_partition() -> None:
    history = History()
    history.delivered("u5", partition=U, offset=5, consumer="c")
    history.delivered("t0", partition=T, offset=0, consumer="c")
    history.delivered("t1", partition=T, offset=1, consumer="d")
    history.delivered("t0", partition=T, offset=0, consumer="d")
    report = history.check()
    assert report.order_violations == ["consumer 'd' got /default/t@0 after offset 1"]
    assert report.duplicates == 1


def test_redeliveries_are_duplicates_not_violations() -> None:
    history = _clean(4)
    for offset in (1, 2, 0, 3):  # after a reconnect, in any order
        history.delivered(f"m{offset}", partition=T, offset=offset, consumer="c")
    report = history.check()
    assert report.duplicates == 4
    assert report.order_violations == []
    assert report.ok


def test_a_hole_between_delivered_offsets_is_a_gap() -> None:
    history = History()
    for offset in (0, 1, 4, 5, 7):
        history.delivered(f"m{offset}", partition=T, offset=offset)
    report = history.check()
    assert report.gaps == ["/default/t: offsets 2..3 missing", "/default/t: offsets 6..6 missing"]
    assert not report.ok


def test_a_missing_head_is_a_gap_only_when_the_start_is_expected() -> None:
    history = History()
    for offset in (3, 4):
        history.delivered(f"m{offset}", partition=T, offset=offset)
    assert history.check().gaps == []
    report = history.check(expect_contiguous_from={T: 0, U: 0})
    assert report.gaps == ["/default/t: offsets 0..2 missing"]
    # Deliveries below the expected start are neither gaps nor errors.
    assert history.check(expect_contiguous_from={T: 4}).ok


def test_a_wide_gap_is_one_range() -> None:
    history = History()
    history.delivered("a", partition=T, offset=0)
    history.delivered("b", partition=T, offset=10**15)
    assert history.check().gaps == [f"/default/t: offsets 1..{10**15 - 1} missing"]


def test_unacked_messages_may_be_delivered_or_not() -> None:
    history = _clean(2)
    history.produced("timed-out", acked=False)
    history.produced("stored-anyway", acked=False)
    history.delivered("stored-anyway", partition=T, offset=2, consumer="c")
    # Retried after a timeout and then acked: an acked message, not an unacked one.
    history.produced("retried", acked=False)
    history.produced("retried", partition=T, offset=3, acked=True)
    history.delivered("retried", partition=T, offset=3, consumer="c")
    report = history.check(expect_contiguous_from={T: 0})
    assert report.unacked_delivered == 1
    assert report.lost == []
    assert report.ok


def test_summary_shows_the_first_few_examples_and_how_many_more() -> None:
    history = History()
    for offset in range(6):
        history.produced(f"m{offset}", partition=T, offset=offset, acked=True)
    summary = history.check().summary()
    assert "ok=False lost=6" in summary
    assert summary.count("lost: m") == 3
    assert "lost: ... 3 more" in summary


def test_bad_events_are_refused() -> None:
    history = History()
    with pytest.raises(ValueError, match="needs partition and offset"):
        history.produced("a", partition=T, acked=True)
    with pytest.raises(ValueError, match="offset must be"):
        history.delivered("a", partition=T, offset=-1)
    with pytest.raises(ValueError, match="msg_id"):
        history.delivered("", partition=T, offset=0)
    assert history.events == []


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    history = _clean(3)
    history.produced("lost", partition=U, offset=0, acked=True)
    history.produced("unknown", acked=False)
    history.delivered("m1", partition=T, offset=1, consumer="d")
    path = tmp_path / "history.jsonl"
    history.dump(path)
    assert path.read_text().splitlines()[0] == (
        '{"kind": "produce", "msg_id": "m0", "partition": "/default/t", "offset": 0, "acked": true}'
    )
    loaded = History.load(path)
    assert loaded.events == history.events
    assert loaded.check() == history.check()
    assert loaded.deliveries[-1] == Delivery("m1", T, 1, "d")


@pytest.mark.parametrize(
    "line",
    [
        '{"kind": "nope", "msg_id": "a"}',
        '{"kind": "delivery", "msg_id": "a", "partition": "/default/t"}',
        '{"kind": "delivery", "msg_id": "a", "partition": "/default/t", "offset": "1"}',
        '{"kind": "delivery", "msg_id": "a", "partition": null, "offset": 0}',
        '{"kind": "delivery", "msg_id": "a", "partition": 7, "offset": 0}',
        '{"kind": "produce", "msg_id": "a", "partition": null, "offset": null, "acked": 1}',
        "[1, 2]",
        "{not json",
    ],
)
def test_load_refuses_a_bad_line_and_names_it(tmp_path: Path, line: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(_clean_line() + "\n" + line + "\n")
    with pytest.raises(ValueError, match=r"history\.jsonl:2: bad history event"):
        History.load(path)


def _clean_line() -> str:
    return '{"kind": "delivery", "msg_id": "a", "partition": "/default/t", "offset": 0}'


# --- a property: any clean log checks ok; dropping one acked message's deliveries loses it --


@st.composite
def clean_logs(draw: st.DrawFn) -> History:
    """Random partitions with contiguous offsets from 0, some produces unacked (but stored),
    each partition read in order by its own consumer with random redeliveries, partitions
    interleaved at random."""
    history = History()
    streams: list[list[Delivery]] = []
    for index in range(draw(st.integers(1, 3))):
        partition = f"/default/t-part-{index}"
        stream: list[Delivery] = []
        for offset in range(draw(st.integers(0, 12))):
            msg_id = f"{partition}#{offset}"
            if draw(st.booleans()):
                history.produced(msg_id, partition=partition, offset=offset, acked=True)
            else:
                history.produced(msg_id, acked=False)
            stream.append(Delivery(msg_id, partition, offset, f"c{index}"))
            for _ in range(draw(st.integers(0, 2))):  # redeliver something already seen
                stream.append(stream[draw(st.integers(0, len(stream) - 1))])
        streams.append(stream)
    while any(streams):
        stream = draw(st.sampled_from([s for s in streams if s]))
        d = stream.pop(0)
        history.delivered(d.msg_id, partition=d.partition, offset=d.offset, consumer=d.consumer)
    return history


@settings(max_examples=300, deadline=None)
@given(clean_logs(), st.data())
def test_clean_logs_check_ok_and_a_dropped_ack_is_lost(
    history: History, data: st.DataObject
) -> None:
    starts = {d.partition: 0 for d in history.deliveries}
    report = history.check(expect_contiguous_from=starts)
    assert report.ok, report.summary()
    distinct = {(d.partition, d.offset) for d in history.deliveries}
    assert report.duplicates == len(history.deliveries) - len(distinct)
    assert report.unacked_delivered == sum(not p.acked for p in history.produces)

    acked = [p for p in history.produces if p.acked]
    if not acked:
        return
    victim = data.draw(st.sampled_from(acked))
    broken = History()
    broken.events = [e for e in history.events if not _delivers(e, victim)]
    report = broken.check(expect_contiguous_from=starts)
    assert report.lost == [victim]
    assert not report.ok


def _delivers(event: Produce | Delivery, produce: Produce) -> bool:
    return isinstance(event, Delivery) and event.msg_id == produce.msg_id


def test_a_message_stored_at_two_offsets_counts_only_when_exactly_once_is_expected() -> None:
    history = _clean(3)
    history.produced("m1", partition=T, offset=3, acked=True)  # a resend stored again
    history.delivered("m1", partition=T, offset=3, consumer="c")
    assert history.check().ok  # at-least-once allows it
    report = history.check(exactly_once=True)
    assert report.stored_twice == ["m1 at /default/t@1, /default/t@3"]
    assert not report.ok
    assert "stored twice: m1" in report.summary()
    assert _clean(3).check(exactly_once=True).ok  # redelivering one offset is not storing twice
