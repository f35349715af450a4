"""The rules an idempotent producer's produce keeps at every door (danube.admission.sequences;
a JSON body's in danube.discovery.doors.http.produce_json): sequences on every message or none,
one producer and epoch, consecutive; partition_required for a partitioned topic's own name."""

from __future__ import annotations

from typing import Any

import pytest

from danube.admission.sequences import (
    INVALID_SEQUENCE,
    PARTITION_REQUIRED,
    Sequencing,
    check_target,
    frames_sequencing,
)
from danube.discovery.doors.bodies.produce import ProduceRequest
from danube.discovery.doors.http.produce_json import json_sequencing
from danube.discovery.errors import BadRequestError
from danube.frame.produce import encode_produce_frame, scan_frames_for_produce
from danube.meta import TopicName

pytestmark = pytest.mark.unit


def _request(sequences: list[int | None], **fields: Any) -> ProduceRequest:
    messages = [{"payload": "x", "sequence": s} for s in sequences]
    return ProduceRequest.model_validate({"messages": messages, **fields})


def test_json_sequences_all_consecutive_make_one_run() -> None:
    request = _request([7, 8, 9], producer="p", producer_epoch=3)
    assert json_sequencing(request) == Sequencing("p", 3, 7, 3)
    assert json_sequencing(_request([None, None])) is None


@pytest.mark.parametrize(
    ("sequences", "fields", "where"),
    [
        ([1, None], {}, "messages[1]"),
        ([None, 1], {}, "messages[0]"),
        ([1, 3], {}, "messages[1].sequence: 3, not 2"),
        ([2, 1], {}, "messages[1].sequence: 1, not 3"),
        ([5, 5], {}, "messages[1].sequence: 5, not 6"),
        ([None], {"producer_epoch": 2}, "producer_epoch"),
    ],
)
def test_json_sequences_that_break_the_rules_are_invalid_sequence(
    sequences: list[int | None], fields: dict[str, Any], where: str
) -> None:
    with pytest.raises(BadRequestError) as refused:
        json_sequencing(_request(sequences, **fields))
    assert refused.value.code == INVALID_SEQUENCE
    assert where in refused.value.message


def _body(*records: tuple[str, int | None, int]) -> bytes:
    return b"".join(
        encode_produce_frame(
            b"payload", producer=name.encode(), publish_time_ms=1, sequence=seq, producer_epoch=ep
        )
        for name, seq, ep in records
    )


def _scanned(body: bytes) -> Any:
    return scan_frames_for_produce(body, max_count=100)


def test_binary_records_of_version_2_make_one_run() -> None:
    frames = _scanned(_body(("p", 4, 2), ("p", 5, 2), ("p", 6, 2)))
    assert frames_sequencing(frames) == Sequencing("p", 2, 4, 3)
    assert frames_sequencing(_scanned(_body(("p", None, 0), ("q", None, 0)))) is None


@pytest.mark.parametrize(
    ("records", "where"),
    [
        ((("p", 1, 0), ("p", None, 0)), "record 1"),
        ((("p", None, 0), ("p", 1, 0)), "record 1"),
        ((("p", 1, 0), ("q", 2, 0)), "record 1: producer 'q'"),
        ((("p", 1, 0), ("p", 2, 1)), "epoch 1"),
        ((("p", 1, 0), ("p", 3, 0)), "record 1: 3, not 2"),
    ],
)
def test_binary_records_that_break_the_rules_are_invalid_sequence(
    records: tuple[tuple[str, int | None, int], ...], where: str
) -> None:
    with pytest.raises(BadRequestError) as refused:
        frames_sequencing(_scanned(_body(*records)))
    assert refused.value.code == INVALID_SEQUENCE
    assert where in refused.value.message


def test_sequenced_messages_name_one_partition_of_a_partitioned_topic() -> None:
    run = Sequencing("p", 0, 0, 1)
    topic = TopicName.parse("/d/t")
    check_target(topic, 0, run)  # unpartitioned
    check_target(topic.partition_name(1), 3, run)  # one partition
    check_target(topic, 3, None)  # unsequenced: routed as ever
    with pytest.raises(BadRequestError) as refused:
        check_target(topic, 3, run)
    assert refused.value.code == PARTITION_REQUIRED
    assert "/d/t-part-0" in refused.value.message
