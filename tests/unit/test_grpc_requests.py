"""The gRPC door's request checks (danube.grpc_door.requests): decoding that never
raises, client topic names, enum values, and settings held to the HTTP API's models."""

from __future__ import annotations

import pytest

from danube.discovery.errors import BadRequestError
from danube.grpc_door import requests
from danube.names import PARTITIONS_MAX, InvalidNameError, TopicName, client_topic
from danube.wire import DanubeApi_pb2 as pb

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff" * 16, "Wire format was corrupt"),
        (b"\x08\x80", "Wire format was corrupt"),
        (b"\x12\x02\xc3\x28", "String field had bad UTF-8"),
    ],
)
def test_bytes_that_do_not_decode_are_malformed_not_raised(data: bytes, reason: str) -> None:
    decoded = requests.decoder(pb.ProducerRequest)(data)
    assert decoded == requests.Malformed("danube.ProducerRequest", reason)
    error = decoded.error()
    assert (error.code, error.message) == (
        "invalid_request",
        f"the request is not a valid danube.ProducerRequest message: {reason}",
    )


def test_a_message_decodes_as_itself() -> None:
    sent = pb.ProducerRequest(topic_name="/default/t", producer_name="p")
    assert requests.decoder(pb.ProducerRequest)(sent.SerializeToString()) == sent


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/default/t", TopicName("default", "t")),
        ("/default/t-part-0", TopicName("default", "t-part-0")),
        (
            f"/default/t-part-{PARTITIONS_MAX - 1}",
            TopicName("default", f"t-part-{PARTITIONS_MAX - 1}"),
        ),
        ("/default/t-part-03", TopicName("default", "t-part-03")),  # a plain topic
    ],
)
def test_client_topics(value: str, expected: TopicName) -> None:
    assert client_topic(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "",
        "t",
        "/bad.ns/t",
        "/default/t/x",
        f"/default/t-part-{PARTITIONS_MAX}",
        "/default/x-part-1000000000",
        "/default/x-part--1",
        "/default/x-part--1-part-0",  # a partition of a topic no user may name
        "/default/" + "t" * 300,
    ],
)
def test_bad_client_topics_are_invalid_names(value: str) -> None:
    with pytest.raises(InvalidNameError):
        client_topic(value)


def test_unknown_enum_values_are_refused() -> None:
    with pytest.raises(BadRequestError) as refused:
        requests.dispatch(pb.ProducerRequest(dispatch_strategy=pb.DispatchStrategy.ValueType(7)))
    assert refused.value.code == "invalid_request"
    assert refused.value.message.startswith("dispatch_strategy: unknown value 7")
    with pytest.raises(BadRequestError):
        requests.client_type(
            pb.HealthCheckRequest(client=pb.HealthCheckRequest.ClientType.ValueType(2))
        )
    assert (
        requests.client_type(pb.HealthCheckRequest(client=pb.HealthCheckRequest.Consumer))
        == "consumer"
    )


def test_settings_are_held_to_the_http_models_and_named_by_their_grpc_field() -> None:
    opened = requests.producer_open(
        pb.ProducerRequest(producer_name="p", producer_access_mode=pb.Exclusive)
    )
    assert (opened.name, opened.access_mode) == ("p", "exclusive")
    with pytest.raises(BadRequestError) as refused:
        requests.producer_open(pb.ProducerRequest(producer_name="p" * 257))
    assert refused.value.code == "invalid_request"
    assert refused.value.message.startswith("producer_name: ")
    request = pb.ConsumerRequest(consumer_name="c" * 129, subscription="s")
    with pytest.raises(BadRequestError) as refused:
        requests.attach(request)
    assert refused.value.message == "consumer_name: String should have at most 128 characters"
    shared = pb.ConsumerRequest(
        consumer_name="c", subscription_type=pb.ConsumerRequest.Shared, key_filters=["a*"]
    )
    with pytest.raises(BadRequestError) as refused:
        requests.attach(shared)
    assert refused.value.code == "invalid_request"
    assert "key_shared" in refused.value.message or "key-shared" in refused.value.message
    keyed = pb.ConsumerRequest(
        consumer_name="c", subscription_type=pb.ConsumerRequest.KeyShared, key_filters=["a*"]
    )
    assert requests.attach(keyed).key_filters == ["a*"]
