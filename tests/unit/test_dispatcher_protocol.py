"""The dispatcher's bus bodies: poll replies round-trip records and refuse bad layouts,
requests (positions included) are validated with the bad field named, stats replies
round-trip, and dead letters go to the base topic."""

from __future__ import annotations

import json
import struct

import orjson
import pytest

from danube.bus import TopicName
from danube.dispatcher.deadletter import dead_letter_topic
from danube.frame import CorruptFrameError, Record, decode_record, encode_frame, encode_record
from danube.wire import delivery
from danube.wire.dispatcher import protocol

pytestmark = pytest.mark.unit


def _message(partition: str, offset: int, payload: bytes, count: int = 0) -> protocol.PolledMessage:
    record = encode_record(Record(payload=payload, publish_time_ms=5, producer="p"))
    return protocol.PolledMessage(partition, offset, count, encode_frame(offset, record))


def test_poll_reply_round_trips_in_order() -> None:
    messages = [_message("t-part-1", 7, b"x", 2), _message("t-part-0", 3, b"", 0)]
    batch = protocol.decode_poll_reply(protocol.encode_poll_reply(messages))
    got = [(m.partition, m.offset, m.redelivery_count, bytes(m.frame)) for m in batch.messages]
    assert got == [(m.partition, m.offset, m.redelivery_count, m.frame) for m in messages]
    assert [decode_record(m.record).payload for m in batch.messages] == [b"x", b""]


def test_poll_reply_carries_frames_unchanged() -> None:
    """The frames in the reply are byte for byte the ones given: no re-framing."""
    messages = [_message("t", 1, b"a" * 100), _message("t", 2, b"b")]
    body = protocol.encode_poll_reply(messages)
    assert body.endswith(b"".join(m.frame for m in messages))


def test_a_poll_reply_from_columns_is_the_one_from_messages() -> None:
    """The dispatcher's one-pass reply (columns, frames as views) is byte for byte the same."""
    messages = [_message("b", 4, b"x", 1), _message("a", 2, b"yy"), _message("b", 5, b"", 3)]
    body = protocol.encode_poll_columns(
        [m.partition for m in messages],
        [m.redelivery_count for m in messages],
        [memoryview(m.frame) for m in messages],
    )
    assert body == protocol.encode_poll_reply(messages)
    got = protocol.decode_poll_reply(body).messages
    assert [(m.partition, m.offset, m.redelivery_count) for m in got] == [
        ("b", 4, 1),
        ("a", 2, 0),
        ("b", 5, 3),
    ]
    assert protocol.encode_poll_columns([], [], []) == protocol.encode_poll_reply([])
    with pytest.raises(ValueError, match="columns differ"):
        protocol.encode_poll_columns(["a"], [0, 0], [messages[0].frame])


def test_empty_poll_reply() -> None:
    assert protocol.decode_poll_reply(protocol.encode_poll_reply([])).messages == []


def test_poll_reply_with_entries_and_frames_disagreeing_is_refused() -> None:
    body = protocol.encode_poll_reply([_message("t", 1, b"a"), _message("t", 2, b"b")])
    # The count says 1 (it follows the version, one partition named "t": 1 + 2 + 2 + 1).
    forged = body[:6] + struct.pack("<I", 1) + body[10:16] + body[22:]
    with pytest.raises(protocol.BadRequestError) as caught:
        protocol.decode_poll_reply(forged)
    assert caught.value.code == "bad_request"
    with pytest.raises(protocol.BadRequestError):
        protocol.decode_poll_reply(b"\x01\x00")
    with pytest.raises(protocol.BadRequestError):
        protocol.decode_poll_reply(body[:-1])  # a partial frame


def test_a_corrupt_frame_is_found_by_whoever_reads_its_record() -> None:
    body = bytearray(protocol.encode_poll_reply([_message("t", 1, b"abc"), _message("t", 2, b"d")]))
    body[-3] ^= 0x01  # a bit of the last record
    batch = protocol.decode_poll_reply(bytes(body))  # carried: split, not checked
    assert decode_record(batch.messages[0].record).payload == b"abc"
    with pytest.raises(CorruptFrameError):
        _ = batch.messages[1].record


def test_renaming_partitions_keeps_entries_and_frames() -> None:
    messages = [_message("t-part-1", 7, b"x", 2), _message("t-part-0", 3, b"yy", 0)]
    body = protocol.encode_poll_reply(messages)
    renamed = delivery.rename_partitions(body, lambda name: f"/default/{name}")
    got = delivery.decode_batch(renamed)
    assert [(m.partition, m.offset, m.redelivery_count) for m in got] == [
        ("/default/t-part-1", 7, 2),
        ("/default/t-part-0", 3, 0),
    ]
    assert [bytes(m.frame) for m in got] == [m.frame for m in messages]


def test_requests_are_validated_with_the_field_named() -> None:
    attach = protocol.parse(
        b'{"consumer":"c","type":"shared","start":{"offset":4}}', protocol.AttachRequest
    )
    assert (attach.type, attach.start) == ("shared", {"offset": 4})
    with pytest.raises(protocol.BadRequestError) as caught:
        protocol.parse(b'{"consumer_id":"c","max":0}', protocol.PollRequest)
    assert caught.value.code == "bad_request"
    assert "max" in caught.value.message
    keyed = protocol.parse(
        b'{"consumer":"c","type":"key_shared","key_filters":["user-*"]}', protocol.AttachRequest
    )
    assert (keyed.type, keyed.key_filters) == ("key_shared", ["user-*"])
    with pytest.raises(protocol.BadRequestError, match="key_filters"):
        protocol.parse(
            b'{"consumer":"c","type":"shared","key_filters":["a"]}', protocol.AttachRequest
        )
    too_many = b'{"consumer":"c","type":"key_shared","key_filters":[%s]}' % b",".join(
        b'"k"' for _ in range(33)
    )
    with pytest.raises(protocol.BadRequestError, match="key_filters"):
        protocol.parse(too_many, protocol.AttachRequest)
    too_long = b'{"consumer":"c","type":"key_shared","key_filters":["%s"]}' % (b"x" * 257)
    with pytest.raises(protocol.BadRequestError, match="key_filters"):
        protocol.parse(too_long, protocol.AttachRequest)
    with pytest.raises(protocol.BadRequestError):
        protocol.parse(b"not json", protocol.DetachRequest)


