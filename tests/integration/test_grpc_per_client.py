"""The per-client cap on gRPC calls, on a real grpc.aio server and on discovery's (with
ingest and dispatcher in this process): calls past the limit from one client address are
refused with RESOURCE_EXHAUSTED (too_many_calls_from_client) before their handler and
counted; unary and streaming calls both count, and a finished call gives its place back.
(A gRPC client cannot pick its source address, so a second address is the unit tests'.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from danube.config import DanubeSettings
from danube.runtime.grpc_limits import REFUSED_CODE, limit_calls_per_client
from danube.wire import DanubeApi_pb2 as pb
from tests.integration.test_grpc_api import Api, grpc_mesh, message, producer_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
MeshSettings = Callable[..., DanubeSettings]  # the mesh_settings fixture (conftest.py)

LIMIT = 2
LISTENER = "grpc-test"


class _Held:
    """Handlers that wait until released: calls in progress for as long as a test wants."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = 0  # handler bodies that ran: a refused call never gets here

    async def wait(self, request: bytes, context: Any) -> bytes:
        self.entered += 1
        await self.release.wait()
        return b"done:" + request

    async def stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        self.entered += 1
        yield b"first"
        await self.release.wait()
        yield b"last"


def _identity(data: bytes) -> bytes:
    return data


@pytest.fixture
async def served() -> AsyncIterator[tuple[grpc.aio.Channel, _Held]]:
    held = _Held()
    handlers = [
        grpc.method_handlers_generic_handler(
            "test.Hold",
            {
                "Wait": grpc.unary_unary_rpc_method_handler(
                    held.wait, request_deserializer=_identity, response_serializer=_identity
                ),
                "Stream": grpc.unary_stream_rpc_method_handler(
                    held.stream, request_deserializer=_identity, response_serializer=_identity
                ),
            },
        )
    ]
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(limit_calls_per_client(handlers, LIMIT, listener=LISTENER))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, held
    finally:
        await channel.close()
        await server.stop(0)


def _refused() -> float:
    labels = {"listener": LISTENER, "reason": "per_client"}
    return REGISTRY.get_sample_value("danube_listener_calls_refused_total", labels) or 0.0


async def _until_entered(held: _Held, count: int) -> None:
    async with asyncio.timeout(5):
        while held.entered < count:  # noqa: ASYNC110 - the handlers count, nothing to await
            await asyncio.sleep(0.01)


async def test_calls_past_the_per_client_limit_are_refused_and_counted(
    served: tuple[grpc.aio.Channel, _Held],
) -> None:
    channel, held = served
    wait = channel.unary_unary("/test.Hold/Wait")
    stream = channel.unary_stream("/test.Hold/Stream")
    before = _refused()

    unary = asyncio.ensure_future(wait(b"1"))
    streaming = stream(b"2")
    assert await streaming.read() == b"first"  # the stream is in progress: it counts
    await _until_entered(held, LIMIT)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await wait(b"3", timeout=5)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details().startswith(f"{REFUSED_CODE}: 127.0.0.1 has {LIMIT} calls")
    with pytest.raises(grpc.aio.AioRpcError) as refused_stream:
        await stream(b"4").read()
    assert refused_stream.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert held.entered == LIMIT  # neither refused call reached its handler
    assert _refused() - before == 2

    held.release.set()
    assert await unary == b"done:1"
    assert await streaming.read() == b"last"
    assert await wait(b"5", timeout=5) == b"done:5"  # their places are given back
    assert _refused() - before == 2


def _receiver(api: Api) -> Any:
    return api.channel.unary_stream(
        "/danube.ConsumerService/ReceiveMessages",
        request_serializer=pb.ReceiveRequest.SerializeToString,
        response_deserializer=pb.StreamMessage.FromString,
    )


async def test_discovery_refuses_a_clients_calls_past_its_limit(
    mesh_settings: MeshSettings,
) -> None:
    """Discovery's own gRPC server with a per-client limit of 2: two open consumer streams
    take it, so a third stream and even a lookup are refused; a closed stream gives its
    place back."""
    before = REGISTRY.get_sample_value(
        "danube_listener_calls_refused_total", {"listener": "grpc", "reason": "per_client"}
    )
    async with grpc_mesh(mesh_settings, grpc_max_concurrent_rpcs_per_client=LIMIT) as (
        api,
        _,
        _,
    ):
        topic = "/default/per-client"
        consumers = [
            await api.subscribe(
                pb.ConsumerRequest(
                    request_id=1,
                    topic_name=topic,
                    consumer_name=f"c{i}",
                    subscription=f"sub-{i}",  # one each: every stream gets the message
                    subscription_type=pb.ConsumerRequest.Exclusive,
                )
            )
            for i in range(3)
        ]
        producer = await api.create_producer(producer_request(topic, "p"))
        await api.send(message(topic, producer.producer_id, b"m"))
        receive = _receiver(api)
        streams = [
            receive(pb.ReceiveRequest(request_id=2, consumer_id=c.consumer_id))
            for c in consumers[:LIMIT]
        ]
        async with asyncio.timeout(15):
            for stream in streams:  # both in progress: each has delivered
                assert (await stream.read()).payload == b"m"

        third = receive(pb.ReceiveRequest(request_id=2, consumer_id=consumers[2].consumer_id))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await third.read()
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.details().startswith(f"{REFUSED_CODE}: 127.0.0.1 has 2 calls")
        with pytest.raises(grpc.aio.AioRpcError) as refused_lookup:
            await api.lookup(pb.TopicLookupRequest(request_id=3, topic=topic))
        assert refused_lookup.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        streams[0].cancel()
        async with asyncio.timeout(15):
            while True:  # the server hears the cancel, then the place is free
                third = receive(
                    pb.ReceiveRequest(request_id=2, consumer_id=consumers[2].consumer_id)
                )
                try:
                    assert (await third.read()).payload == b"m"
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    await asyncio.sleep(0.05)
        for stream in (streams[1], third):
            stream.cancel()
    after = REGISTRY.get_sample_value(
        "danube_listener_calls_refused_total", {"listener": "grpc", "reason": "per_client"}
    )
    assert (after or 0.0) - (before or 0.0) >= 2
