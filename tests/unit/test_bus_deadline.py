"""A request's deadline survives clock skew between hosts: the caller sends how long it will
wait, the responder starts its own deadline from its monotonic clock when the request arrives."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from danube.bus import Bus, Reply, Request
from danube.bus.rpc import Responder
from danube.config import BusConfig

pytestmark = pytest.mark.unit

TIMEOUT_S = 2.0


@dataclass
class FakeMsg:
    subject: str
    data: bytes
    headers: dict[str, str] | None
    reply: str = "_INBOX.1"


@dataclass
class CapturingNats:
    """The NATS client under a Bus: keeps the request it was given, answers an empty reply."""

    max_payload: int = 1 << 20
    sent: list[FakeMsg] = field(default_factory=list)

    async def request_now(
        self, subject: str, body: bytes, headers: dict[str, str] | None
    ) -> FakeMsg:
        assert headers is not None
        self.sent.append(FakeMsg(subject, body, dict(headers)))
        return FakeMsg(subject, b"", None)


async def _send_with_wall_clock_skew(skew_s: float, monkeypatch: pytest.MonkeyPatch) -> FakeMsg:
    """What a caller whose wall clock is ``skew_s`` off puts on the wire."""
    nats = CapturingNats()
    bus = Bus(nats, BusConfig(), "sender")  # type: ignore[arg-type]
    with monkeypatch.context() as patched:
        real_time, real_time_ns = time.time, time.time_ns
        patched.setattr(time, "time", lambda: real_time() + skew_s)
        patched.setattr(time, "time_ns", lambda: real_time_ns() + int(skew_s * 1e9))
        await bus.request("svc.op", b"ping", timeout_s=TIMEOUT_S)
    (msg,) = nats.sent
    return msg


async def _receive(msg: FakeMsg) -> tuple[list[float], list[Reply]]:
    """Hand ``msg`` to a responder on this host; the time its handler had, and the reply."""
    remaining: list[float] = []
    replies: list[Reply] = []

    async def handler(request: Request) -> bytes:
        remaining.append(request.remaining_s())
        return b"pong"

    async def publish(subject: str, body: bytes, headers: Any) -> None:
        replies.append(Reply(body, headers or {}))

    responder = Responder(
        subject="svc.op",
        handler=handler,
        max_concurrency=1,
        default_timeout_s=5.0,
        publish_timeout_s=1.0,
        max_payload_bytes=lambda: 1 << 20,
        publish=publish,
    )
    await responder.on_message(msg)  # type: ignore[arg-type]
    await responder.drain()
    return remaining, replies


@pytest.mark.parametrize("skew_s", [-3600.0, -1.5, 0.0, 1.5, 3600.0])
async def test_a_skewed_caller_clock_does_not_move_the_responders_deadline(
    skew_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    msg = await _send_with_wall_clock_skew(skew_s, monkeypatch)
    remaining, replies = await _receive(msg)
    assert [r.body for r in replies] == [b"pong"]  # not deadline_exceeded
    (remaining_s,) = remaining
    assert TIMEOUT_S - 0.5 < remaining_s <= TIMEOUT_S  # not cut short, not 300 s either


async def test_a_request_without_a_timeout_gets_the_default_and_a_huge_one_is_capped() -> None:
    (plain,), _ = await _receive(FakeMsg("svc.op", b"", None))
    assert 4.5 < plain <= 5.0
    (huge,), _ = await _receive(FakeMsg("svc.op", b"", {"Danube-Timeout-Ms": str(10**12)}))
    assert 299.0 < huge <= 300.0


async def test_a_zero_timeout_is_answered_deadline_exceeded_without_running() -> None:
    remaining, replies = await _receive(FakeMsg("svc.op", b"", {"Danube-Timeout-Ms": "0"}))
    assert remaining == []
    (reply,) = replies
    assert reply.headers["Danube-Error-Code"] == "deadline_exceeded"
