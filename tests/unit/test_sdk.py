"""Client SDK logic without a server: the batch accumulator, backoff, error mapping, message
encoding, and the producer's retries and batches over a fake transport (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from danube.client import (
    AsyncDanubeClient,
    BadRequestError,
    ConsumerOptions,
    InvalidArgumentError,
    InvalidMessageError,
    Message,
    NotFoundError,
    OverLimitError,
    ProducerOptions,
    RetryPolicy,
    ServerError,
    Timestamp,
    TransportError,
    UnavailableError,
)
from danube.client._sources import _close_error
from danube.client.batch import Accumulator
from danube.client.errors import error_from_body, status_of_close
from danube.client.messages import decode_message, encode_message, position_json, topic_name
from danube.client.retry import retrying
from danube.frame import decode_record
from danube.frame.produce import scan_frames_for_produce

pytestmark = pytest.mark.unit

FAST = RetryPolicy(base_s=0.001, cap_s=0.004)


# --- accumulator -----------------------------------------------------------------------


def test_a_batch_waits_for_its_linger_unless_full_or_flushed() -> None:
    acc: Accumulator[int] = Accumulator(max_messages=3, max_bytes=1000, linger_s=0.1)
    assert not acc.due(0.0)
    assert acc.wait_s(0.0) is None
    acc.add(1, 10, now_s=1.0)
    assert not acc.due(1.05)
    assert acc.wait_s(1.05) == pytest.approx(0.05)
    assert acc.due(1.05, flush=True)
    assert acc.due(1.1)
    acc.add(2, 10, now_s=1.01)
    acc.add(3, 10, now_s=1.02)
    assert acc.full()
    assert acc.due(1.02)


def test_take_respects_both_limits_in_order_and_never_returns_nothing() -> None:
    acc: Accumulator[str] = Accumulator(max_messages=3, max_bytes=100, linger_s=0)
    for i, size in enumerate([40, 40, 40, 10, 500, 5]):
        acc.add(f"m{i}", size, now_s=0)
    assert acc.take() == ["m0", "m1"]  # a third would pass 100 bytes
    assert acc.take() == ["m2", "m3"]  # the next one alone is over the limit
    assert acc.take() == ["m4"]  # too large, but a batch takes at least one
    assert acc.size_bytes == 5
    assert acc.take() == ["m5"]
    assert acc.take() == []
    assert len(acc) == 0


# --- backoff and errors ----------------------------------------------------------------


def test_backoff_doubles_to_its_cap_with_half_kept() -> None:
    policy = RetryPolicy(base_s=0.1, cap_s=1.0)
    assert [policy.delay_s(a, rng=lambda: 0.0) for a in range(6)] == [
        0.05,
        0.1,
        0.2,
        0.4,
        0.5,
        0.5,
    ]
    assert policy.delay_s(10, rng=lambda: 1.0) == 1.0
    with pytest.raises(ValueError, match="base_s"):
        RetryPolicy(base_s=2, cap_s=1)


@pytest.mark.parametrize(
    ("status", "kind", "retriable"),
    [
        (400, BadRequestError, False),
        (404, NotFoundError, False),
        (429, OverLimitError, True),
        (503, UnavailableError, True),
        (500, ServerError, False),
        (418, ServerError, False),
    ],
)
def test_error_bodies_map_to_typed_errors(status: int, kind: type, retriable: bool) -> None:
    error = error_from_body(status, {"error": {"code": "some_code", "message": "m"}}, fallback="")
    assert type(error) is kind
    assert (error.status, error.code, error.message, error.retriable) == (
        status,
        "some_code",
        "m",
        retriable,
    )
    assert str(error) == "some_code: m"


def test_a_body_that_is_not_an_error_body_still_gives_a_status_and_text() -> None:
    error = error_from_body(502, None, fallback="<html>bad gateway")
    assert (error.code, error.message) == ("http_502", "<html>bad gateway")


@pytest.mark.parametrize(
    ("close", "frame", "code", "status", "retriable"),
    [
        (4404, {"code": "consumer_not_found", "message": "m"}, "consumer_not_found", 404, False),
        (4503, {"code": "timeout", "message": "m"}, "timeout", 503, True),
        (4429, {"code": "too_many_streams", "message": "m"}, "too_many_streams", 429, True),
        (1008, {"code": "invalid_frame", "message": "m"}, "invalid_frame", 400, False),
        (1011, {"code": "internal", "message": "m"}, "internal", 500, False),
        (1006, None, "transport", None, True),
        (1012, None, "transport", None, True),
    ],
)
def test_stream_closes_map_to_the_errors_of_their_status(
    close: int, frame: dict[str, str] | None, code: str, status: int | None, retriable: bool
) -> None:
    error = _close_error(close, "", frame)
    assert (error.code, error.status, error.retriable) == (code, status, retriable)
    if status is not None:
        assert status_of_close(close) == status


# --- messages --------------------------------------------------------------------------


def test_text_payloads_travel_as_text_and_binary_ones_as_base64() -> None:
    text = orjson.loads(encode_message(Message("héllo", key="k"), max_payload_bytes=100))
    assert text == {"payload": "héllo", "key": "k"}
    utf8_bytes = orjson.loads(encode_message(Message(b"plain"), max_payload_bytes=100))
    assert utf8_bytes == {"payload": "plain"}
    raw = bytes([0xFF, 0x00, 0x80])
    binary = orjson.loads(
        encode_message(Message(raw, attributes={"a": "1"}), max_payload_bytes=100)
    )
    assert binary == {
        "payload": base64.b64encode(raw).decode(),
        "encoding": "base64",
        "attributes": {"a": "1"},
    }


@pytest.mark.parametrize(
    "message",
    [
        Message(b"x" * 101),
        Message("x", key="k" * 4097),
        Message("x", attributes={f"a{i}": "v" for i in range(65)}),
        Message("x", attributes={"a": "v" * 4097}),
        Message("\ud800"),  # a lone surrogate has no UTF-8 form
    ],
)
def test_messages_over_a_record_limit_are_refused_before_sending(message: Message) -> None:
    with pytest.raises(InvalidMessageError):
        encode_message(message, max_payload_bytes=100)


def test_delivered_messages_decode_both_encodings() -> None:
    base = {
        "partition": "/default/t",
        "offset": 3,
        "key": None,
        "attributes": {},
        "publish_time_ms": 5,
        "producer": "p",
        "redelivery_count": 0,
    }
    text = decode_message({**base, "payload": "hi", "encoding": "utf8"})
    binary = decode_message({**base, "payload": "/wA=", "encoding": "base64"})
    assert (text.payload, text.text, binary.payload) == (b"hi", "hi", b"\xff\x00")
    assert (text.ref.partition, text.ref.offset) == ("/default/t", 3)
    with pytest.raises(InvalidMessageError):
        text.ack()  # not received through a consumer


def test_topic_names_default_their_namespace_and_are_checked() -> None:
    assert str(topic_name("orders")) == "/default/orders"
    assert str(topic_name("/team/orders")) == "/team/orders"
    for bad in ("/a/b/c", "/default/a.b", ""):
        with pytest.raises(InvalidArgumentError) as refused:
            topic_name(bad)
        assert refused.value.code == "invalid_name"


def test_options_are_checked() -> None:
    with pytest.raises(InvalidArgumentError):
        ProducerOptions(batch_max_messages=0)
    with pytest.raises(InvalidArgumentError):
        ConsumerOptions(start=-1)
    with pytest.raises(InvalidArgumentError):
        ConsumerOptions(receiver_queue_size=10_001)
    assert ConsumerOptions(start=7).attach_body()["start"] == {"offset": 7}


# --- producer over a fake transport ----------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


def _payloads(request: httpx.Request) -> list[str]:
    """The payloads of a produce, binary (the SDK's default) or JSON."""
    if request.headers["content-type"] == "application/vnd.danube.records":
        frames = scan_frames_for_produce(request.content, max_count=10_000)
        return [decode_record(frames.record(i)).payload.decode() for i in range(len(frames))]
    assert request.headers["content-type"] == "application/json"
    return [m["payload"] for m in json.loads(request.content)["messages"]]


def _stored(request: httpx.Request, start: int, count: int) -> httpx.Response:
    """The answer of the body's kind: runs for a binary body, results for JSON."""
    if request.headers["content-type"] == "application/vnd.danube.records":
        runs = [{"partition": "/default/t", "offset": start, "count": count}]
        return httpx.Response(200, json={"runs": runs})
    results = [{"partition": "/default/t", "offset": start + i} for i in range(count)]
    return httpx.Response(200, json={"results": results})


def _produce_ok(request: httpx.Request) -> httpx.Response:
    return _stored(request, int(request.headers.get("x-start", "0")), len(_payloads(request)))


def _client(handler: Handler) -> AsyncDanubeClient:
    def topic_unknown_yet(request: httpx.Request) -> httpx.Response:
        # An idempotent producer (the default) first asks the topic's partitions; "not
        # there yet" sends to the topic itself, as these tests expect.
        if request.url.path.startswith("/v1/lookup/"):
            return httpx.Response(404, json={"error": {"code": "topic_not_found", "message": ""}})
        return handler(request)

    return AsyncDanubeClient(
        "http://danube.test", transport=httpx.MockTransport(topic_unknown_yet), retry=FAST
    )


async def test_503_and_transport_errors_are_retried_then_the_batch_succeeds() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) == 1:
            raise httpx.ConnectError("refused", request=request)
        if len(calls) == 2:
            return httpx.Response(503, json={"error": {"code": "no_owner", "message": "m"}})
        if len(calls) == 3:
            return httpx.Response(429, json={"error": {"code": "too_many_requests", "message": ""}})
        return _produce_ok(request)

    async with _client(handler) as client:
        result = await client.producer("t").send_and_wait("x")
    assert (result.partition, result.offset) == ("/default/t", 0)
    assert calls == ["/v1/topics/default/t/messages"] * 4


