"""Danube's gRPC client API against real services (discovery, ingest, dispatcher in this
process; real nats-server and etcd): what HealthCheck answers, access modes, status codes.
The official client's round trips are in tests/e2e/test_danube_client.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import httpx
import pytest

from danube.config import DanubeSettings
from danube.discovery import app as discovery_app
from danube.dispatcher import app as dispatcher_app
from danube.ingest import app as ingest_app
from danube.runtime.service import run_in_process
from danube.trace import TraceIdFilter
from danube.up import free_port
from danube.wire import DanubeApi_pb2 as pb
from danube.wire import SchemaRegistry_pb2 as sr
from danube.wire.client import unary_method
from danube.wire.delivery import DeliveredMessage
from danube.wire.dispatcher import protocol

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

OK, CLOSE = pb.HealthCheckResponse.OK, pb.HealthCheckResponse.CLOSE
MeshSettings = Callable[..., DanubeSettings]  # the mesh_settings fixture (conftest.py)


async def until_served(api: Api) -> None:
    """The gRPC API answers (discovery serves it before it registers)."""
    async with asyncio.timeout(30):
        while True:
            try:
                await api.lookup(pb.TopicLookupRequest(topic="/default/probe"))
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)


class Api:
    """Danube's methods by path, as its clients call them."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel

        def unary(path: str, request: Any, response: Any) -> Callable[..., Any]:
            return unary_method(channel, path, request, response)  # type: ignore[no-any-return]

        self.lookup = unary(
            "/danube.Discovery/TopicLookup", pb.TopicLookupRequest, pb.TopicLookupResponse
        )
        self.partitions = unary(
            "/danube.Discovery/TopicPartitions", pb.TopicLookupRequest, pb.TopicPartitionsResponse
        )
        self.create_producer = unary(
            "/danube.ProducerService/CreateProducer", pb.ProducerRequest, pb.ProducerResponse
        )
        self.send = unary(
            "/danube.ProducerService/SendMessage", pb.StreamMessage, pb.MessageResponse
        )
        self.subscribe = unary(
            "/danube.ConsumerService/Subscribe", pb.ConsumerRequest, pb.ConsumerResponse
        )
        self.health = unary(
            "/danube.HealthCheck/HealthCheck", pb.HealthCheckRequest, pb.HealthCheckResponse
        )
        registry = "/danube_schema.SchemaRegistry/"
        self.register = unary(
            registry + "RegisterSchema", sr.RegisterSchemaRequest, sr.RegisterSchemaResponse
        )
        self.configure = unary(
            registry + "ConfigureTopicSchema",
            sr.ConfigureTopicSchemaRequest,
            sr.ConfigureTopicSchemaResponse,
        )
        self.update_policy = unary(
            registry + "UpdateTopicValidationPolicy",
            sr.UpdateTopicValidationPolicyRequest,
            sr.UpdateTopicValidationPolicyResponse,
        )
        self.latest = unary(
            registry + "GetLatestSchema", sr.GetLatestSchemaRequest, sr.GetSchemaResponse
        )


@asynccontextmanager
async def grpc_mesh(
    mesh_settings: MeshSettings, **discovery_settings: Any
) -> AsyncIterator[tuple[Api, httpx.AsyncClient, str]]:
    """The services in this process; ``discovery_settings`` override discovery's."""
    settings = mesh_settings()
    grpc_port = free_port()
    discovery = settings.discovery.model_copy(update={"grpc_port": grpc_port, **discovery_settings})
    settings = settings.model_copy(update={"discovery": discovery})
    base_url = f"http://127.0.0.1:{settings.discovery.port}"
    async with (
        run_in_process(ingest_app.serve, settings, "ingest-1", must_stop_cleanly=True),
        run_in_process(dispatcher_app.serve, settings, "disp-1", must_stop_cleanly=True),
        run_in_process(discovery_app.serve, settings, "disc-1", must_stop_cleanly=True),
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
        grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        api = Api(channel)
        await until_served(api)
        yield api, http, f"http://127.0.0.1:{grpc_port}"


def producer_request(topic: str, name: str, mode: pb.ProducerAccessMode = pb.Shared) -> Any:
    return pb.ProducerRequest(
        request_id=1,
        producer_name=name,
        topic_name=topic,
        producer_access_mode=mode,
        dispatch_strategy=pb.Reliable,
    )


def message(topic: str, producer_id: int, payload: bytes, name: str = "p") -> Any:
    return pb.StreamMessage(
        request_id=7,
        msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic),
        payload=payload,
        producer_name=name,
    )


