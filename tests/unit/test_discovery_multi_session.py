"""A many-topics stream's session (danube.discovery.doors.http.multi_session) over fakes of the
socket, the dispatcher and the catalog: a topic attached while the stream ends is detached
once its attach answers (an exclusive subscription would stay taken otherwise), and an ack
frame naming two topics reaches each topic's consumer with its own refs only."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from danube.discovery.doors.http.multi_session import MultiStream, MultiStreamParams
from danube.discovery.doors.http.multi_topic import TopicSelector
from danube.discovery.doors.http.state import Services
from danube.meta import TopicName
from danube.wire.dispatcher import protocol

pytestmark = pytest.mark.unit

STEP_TIMEOUT_S = 5.0


class FakeSocket:
    def __init__(self) -> None:
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[str | bytes] = []

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send_text(self, text: str) -> None:
        self.sent.append(text)

    async def send_bytes(self, body: bytes) -> None:
        self.sent.append(body)

    def client_sends(self, **frame: Any) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(frame)})

    def client_leaves(self) -> None:
        self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})


class FakeDispatcher:
    def __init__(self) -> None:
        self.held: dict[str, asyncio.Event] = {}  # topic -> released: its attach waits
        self.attaching: dict[str, asyncio.Event] = {}  # topic -> its attach has started
        self.detached: list[str] = []
        self.detaching = asyncio.Event()  # set at the first detach
        self.acked: list[tuple[str, list[tuple[str, int, int]]]] = []

    async def attach(self, topic: TopicName, sub: str, name: str, **_: Any) -> str:
        self.attaching.setdefault(topic.topic, asyncio.Event()).set()
        held = self.held.get(topic.topic)
        if held is not None:
            await held.wait()
        return f"c-{topic.topic}"

    async def detach(self, topic: TopicName, sub: str, consumer_id: str) -> None:
        self.detached.append(consumer_id)
        self.detaching.set()

    async def touch(self, topic: TopicName, sub: str, consumer_id: str) -> None:
        pass

    async def poll(self, topic: TopicName, sub: str, consumer_id: str, **_: Any) -> Any:
        await asyncio.sleep(0.01)
        return protocol.PollBatch(b"", [])

    async def ack_ranges(
        self, topic: TopicName, sub: str, consumer_id: str, ranges: list[tuple[str, int, int]]
    ) -> list[tuple[str, int]]:
        self.acked.append((consumer_id, list(ranges)))
        return []


class FakeCatalog:
    def __init__(self, *names: str) -> None:
        self.names = list(names)

    async def list_topics(self, namespace: str) -> list[str]:
        return list(self.names)


def _session(dispatcher: FakeDispatcher, catalog: FakeCatalog, socket: FakeSocket) -> MultiStream:
    unused = cast(Any, None)
    services = Services(
        node_id="disc-1",
        bus=unused,
        store=unused,
        catalog=cast(Any, catalog),
        producer=unused,
        controller=unused,
        dispatcher=cast(Any, dispatcher),
        producers=unused,
        schemas=unused,
        admission=unused,
        stream_topics_refresh_s=0.05,
    )
    selector = TopicSelector("ns", pattern=".*", topics_max=10)
    params = MultiStreamParams(name="c", start="earliest")
    return MultiStream(cast(Any, socket), services, selector, "s", params, "anonymous", False)


async def test_an_attach_in_flight_when_the_stream_ends_is_detached_once_answered() -> None:
    dispatcher, catalog, socket = FakeDispatcher(), FakeCatalog("a"), FakeSocket()
    session = _session(dispatcher, catalog, socket)
    await session.open()
    assert sorted(session.joined) == ["a"]
    run = asyncio.create_task(session.run())
    dispatcher.held["slow"] = released = asyncio.Event()
    dispatcher.attaching["slow"] = started = asyncio.Event()
    catalog.names.append("slow")  # the next refresh joins it; its attach waits
    async with asyncio.timeout(STEP_TIMEOUT_S):
        await started.wait()
    socket.client_leaves()
    async with asyncio.timeout(STEP_TIMEOUT_S):
        assert await run is None
    detaching = asyncio.create_task(session.detach_all())
    async with asyncio.timeout(STEP_TIMEOUT_S):
        await dispatcher.detaching.wait()
    assert dispatcher.detached == ["c-a"]  # "slow" has not answered yet
    released.set()  # the dispatcher attached it after all
    async with asyncio.timeout(STEP_TIMEOUT_S):
        await detaching
    assert sorted(dispatcher.detached) == ["c-a", "c-slow"]


async def test_an_ack_frame_of_two_topics_reaches_each_topics_consumer() -> None:
    dispatcher, catalog, socket = FakeDispatcher(), FakeCatalog("a", "b"), FakeSocket()
    session = _session(dispatcher, catalog, socket)
    await session.open()
    run = asyncio.create_task(session.run())
    socket.client_sends(
        type="ack",
        messages=[
            {"partition": "/ns/b-part-1", "offset": 7},
            {"partition": "/ns/a", "offset": 3},
            {"partition": "/ns/b-part-0", "offset": 2},
        ],
        ranges=[{"partition": "/ns/a", "first": 5, "last": 9}],
    )
    socket.client_sends(type="ack", messages=[{"partition": "/ns/zzz", "offset": 1}])
    socket.client_leaves()
    async with asyncio.timeout(STEP_TIMEOUT_S):
        assert await run is None
    await session.detach_all()
    assert dispatcher.acked == [
        ("c-b", [("b-part-1", 7, 7), ("b-part-0", 2, 2)]),
        ("c-a", [("a", 3, 3), ("a", 5, 9)]),
    ]
    errors = [json.loads(f)["error"]["code"] for f in socket.sent if isinstance(f, str)]
    assert errors == ["invalid_partition"]  # zzz is not a topic of the stream