def test_dead_letters_of_a_partition_go_to_the_unpartitioned_base_topic() -> None:
    assert dead_letter_topic(TopicName("ns", "t-part-3"), "-dlq") == TopicName("ns", "t-dlq")
    assert dead_letter_topic(TopicName("ns", "t"), "-dlq") == TopicName("ns", "t-dlq")


@pytest.mark.parametrize(
    "position",
    ["latest", "earliest", {"offset": 0}, {"offset": 2**64 - 1}, {"timestamp_ms": 1700000000000}],
)
def test_seek_positions_accepted(position: protocol.StartPosition) -> None:
    request = protocol.parse(orjson.dumps({"position": position}), protocol.SeekRequest)
    assert request.position == position
    attach = protocol.parse(
        orjson.dumps({"consumer": "c", "start": position}), protocol.AttachRequest
    )
    assert attach.start == position


@pytest.mark.parametrize(
    "position",
    [
        "first",
        {"offset": -1},
        {"offset": 2**64},
        {"timestamp_ms": -5},
        {"time": 5},
        {"offset": 1, "timestamp_ms": 2},
        {},
    ],
)
def test_bad_seek_positions_are_refused_naming_the_field(position: object) -> None:
    # The standard json module: orjson refuses integers past 64 bits.
    with pytest.raises(protocol.BadRequestError) as caught:
        protocol.parse(json.dumps({"position": position}).encode(), protocol.SeekRequest)
    assert "position" in caught.value.message
    attach = json.dumps({"consumer": "c", "start": position}).encode()
    with pytest.raises(protocol.BadRequestError):
        protocol.parse(attach, protocol.AttachRequest)


def test_stats_and_delete_take_an_empty_body_and_nothing_else() -> None:
    assert protocol.parse(b"", protocol.EmptyRequest) == protocol.EmptyRequest()
    assert protocol.parse(b"{}", protocol.EmptyRequest) == protocol.EmptyRequest()
    with pytest.raises(protocol.BadRequestError):
        protocol.parse(b'{"force": true}', protocol.EmptyRequest)


def test_a_stats_reply_round_trips_and_ignores_fields_it_does_not_know() -> None:
    stats = protocol.SubscriptionStats(
        type="shared",
        partitions=[
            protocol.PartitionStats(
                partition="t-part-0",
                next_offset=3,
                read_position=9,
                acked_beyond=2,
                wal_start=0,
                wal_next=10,
                backlog=5,
            )
        ],
        consumers=[protocol.ConsumerStats(consumer_id="ab", name="c", unacked=4)],
    )
    body = protocol.encode(stats)
    assert protocol.parse(body, protocol.SubscriptionStats) == stats
    newer = orjson.loads(body) | {"since_ms": 5}
    assert protocol.parse(orjson.dumps(newer), protocol.SubscriptionStats) == stats


def test_check_position_refuses_what_the_schema_would_for_callers_that_skip_it() -> None:
    for bad in ("first", {"offset": 1, "timestamp_ms": 2}, {"offset": -1}, {}):
        with pytest.raises(ValueError, match="expected"):
            protocol.check_position(bad)  # type: ignore[arg-type]
    assert protocol.check_position({"timestamp_ms": 5}) == {"timestamp_ms": 5}


def test_an_ack_reply_names_the_refs_not_in_flight_and_an_older_one_none() -> None:
    reply = protocol.encode_ack_reply([("t-part-1", 7), ("t", 2**63 - 1)])
    assert protocol.decode_ack_reply(reply) == [("t-part-1", 7), ("t", 2**63 - 1)]
    assert protocol.decode_ack_reply(b'{"ok":true}') == []
    with pytest.raises(protocol.BadRequestError):
        protocol.decode_ack_reply(b'{"ok":true,"not_in_flight":[{"offset":1}]}')


def test_a_poll_reply_passed_on_is_counted_and_checked_as_one_split_is() -> None:
    messages = [_message("t-part-1", 7, b"x", 2), _message("t-part-0", 3, b"yy", 0)]
    body = protocol.encode_poll_reply(messages)
    assert protocol.check_poll_reply(body) == (body, 2)
    assert protocol.check_poll_reply(protocol.encode_poll_reply([])).size == 0
    # An entry naming a partition the table does not hold (two are named), a byte past the
    # frames, a partial frame, entries and frames disagreeing, a cut table.
    bad = bytearray(body)
    table_end = 3 + sum(2 + len(name) for name in ("t-part-1", "t-part-0"))
    bad[table_end + 4 : table_end + 6] = struct.pack("<H", 2)
    fewer = body[:table_end] + struct.pack("<I", 1) + body[table_end + 4 : table_end + 10]
    fewer += body[table_end + 16 :]
    for refused in (bytes(bad), body + b"\x00", body[:-1], fewer, body[:5]):
        with pytest.raises(protocol.BadRequestError):
            protocol.check_poll_reply(refused)
        with pytest.raises(protocol.BadRequestError):
            protocol.decode_poll_reply(refused)