async def test_lookup_answers_this_instance_in_proxy_mode(mesh_settings: MeshSettings) -> None:
    async with grpc_mesh(mesh_settings) as (api, _, url):
        answer = await api.lookup(pb.TopicLookupRequest(request_id=3, topic="/default/any"))
        assert answer.response_type == pb.TopicLookupResponse.Connect
        assert (answer.connect_url, answer.broker_url, answer.proxy) == (url, url, True)
        assert answer.request_id == 3
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await api.lookup(pb.TopicLookupRequest(request_id=4, topic="no-slashes"))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad.value.details().startswith("invalid_name:")


async def test_partitions_created_as_named_and_listed(mesh_settings: MeshSettings) -> None:
    async with grpc_mesh(mesh_settings) as (api, http, _):
        for index in (2, 0, 1):  # in any order, as concurrent creations come
            await api.create_producer(
                producer_request(f"/default/grown-part-{index}", f"p-{index}")
            )
        answer = await api.partitions(pb.TopicLookupRequest(request_id=1, topic="/default/grown"))
        assert list(answer.partitions) == [f"/default/grown-part-{i}" for i in range(3)]
        described = (await http.get("/v1/topics/default/grown")).json()
        assert len(described["partitions"]) == 3
        await api.create_producer(producer_request("/default/plain", "p"))
        with pytest.raises(grpc.aio.AioRpcError) as bad:  # unpartitioned: no partition 1
            await api.create_producer(producer_request("/default/plain-part-1", "p"))
        assert bad.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert bad.value.details().startswith("not_partitioned:")


async def test_health_check_closes_when_the_topic_goes(mesh_settings: MeshSettings) -> None:
    async with grpc_mesh(mesh_settings) as (api, http, _):
        unknown = await api.health(
            pb.HealthCheckRequest(client=pb.HealthCheckRequest.Producer, id=42)
        )
        assert unknown.status == CLOSE
        producer = await api.create_producer(producer_request("/default/hc", "hc-producer"))
        consumer = await api.subscribe(
            pb.ConsumerRequest(
                request_id=1,
                topic_name="/default/hc",
                consumer_name="hc-consumer",
                subscription="hc-sub",
                subscription_type=pb.ConsumerRequest.Shared,
            )
        )
        as_producer = pb.HealthCheckRequest(
            client=pb.HealthCheckRequest.Producer, id=producer.producer_id
        )
        as_consumer = pb.HealthCheckRequest(
            client=pb.HealthCheckRequest.Consumer, id=consumer.consumer_id
        )
        assert (await api.health(as_producer)).status == OK
        assert (await api.health(as_consumer)).status == OK
        await api.send(message("/default/hc", producer.producer_id, b"one"))
        assert (await http.delete("/v1/topics/default/hc")).status_code == 204
        assert (await api.health(as_producer)).status == CLOSE
        assert (await api.health(as_consumer)).status == CLOSE