async def test_a_4xx_fails_every_message_of_its_batch_without_retrying() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(
            404, json={"error": {"code": "namespace_not_found", "message": "no ns"}}
        )

    async with _client(handler) as client, client.producer("/nowhere/t", linger_ms=50) as p:
        futures = [await p.send(f"m{i}") for i in range(3)]
        await p.flush()
    assert calls == 1
    for future in futures:
        error = future.exception()
        assert isinstance(error, NotFoundError)
        assert (error.status, error.code) == (404, "namespace_not_found")


async def test_retries_end_with_the_last_error_at_the_send_timeout() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"code": "no_owner", "message": "none"}})

    async with _client(handler) as client:
        producer = client.producer("t", send_timeout_s=0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UnavailableError) as failed:
            await producer.send_and_wait("x")
        assert failed.value.code == "no_owner"
        assert loop.time() - started < 2.0


@pytest.mark.parametrize("transport", [None, "binary", "json"])
async def test_batches_follow_send_order_and_limits(transport: str | None) -> None:
    bodies: list[list[str]] = []
    kinds: set[str] = set()
    offset = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal offset
        kinds.add(request.headers["content-type"])
        payloads = _payloads(request)
        bodies.append(payloads)
        answer = _stored(request, offset, len(payloads))
        offset += len(payloads)
        return answer

    chosen: dict[str, Any] = {} if transport is None else {"transport": transport}
    async with (
        _client(handler) as client,
        client.producer("t", None, batch_max_messages=4, **chosen) as p,
    ):
        futures = [await p.send(f"m{i}") for i in range(10)]
    binary = transport != "json"  # binary unless asked otherwise
    assert kinds == {"application/vnd.danube.records" if binary else "application/json"}
    assert [f.result().offset for f in futures] == list(range(10))
    assert [len(b) for b in bodies] == [4, 4, 2]
    assert [m for b in bodies for m in b] == [f"m{i}" for i in range(10)]


