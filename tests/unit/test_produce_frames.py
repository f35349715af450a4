"""The binary produce body without a server: the producer's frame encoder against the WAL's
record and frame codecs, the one-pass scan (every damaged or cut body refused, the record
check agreeing with decode_record_fields), the framed ingest request, and discovery's query
parameters and runs answer."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.discovery.errors import BadRequestError
from danube.frame import (
    CorruptFrameError,
    CorruptRecordError,
    FrameError,
    Record,
    TruncatedFramesError,
    decode_frames,
    decode_record,
    decode_record_fields,
    encode_frame,
    encode_record,
)
from danube.frame.produce import (
    check_record,
    encode_produce_frame,
    frame_for_produce,
    scan_frames_for_produce,
    stamp_schema,
)
from danube.frame.record import sequence_runs
from danube.meta import TopicName
from danube.wire.ingest import protocol
from danube.wire.produce_binary import parse_binary_params, runs_answer

pytestmark = pytest.mark.unit

text = st.text(max_size=12)
records = st.builds(
    Record,
    payload=st.binary(max_size=64),
    publish_time_ms=st.integers(0, 2**64 - 1),
    producer=text,
    key=st.none() | text,
    attributes=st.dictionaries(text, text, max_size=4),
    sequence=st.none() | st.integers(0, 2**64 - 1),
).map(lambda r: r if r.sequence is None else dataclasses.replace(r, producer_epoch=9))


def _produced(record: Record) -> bytes:
    return encode_produce_frame(
        record.payload,
        producer=record.producer.encode(),
        publish_time_ms=record.publish_time_ms,
        key=None if record.key is None else record.key.encode(),
        attributes=[(k.encode(), v.encode()) for k, v in record.attributes.items()],
        sequence=record.sequence,
        producer_epoch=record.producer_epoch,
    )


@settings(max_examples=40)
@given(st.lists(records, min_size=1, max_size=5))
def test_produced_frames_are_the_wal_frames_of_offset_0_and_scan_back(batch: list[Record]) -> None:
    body = b"".join(_produced(r) for r in batch)
    assert body == b"".join(encode_frame(0, encode_record(r)) for r in batch)
    frames = scan_frames_for_produce(body, max_count=10)
    assert len(frames) == len(batch)
    assert frames.keys == [r.key for r in batch]
    assert frames.payload_sizes == [len(r.payload) for r in batch]
    assert [decode_record(frames.record(i)) for i in range(len(batch))] == batch
    assert [bytes(frames.payload(i)) for i in range(len(batch))] == [r.payload for r in batch]
    assert b"".join(frames.frames(range(len(batch)))) == body


# Records as an idempotent producer (or a hostile client) sends them: a few producers and
# epochs, sequences mostly going on by one, some not, some records unsequenced or keyed.
steps = st.lists(
    st.tuples(
        st.sampled_from(["p", "q", "é"]),
        st.integers(1, 2),
        st.none() | st.sampled_from([1, 1, 1, 0, 2, -1]),
        st.none() | st.just("k"),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150)
@given(steps)
def test_the_scan_reads_the_runs_sequence_runs_reads(
    batch: list[tuple[str, int, int | None, str | None]],
) -> None:
    sequence = 5
    chosen = []
    for producer, epoch, step, key in batch:
        if step is not None:
            sequence = max(0, sequence + step)
        chosen.append(
            Record(
                payload=b"x",
                publish_time_ms=1,
                producer=producer,
                key=key,
                sequence=None if step is None else sequence,
                producer_epoch=0 if step is None else epoch,
            )
        )
    frames = scan_frames_for_produce(b"".join(_produced(r) for r in chosen), max_count=20)
    assert frames.runs == sequence_runs([bytes(frames.record(i)) for i in range(len(chosen))])


@settings(max_examples=60)
@given(records, st.data())
def test_every_flipped_byte_and_every_cut_is_refused(record: Record, data: st.DataObject) -> None:
    body = _produced(record) * 2
    at = data.draw(st.integers(0, len(body) - 1))
    damaged = bytearray(body)
    damaged[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(FrameError):
        scan_frames_for_produce(bytes(damaged), max_count=10)
    cut = data.draw(st.integers(0, len(body) - 1))
    if cut != len(body) // 2:  # a cut between the two frames leaves one whole frame
        with pytest.raises(TruncatedFramesError):
            scan_frames_for_produce(body[:cut], max_count=10)


def test_the_codes_a_client_is_answered_with() -> None:
    frame = _produced(Record(payload=b"x", publish_time_ms=1, producer="p"))
    damaged = bytearray(frame)
    damaged[-1] ^= 1
    with pytest.raises(CorruptFrameError, match="crc mismatch"):
        scan_frames_for_produce(bytes(damaged), max_count=1)
    with pytest.raises(CorruptFrameError, match="offset 0"):
        scan_frames_for_produce(encode_frame(7, frame[16:]), max_count=1)
    with pytest.raises(TruncatedFramesError):
        scan_frames_for_produce(b"", max_count=1)
    stamped = frame_for_produce(stamp_schema(frame[16:], 3, 4))
    with pytest.raises(CorruptRecordError, match="schema"):
        scan_frames_for_produce(stamped, max_count=1)
    fields = decode_record_fields(
        scan_frames_for_produce(stamped, max_count=1, stamped=True).record(0)
    )
    assert (fields.schema_id, fields.schema_version, fields.payload) == (3, 4, b"x")
    assert len(scan_frames_for_produce(frame * 3, max_count=2)) == 3  # stops past the limit


def test_a_plain_record_that_only_looks_right_is_refused_with_its_reason() -> None:
    # Plain records (no key, attributes or schema) are checked in the scan's own loop; one
    # whose producer is not UTF-8, or whose lengths disagree, must still be refused, in its
    # place among good ones, with the general check's reason.
    good = encode_produce_frame(b"payload", producer=b"p", publish_time_ms=1)
    keyed = encode_produce_frame(b"k!", producer=b"p", publish_time_ms=1, key=b"key")
    frames = scan_frames_for_produce(good + keyed + good, max_count=3)
    assert frames.keys == [None, "key", None]
    assert frames.payload_sizes == [7, 2, 7]
    bad_name = encode_produce_frame(b"payload", producer=b"\xff\xfe", publish_time_ms=1)
    with pytest.raises(CorruptRecordError, match="record 1: producer or key is not valid UTF-8"):
        scan_frames_for_produce(good + bad_name + good, max_count=3)
    record = bytearray(good[16:])
    record[24] = 8  # payload_len (the header's last field, at 24): one byte more than there is
    with pytest.raises(CorruptRecordError, match="truncated in payload"):
        scan_frames_for_produce(good + frame_for_produce(bytes(record)), max_count=2)


@settings(max_examples=120)
@given(records, st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3))
def test_the_record_check_agrees_with_the_decoder(
    record: Record, flips: list[tuple[int, int]]
) -> None:
    raw = bytearray(encode_record(record))
    for at, value in flips:
        if at < len(raw):
            raw[at] = value
    view = memoryview(bytes(raw))
    try:
        fields = decode_record_fields(view)
    except CorruptRecordError:
        with pytest.raises(CorruptRecordError):
            check_record(view, 0, len(view))
        return
    assert check_record(view, 0, len(view)) == (fields.key, len(fields.payload))


def test_the_framed_ingest_request_carries_checked_records() -> None:
    batch = [Record(payload=bytes([i]), publish_time_ms=i, producer="p") for i in range(3)]
    body = b"".join(_produced(r) for r in batch)
    request = protocol.encode_framed_produce_request(3, [body])
    records, runs = protocol.decode_produce_request(request, max_record_bytes=1024)
    assert runs == []  # read by the scan: none sequenced
    assert [decode_record(r) for r in records] == batch
    with pytest.raises(protocol.BadRequestError, match="not 4"):
        protocol.decode_produce_request(
            protocol.encode_framed_produce_request(4, [body]), max_record_bytes=1024
        )
    with pytest.raises(protocol.BadRequestError, match="crc"):
        protocol.decode_produce_request(request[:-1] + b"\x00", max_record_bytes=1024)
    with pytest.raises(protocol.BadRequestError) as big:
        protocol.decode_produce_request(request, max_record_bytes=10)
    assert big.value.code == "payload_too_large"
    # The size-prefixed layout checks its records as well.
    garbled = protocol.encode_produce_request([b"\x01" + b"\x00" * 5])
    with pytest.raises(protocol.BadRequestError, match="record 0"):
        protocol.decode_produce_request(garbled, max_record_bytes=1024)
    frames, _ = decode_frames(body)
    assert [f.offset for f in frames] == [0, 0, 0]


def test_query_parameters_and_the_runs_answer() -> None:
    assert parse_binary_params(b"") == parse_binary_params(b"dispatch=reliable")
    params = parse_binary_params(b"producer_id=ab-1&dispatch=non_reliable&schema_version=2")
    assert (params.producer_id, params.dispatch, params.schema_version) == (
        "ab-1",
        "non_reliable",
        2,
    )
    for bad in (
        b"nope=1",
        b"dispatch=x",
        b"schema_version=0",
        b"producer_id=a%20b",
        b"dispatch=reliable&dispatch=reliable",
    ):
        with pytest.raises(BadRequestError):
            parse_binary_params(bad)
    names = TopicName.parse("/d/t").partitions(2)
    answer = runs_answer(names, [0, 0, 1, 0, 0], [5, 6, 9, 7, 9])
    assert answer == (
        b'{"runs":[{"partition":"/d/t-part-0","offset":5,"count":2},'
        b'{"partition":"/d/t-part-1","offset":9,"count":1},'
        b'{"partition":"/d/t-part-0","offset":7,"count":1},'
        b'{"partition":"/d/t-part-0","offset":9,"count":1}]}'
    )
    # A resent run never merges with a new one, even at consecutive offsets.
    answer = runs_answer(names[:1], [0, 0, 0, 0], [5, 6, 7, 8], [True, True, False, False])
    assert orjson.loads(answer) == {
        "runs": [
            {"partition": "/d/t-part-0", "offset": 5, "count": 2, "duplicate": True},
            {"partition": "/d/t-part-0", "offset": 7, "count": 2},
        ]
    }
    # The topic's partition count goes with it, for producers that route themselves.
    assert orjson.loads(runs_answer(names, [1], [3], partitions=2))["partitions"] == 2
