"""The consumer stream protocol without I/O: client frames and their error codes, credits,
stream slots, the frames sent, and the close code of each error."""

from __future__ import annotations

import json

import pytest

from danube.bus import RemoteError
from danube.discovery.errors import (
    BadRequestError,
    OverLimitError,
    StreamProtocolError,
    ws_close_code,
)
from danube.errors import ErrorKind
from danube.runtime.held import Slots
from danube.wire.consume.models import MessageOut
from danube.wire.consume.stream_protocol import (
    CREDITS_MAX,
    AckFrame,
    Credits,
    FlowFrame,
    NackFrame,
    error_frame,
    message_frame,
    parse_frame,
)

pytestmark = pytest.mark.unit


def test_frames_parse_to_their_type() -> None:
    assert parse_frame('{"type": "flow", "credits": 7}') == FlowFrame(type="flow", credits=7)
    ack = parse_frame('{"type": "ack", "messages": [{"partition": "/d/t", "offset": 3}]}')
    assert isinstance(ack, AckFrame)
    assert [(m.partition, m.offset) for m in ack.messages] == [("/d/t", 3)]
    nack = parse_frame(
        '{"type": "nack", "messages": [{"partition": "/d/t", "offset": 4}], "delay_ms": 250}'
    )
    assert isinstance(nack, NackFrame)
    assert nack.delay_ms == 250


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "invalid_json"),
        ("{", "invalid_json"),
        ("null", "invalid_frame"),
        ('"flow"', "invalid_frame"),
        ('{"type": "FLOW", "credits": 1}', "invalid_frame"),
        ('{"type": "flow", "credits": 10001}', "invalid_frame"),
        ('{"type": "flow", "credits": -1}', "invalid_frame"),
        ('{"type": "flow", "credits": 1, "extra": true}', "unknown_field"),
        ('{"type": "ack"}', "invalid_frame"),
        ('{"type": "nack", "messages": [{"partition": "", "offset": 0}]}', "invalid_frame"),
        (
            '{"type": "nack", "messages": [{"partition": "/d/t", "offset": 0}], "delay_ms": -1}',
            "invalid_frame",
        ),
    ],
)
def test_bad_frames_are_protocol_errors_with_a_code(text: str, code: str) -> None:
    with pytest.raises(StreamProtocolError) as refused:
        parse_frame(text)
    assert refused.value.code == code
    assert refused.value.message


def test_credits_are_granted_spent_and_bounded() -> None:
    credits = Credits(limit=10)
    credits.grant(4)
    credits.grant(6)
    assert credits.available == 10
    with pytest.raises(StreamProtocolError) as refused:
        credits.grant(1)
    assert refused.value.code == "too_many_credits"
    assert credits.available == 10  # a refused grant adds nothing
    credits.spend(3)
    assert credits.available == 7
    credits.spend(0)
    with pytest.raises(ValueError, match="spending 8 credits of 7"):
        credits.spend(8)
    assert credits.available == 7
    assert Credits().limit == CREDITS_MAX


def test_stream_slots_stop_at_the_limit_and_come_back() -> None:
    slots = Slots(2)
    assert slots.try_take()
    assert slots.try_take()
    assert not slots.try_take()
    slots.give_back()
    assert slots.try_take()
    slots.give_back()
    slots.give_back()
    with pytest.raises(ValueError, match="no slot was taken"):
        slots.give_back()


def test_message_and_error_frames() -> None:
    message = MessageOut(
        partition="/d/t-part-1",
        offset=9,
        payload="aGk=",
        encoding="base64",
        key="k",
        attributes={"a": "1"},
        publish_time_ms=1700,
        producer="p",
        redelivery_count=2,
    )
    assert json.loads(message_frame(message)) == {
        "type": "message",
        "partition": "/d/t-part-1",
        "offset": 9,
        "payload": "aGk=",
        "encoding": "base64",
        "key": "k",
        "attributes": {"a": "1"},
        "publish_time_ms": 1700,
        "producer": "p",
        "redelivery_count": 2,
        "schema_id": None,
        "schema_version": None,
    }
    refused = StreamProtocolError("no", code="too_many_credits")
    assert json.loads(error_frame(refused)) == {
        "type": "error",
        "error": {"code": "too_many_credits", "message": "no"},
    }
    assert json.loads(error_frame(KeyError("secret"))) == {
        "type": "error",
        "error": {"code": "internal", "message": "internal error"},
    }


@pytest.mark.parametrize(
    ("error", "close_code"),
    [
        (StreamProtocolError("bad frame"), 1008),
        (BadRequestError("bad id", code="invalid_consumer_id"), 4400),
        (
            RemoteError(
                code="consumer_not_found",
                message="gone",
                retriable=False,
                kind=ErrorKind.NOT_FOUND,
            ),
            4404,
        ),
        (OverLimitError("full", code="too_many_streams"), 4429),
        (TimeoutError(), 4503),
        (RemoteError(code="not_connected", message="down", retriable=True), 4503),
        (RuntimeError("bug"), 1011),
    ],
)
def test_each_error_closes_with_its_code(error: BaseException, close_code: int) -> None:
    assert ws_close_code(error) == close_code