async def test_exclusive_producer_refuses_others(mesh_settings: MeshSettings) -> None:
    async with grpc_mesh(mesh_settings) as (api, _, _):
        topic = "/default/solo"
        holder = await api.create_producer(producer_request(topic, "first", pb.Exclusive))
        for mode in (pb.Exclusive, pb.Shared):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await api.create_producer(producer_request(topic, "second", mode))
            assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        await api.send(message(topic, holder.producer_id, b"mine"))
        with pytest.raises(grpc.aio.AioRpcError) as fenced:  # a producer it does not know
            await api.send(message(topic, 12345, b"not yours"))
        assert fenced.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert fenced.value.details().startswith("producer_fenced:")


async def test_bad_input_is_invalid_argument(mesh_settings: MeshSettings) -> None:
    async with grpc_mesh(mesh_settings) as (api, _, _):
        producer = await api.create_producer(producer_request("/default/limits", "p"))
        too_big = b"x" * (mesh_settings().ingest.max_message_bytes + 1)
        with pytest.raises(grpc.aio.AioRpcError) as big:
            await api.send(message("/default/limits", producer.producer_id, too_big))
        assert big.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert big.value.details().startswith("payload_too_large:")
        with pytest.raises(grpc.aio.AioRpcError) as filters:
            await api.subscribe(
                pb.ConsumerRequest(
                    topic_name="/default/limits",
                    consumer_name="c",
                    subscription="s",
                    subscription_type=pb.ConsumerRequest.Shared,
                    key_filters=["a*"],
                )
            )
        assert filters.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await api.create_producer(producer_request("/default/limits", ""))
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_producer_whose_session_lapsed_is_closed_and_fenced(
    mesh_settings: MeshSettings,
) -> None:
    """A shared producer that stops checking in loses its session; an exclusive producer
    then takes the topic: the old one's HealthCheck answers CLOSE and its sends are fenced."""
    async with grpc_mesh(mesh_settings, producer_session_ttl_s=1) as (api, _, _):
        topic = "/default/lapsed"
        old = await api.create_producer(producer_request(topic, "old"))
        check = pb.HealthCheckRequest(client=pb.HealthCheckRequest.Producer, id=old.producer_id)
        assert (await api.health(check)).status == OK
        new = await _exclusive_once_free(api, topic)
        assert (await api.health(check)).status == CLOSE
        with pytest.raises(grpc.aio.AioRpcError) as fenced:
            await api.send(message(topic, old.producer_id, b"late", name="old"))
        assert fenced.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        await api.send(message(topic, new.producer_id, b"mine", name="new"))


async def _exclusive_once_free(api: Api, topic: str) -> Any:
    """An exclusive producer, once the other producers' sessions ran out."""
    codes = []
    async with asyncio.timeout(20):  # no check-ins: etcd expires the sessions' leases
        while True:
            try:
                return await api.create_producer(producer_request(topic, "new", pb.Exclusive))
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
            assert set(codes) == {grpc.StatusCode.ALREADY_EXISTS}
            await asyncio.sleep(0.2)