async def test_a_dead_server_is_a_transport_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with _client(handler) as client:
        with pytest.raises(TransportError):
            await client.producer("t", send_timeout_s=0.05).send_and_wait("x")


def test_positions_take_the_api_forms() -> None:
    assert position_json("earliest") == "earliest"
    assert position_json(42) == {"offset": 42}
    assert position_json(Timestamp(1700)) == {"timestamp_ms": 1700}
    for bad in ("soon", -1, True, 2**64):
        with pytest.raises(InvalidArgumentError):
            position_json(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        Timestamp(-5)
    assert ConsumerOptions(start=Timestamp(9)).attach_body()["start"] == {"timestamp_ms": 9}


async def test_retrying_reports_the_servers_answer_when_the_deadline_cuts_the_last_try() -> None:
    """A 503 with a reason, then an attempt the deadline cut short: the error raised is the
    server's reason, not "no answer within ..."."""
    attempts: list[float] = []

    async def call(timeout_s: float) -> None:
        attempts.append(timeout_s)
        if len(attempts) == 1:
            raise UnavailableError("no in-sync replica", code="partition_unavailable", status=503)
        await asyncio.sleep(timeout_s)
        raise TransportError(f"no answer within {timeout_s} s")

    with pytest.raises(UnavailableError) as raised:
        await retrying(call, timeout_s=0.2, policy=FAST, what="produce")
    assert raised.value.code == "partition_unavailable"
    assert len(attempts) >= 2

    async def never(timeout_s: float) -> None:  # no answer ever: the timeout it is
        await asyncio.sleep(timeout_s)
        raise TransportError(f"no answer within {timeout_s} s")

    with pytest.raises(TransportError):
        await retrying(never, timeout_s=0.1, policy=FAST, what="produce")
