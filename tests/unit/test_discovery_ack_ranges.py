"""Discovery's ack and nack bodies as the dispatcher gets them: runs of offsets passed on as
they came (never one ref per offset), partitions named by their topic segment, a partition of
another topic refused."""

from __future__ import annotations

import pytest

from danube.discovery.doors.bodies.api import AckRequest
from danube.discovery.doors.http.consume import message_ranges
from danube.discovery.errors import BadRequestError
from danube.meta import TopicName
from danube.wire.dispatcher import protocol

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "orders")


def test_ranges_go_on_as_runs_after_the_messages_and_expand_to_the_same_refs() -> None:
    body = AckRequest.model_validate(
        {
            "messages": [{"partition": "/default/orders-part-1", "offset": 7}],
            "ranges": [
                {"partition": "/default/orders-part-0", "first": 0, "last": 89_999},
                {"partition": "/default/orders-part-1", "first": 9, "last": 12},
            ],
        }
    )
    runs = message_ranges(TOPIC, body)
    # A range of 90 000 offsets is one run, not 90 000 refs.
    assert runs == [
        ("orders-part-1", 7, 7),
        ("orders-part-0", 0, 89_999),
        ("orders-part-1", 9, 12),
    ]
    refs = protocol.expand_ranges(runs, protocol.REFS_MAX)
    assert refs[:2] == [("orders-part-1", 7), ("orders-part-0", 0)]
    assert refs[-4:] == [("orders-part-1", o) for o in range(9, 13)]
    assert len(refs) == 1 + 90_000 + 4


def test_an_unpartitioned_topic_names_itself() -> None:
    body = AckRequest.model_validate(
        {"ranges": [{"partition": "/default/orders", "first": 3, "last": 5}]}
    )
    assert message_ranges(TOPIC, body) == [("orders", 3, 5)]


@pytest.mark.parametrize(
    ("partition", "where"),
    [("/default/payments-part-0", "ranges[1]"), ("not a name", "ranges[1]")],
)
def test_a_partition_of_another_topic_is_refused_naming_where(partition: str, where: str) -> None:
    body = AckRequest.model_validate(
        {
            "ranges": [
                {"partition": "/default/orders-part-0", "first": 0, "last": 1},
                {"partition": partition, "first": 0, "last": 1},
            ]
        }
    )
    with pytest.raises(BadRequestError) as caught:
        message_ranges(TOPIC, body)
    assert caught.value.code == "invalid_partition"
    assert where in caught.value.message
