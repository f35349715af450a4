"""A PONG that comes after its flush gave up (danube.bus._client, "A PONG for a flush that
gave up"): nats-py set the result of the cancelled future, and the InvalidStateError ended
the connection's read loop. Each PONG answers the oldest PING in order; a done one is let
be."""

from __future__ import annotations

import asyncio

import pytest

from danube.bus._client import FastClient

pytestmark = pytest.mark.unit


async def test_a_pong_for_a_cancelled_flush_is_let_be_and_the_next_ping_gets_its_own() -> None:
    client = FastClient()
    gave_up, waiting = asyncio.get_running_loop().create_future(), asyncio.Future[bool]()
    gave_up.cancel()  # its flush timed out, or its caller was cancelled
    client._pongs = [gave_up, waiting]
    await client._process_pong()  # raised InvalidStateError in nats-py's own
    assert not waiting.done()  # the PONG was the cancelled PING's, not this one's
    await client._process_pong()
    assert waiting.result() is True
    assert client._pongs == []
    assert client._pongs_received == 2
