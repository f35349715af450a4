"""Discovery request models and batch checks: unknown fields, encodings, limits, names, and
the one mapping from errors to HTTP statuses."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from danube.bus import BusTimeoutError, NoRespondersError, RemoteError
from danube.discovery.doors.bodies.api import TopicSpec
from danube.discovery.doors.bodies.produce import ProduceRequest
from danube.discovery.doors.http.produce_json import encode_batch
from danube.discovery.errors import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    OverLimitError,
    TooLargeError,
    UnavailableError,
    error_body,
    http_status,
)
from danube.errors import ErrorKind
from danube.frame import InvalidRecordError, decode_record
from danube.meta import MetaUnavailableError
from danube.names import InvalidNameError, user_topic

INVALID, TOO_LARGE = ErrorKind.INVALID, ErrorKind.TOO_LARGE
pytestmark = pytest.mark.unit


def _batch(*messages: dict[str, object], **top: object) -> ProduceRequest:
    return ProduceRequest.model_validate({"messages": list(messages), **top})


def _encode(
    request: ProduceRequest, *, max_payload: int = 1024, max_messages: int = 10
) -> list[bytes]:
    return encode_batch(
        request, max_payload_bytes=max_payload, max_messages=max_messages, publish_time_ms=42
    )


def test_encode_batch_utf8_and_base64_round_trip() -> None:
    request = _batch(
        {"payload": "héllo", "key": "k1", "attributes": {"a": "1"}},
        {"payload": base64.b64encode(b"\x00\xff bin").decode(), "encoding": "base64"},
        producer="p1",
    )
    first, second = (decode_record(r) for r in _encode(request))
    assert (first.payload, first.key, dict(first.attributes)) == (
        "héllo".encode(),
        "k1",
        {"a": "1"},
    )
    assert (first.producer, first.publish_time_ms) == ("p1", 42)
    assert (second.payload, second.key, dict(second.attributes)) == (b"\x00\xff bin", None, {})


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"payload": "x"}], "extra": 1},  # unknown top-level field
        {"messages": [{"payload": "x", "colour": "red"}]},  # unknown message field
        {"messages": []},  # empty batch
        {"messages": [{"payload": "x", "encoding": "hex"}]},  # unknown encoding
        {"messages": [{"payload": 5}]},  # wrong type
        {"messages": [{"payload": "x", "attributes": {"a": 1}}]},  # attribute not a string
        {"messages": "x"},
        {},
    ],
)
def test_produce_request_refuses_bad_shapes(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ProduceRequest.model_validate(body)


def test_topic_spec_bounds_and_unknown_fields() -> None:
    assert TopicSpec.model_validate({"partitions": 3}).partitions == 3
    for bad in ({"partitions": -1}, {"partitions": 1025}, {"partition": 2}, {"dispatch": "x"}):
        with pytest.raises(ValidationError):
            TopicSpec.model_validate(bad)


def test_bad_base64_is_bad_encoding() -> None:
    with pytest.raises(BadRequestError) as caught:
        _encode(
            _batch({"payload": "a", "encoding": "utf8"}, {"payload": "!!", "encoding": "base64"})
        )
    assert caught.value.code == "bad_encoding"
    assert "messages[1]" in caught.value.message


def test_lone_surrogate_is_bad_encoding() -> None:
    with pytest.raises(BadRequestError) as caught:
        _encode(_batch({"payload": "\ud800"}))
    assert caught.value.code == "bad_encoding"


def test_oversize_payload_and_too_many_messages_are_413() -> None:
    with pytest.raises(TooLargeError) as caught:
        _encode(_batch({"payload": "x" * 11}), max_payload=10)
    assert (caught.value.code, caught.value.limit, http_status(caught.value)) == (
        "payload_too_large",
        10,
        413,
    )
    with pytest.raises(TooLargeError) as caught:
        _encode(_batch({"payload": "x"}, {"payload": "y"}, {"payload": "z"}), max_messages=2)
    assert caught.value.code == "too_many_messages"


def test_record_limits_checked_by_model_then_by_encoder() -> None:
    with pytest.raises(ValidationError, match="at most 64 items"):
        _batch({"payload": "x", "attributes": {f"k{i}": "v" for i in range(65)}})
    # 3000 characters pass the model's length check; 6000 UTF-8 bytes do not fit a record.
    with pytest.raises(InvalidRecordError) as caught:
        _encode(_batch({"payload": "x", "key": "é" * 3000}))
    assert (caught.value.code, http_status(caught.value)) == ("invalid_record", 400)


def test_user_topic_refuses_partition_names_and_bad_segments() -> None:
    assert str(user_topic("default", "orders")) == "/default/orders"
    assert str(user_topic("default", "orders-part-03")) == "/default/orders-part-03"
    for ns, topic in (
        ("default", "orders-part-3"),
        ("de fault", "t"),
        ("default", "a.b"),
        ("", "t"),
    ):
        with pytest.raises(InvalidNameError):
            user_topic(ns, topic)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (BadRequestError("x"), 400),
        (InvalidNameError(kind="topic", value="a.b", reason="r"), 400),
        (InvalidRecordError("key", "too long"), 400),
        (NotFoundError("x", code="topic_not_found"), 404),
        (ConflictError("x", code="topic_exists"), 409),
        (TooLargeError("x", code="body_too_large", limit=1), 413),
        (RemoteError(code="payload_too_large", message="x", retriable=False, kind=TOO_LARGE), 413),
        (RemoteError(code="offset_out_of_range", message="x", retriable=False, kind=INVALID), 400),
        (RemoteError(code="position_unavailable", message="x", retriable=True), 503),  # no kind,
        (OverLimitError("x"), 429),
        (UnavailableError("x", code="no_owner"), 503),
        (NoRespondersError("s"), 503),
        (BusTimeoutError("s", 1.0), 503),
        (MetaUnavailableError("x"), 503),
        (TimeoutError("x"), 503),
        (RuntimeError("boom"), 500),
    ],
)
def test_http_status_of_each_error(error: Exception, status: int) -> None:
    assert http_status(error) == status


def test_error_body_shape_hides_internals() -> None:
    assert error_body(ConflictError("exists", code="topic_exists")) == {
        "error": {"code": "topic_exists", "message": "exists"}
    }
    assert error_body(RuntimeError("secret")) == {
        "error": {"code": "internal", "message": "internal error"}
    }
