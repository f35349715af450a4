"""The bus's header encodings: deadlines, error replies, user headers and sizes (no server)."""

from __future__ import annotations

import math

import pytest
from nats.protocol import command

from danube.bus import BusError, RemoteError, Request, _commands
from danube.bus.protocol import (
    ERROR_CODE_HEADER,
    ERROR_MESSAGE_HEADER,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_TIMEOUT_S,
    RETRIABLE_HEADER,
    TIMEOUT_HEADER,
    check_timeout,
    check_user_headers,
    encode_timeout,
    error_headers,
    headers_size_bytes,
    monotonic_s,
    read_timeout_s,
    remote_error,
)
from danube.errors import DanubeError

pytestmark = pytest.mark.unit


class NotFound(DanubeError):
    code = "not_found"


def test_typed_error_round_trips_through_headers() -> None:
    sent = NotFound("topic /ns/t is unknown", retriable=True)
    error = remote_error(error_headers(sent), subject="danube.wal.stats.ns.t._")
    assert isinstance(error, RemoteError)
    assert (error.code, error.message, error.retriable) == (
        "not_found",
        "topic /ns/t is unknown",
        True,
    )
    assert error.subject == "danube.wal.stats.ns.t._"


@pytest.mark.parametrize(
    "message",
    [
        "line one\nline two\r\nthree",
        "100% done: naïve ünïcode ✓ 日本",
        "tabs\tand : colons, %41 and %zz",
    ],
)
def test_error_messages_are_header_safe_and_come_back_intact(message: str) -> None:
    headers = error_headers(DanubeError(message, code="x"))
    encoded = headers[ERROR_MESSAGE_HEADER]
    assert "\r" not in encoded
    assert "\n" not in encoded
    assert encoded.isascii()
    error = remote_error(headers)
    assert error is not None
    assert error.message == message


def test_long_messages_are_cut() -> None:
    error = remote_error(error_headers(DanubeError("x" * 5000)))
    assert error is not None
    assert error.message == "x" * MAX_ERROR_MESSAGE_CHARS


def test_other_exceptions_become_internal_with_their_text_only() -> None:
    headers = error_headers(KeyError("partition"))
    assert headers[ERROR_CODE_HEADER] == "internal"
    assert headers[RETRIABLE_HEADER] == "false"
    error = remote_error(headers)
    assert error is not None
    assert error.message == "'partition'"
    empty = remote_error(error_headers(RuntimeError()))
    assert empty is not None
    assert empty.message == "RuntimeError"


def test_plain_timeouts_are_retriable_timeouts() -> None:
    error = remote_error(error_headers(TimeoutError()))
    assert error is not None
    assert (error.code, error.retriable) == ("timeout", True)


def test_a_code_unfit_for_a_header_becomes_internal() -> None:
    error = remote_error(error_headers(DanubeError("m", code="bad code\n")))
    assert error is not None
    assert error.code == "internal"


def test_normal_replies_carry_no_error_and_lookup_ignores_case() -> None:
    assert remote_error({}) is None
    assert remote_error({"Other": "x"}) is None
    error = remote_error({"danube-error-code": "gone", "DANUBE-RETRIABLE": "TRUE"})
    assert error is not None
    assert (error.code, error.message, error.retriable) == ("gone", "", True)


def test_read_timeout() -> None:
    assert read_timeout_s({TIMEOUT_HEADER: "250"}, default_timeout_s=5) == 0.25
    assert read_timeout_s({"danube-timeout-ms": "0"}, default_timeout_s=5) == 0.0
    assert read_timeout_s({}, default_timeout_s=5) == 5.0
    assert read_timeout_s({TIMEOUT_HEADER: "soon"}, default_timeout_s=2) == 2.0
    assert read_timeout_s({TIMEOUT_HEADER: "-5"}, default_timeout_s=2) == 2.0
    assert read_timeout_s({TIMEOUT_HEADER: "٣"}, default_timeout_s=2) == 2.0  # not ASCII
    assert read_timeout_s({TIMEOUT_HEADER: "400000"}, default_timeout_s=5) == MAX_TIMEOUT_S
    assert read_timeout_s({TIMEOUT_HEADER: "9" * 5000}, default_timeout_s=5) == MAX_TIMEOUT_S


def test_encode_timeout_rounds_up() -> None:
    assert encode_timeout(0.0001) == "1"
    assert encode_timeout(2.5) == "2500"


def test_request_remaining_time() -> None:
    request = Request(subject="s", body=b"", headers={}, deadline_s=monotonic_s() + 10)
    assert 9.0 < request.remaining_s() <= 10.0
    assert not request.expired()
    late = Request(subject="s", body=b"", headers={}, deadline_s=monotonic_s() - 0.001)
    assert late.expired()


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, MAX_TIMEOUT_S + 1])
def test_timeouts_are_bounded(bad: float) -> None:
    with pytest.raises(BusError):
        check_timeout(bad)


def test_user_headers() -> None:
    assert check_user_headers(None) == {}
    assert check_user_headers({"Producer": "p1"}) == {"Producer": "p1"}
    for bad in [
        {"Danube-Deadline-Ms": "1"},  # reserved
        {"danube-anything": "1"},  # reserved, any case
        {"bad name": "1"},
        {"Key": "a\r\nPUB x 1"},  # would inject a protocol line
        {"Key": " padded "},
    ]:
        with pytest.raises(BusError):
            check_user_headers(bad)


def test_headers_size_matches_the_wire_format() -> None:
    assert headers_size_bytes(None) == 0
    assert headers_size_bytes({}) == 0
    wire = b"NATS/1.0\r\nA: bc\r\nDanube-Deadline-Ms: 123\r\n\r\n"
    assert headers_size_bytes({"A": "bc", "Danube-Deadline-Ms": "123"}) == len(wire)


@pytest.mark.parametrize("payload", [b"", b"x", b"\r\n" * 3, bytes(range(256)) * 4])
def test_publish_commands_are_the_protocols_bytes(payload: bytes) -> None:
    headers = bytearray(b"NATS/1.0\r\nDanube-Timeout-Ms: 250\r\n\r\n")
    total = len(headers) + len(payload)
    hpub = b"HPUB p.a _INBOX.r %d %d\r\n" % (len(headers), total) + headers + payload + b"\r\n"
    assert _commands.hpub_command("p.a", "_INBOX.r", headers, payload) == hpub
    pub = b"PUB p.a  %d\r\n" % len(payload) + payload + b"\r\n"  # no reply: nats-py's ""
    assert _commands.pub_command("p.a", "", payload) == pub
    _commands.install()
    assert command.hpub_cmd is _commands.hpub_command
    assert command.pub_cmd is _commands.pub_command