async def test_schema_enforce_and_warn_over_grpc(mesh_settings: MeshSettings) -> None:
    async with grpc_mesh(mesh_settings) as (api, http, _):
        definition = b'{"type": "object", "required": ["id"]}'
        registered = await api.register(
            sr.RegisterSchemaRequest(
                subject="g-value", schema_type="json_schema", schema_definition=definition
            )
        )
        assert (registered.version, registered.is_new_version) == (1, True)
        latest = await api.latest(sr.GetLatestSchemaRequest(subject="g-value"))
        assert (latest.schema_id, latest.schema_definition) == (registered.schema_id, definition)
        topic = "/default/g-checked"
        producer = await api.create_producer(producer_request(topic, "p"))
        await api.configure(
            sr.ConfigureTopicSchemaRequest(
                topic_name=topic,
                schema_subject="g-value",
                validation_policy="Enforce",  # Danube's clients may capitalise
                enable_payload_validation=True,
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api.send(message(topic, producer.producer_id, b'{"no": "id"}'))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("schema_violation: messages[0]")
        await api.send(message(topic, producer.producer_id, b'{"id": 1}'))
        await api.update_policy(
            sr.UpdateTopicValidationPolicyRequest(
                topic_name=topic, validation_policy="warn", enable_payload_validation=True
            )
        )
        await api.send(message(topic, producer.producer_id, b"[]"))  # stored, counted
        described = (await http.get("/v1/topics/default/g-checked")).json()
        assert described["partitions"][0]["offsets"]["next_offset"] == 2


async def test_a_call_s_request_id_reaches_ingest_and_comes_back(
    mesh_settings: MeshSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.handler.addFilter(TraceIdFilter())  # what configure_logging puts on its handler
    async with grpc_mesh(mesh_settings) as (api, _, _):
        topic = "/default/traced-grpc"
        producer = await api.create_producer(producer_request(topic, "tracer"))
        await api.send(message(topic, producer.producer_id, b"first"))  # elects the owner
        with caplog.at_level(logging.DEBUG, logger="danube"):
            call = api.send(
                message(topic, producer.producer_id, b"traced"),
                metadata=(("x-request-id", "grpc-req-9"),),
            )
            await call
            await asyncio.sleep(0.2)
        assert dict(await call.trailing_metadata())["x-request-id"] == "grpc-req-9"
        ingest = [
            r.__dict__.get("trace_id")
            for r in caplog.records
            if r.name.startswith("danube.ingest") and "appended 1 records" in r.getMessage()
        ]
        assert ingest == ["grpc-req-9"]
        # No metadata: a fresh id, echoed all the same.
        plain = api.health(
            pb.HealthCheckRequest(client=pb.HealthCheckRequest.Producer, id=producer.producer_id)
        )
        await plain
        assert len(dict(await plain.trailing_metadata())["x-request-id"]) == 32


async def test_a_frame_damaged_on_the_way_is_nacked_and_comes_again_on_the_same_stream(
    mesh_settings: MeshSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last frame of the first poll reply with messages has a bit flipped after its WAL
    read: the stream goes on without it, and it comes again, read afresh, intact."""
    real = protocol.decode_poll_reply
    damaged: list[int] = []

    def damage_once(body: bytes) -> protocol.PollBatch:
        batch = real(body)
        if damaged or not batch:
            return batch
        last = batch[-1]
        frame = bytearray(last.frame)
        frame[-1] ^= 0x01
        damaged.append(last.offset)
        bad = DeliveredMessage(last.partition, last.offset, last.redelivery_count, bytes(frame))
        return protocol.PollBatch(batch.body, [*batch[:-1], bad])

    monkeypatch.setattr(protocol, "decode_poll_reply", damage_once)
    async with grpc_mesh(mesh_settings) as (api, _, _):
        topic = "/default/g-damaged"
        consumer = await api.subscribe(
            pb.ConsumerRequest(
                request_id=1,
                topic_name=topic,
                consumer_name="dc",
                subscription="d-sub",
                subscription_type=pb.ConsumerRequest.Exclusive,
            )
        )
        producer = await api.create_producer(producer_request(topic, "dp"))
        for i in range(3):
            await api.send(message(topic, producer.producer_id, f"d{i}".encode()))
        receive = api.channel.unary_stream(
            "/danube.ConsumerService/ReceiveMessages",
            request_serializer=pb.ReceiveRequest.SerializeToString,
            response_deserializer=pb.StreamMessage.FromString,
        )
        stream = receive(pb.ReceiveRequest(request_id=2, consumer_id=consumer.consumer_id))
        got: list[tuple[int, bytes]] = []
        async with asyncio.timeout(15):
            async for delivered in stream:
                got.append((delivered.msg_id.topic_offset, delivered.payload))
                if len(got) == 3:
                    break
        stream.cancel()
    assert len(damaged) == 1  # and it came again, intact, with the others
    assert sorted(got) == [(0, b"d0"), (1, b"d1"), (2, b"d2")]
