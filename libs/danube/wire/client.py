"""A small client of Danube's gRPC API (what `danube bench grpc` drives): the methods by
their paths, the message classes of :mod:`danube.wire`. Danube's own clients are the full
ones; this one does no lookups (any front door serves any topic) and no reconnects."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import grpc

from danube.wire import DanubeApi_pb2 as pb

SUBSCRIPTION_TYPES = {
    "exclusive": pb.ConsumerRequest.Exclusive,
    "shared": pb.ConsumerRequest.Shared,
    "failover": pb.ConsumerRequest.Failover,
    "key_shared": pb.ConsumerRequest.KeyShared,
}


def unary_method(channel: grpc.aio.Channel, path: str, request: Any, response: Any) -> Any:
    """A callable for the unary method at ``path`` (``/package.Service/Method``) taking
    ``request`` messages and answering ``response`` ones."""
    return channel.unary_unary(
        path,
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )


def target_of(url: str) -> str:
    """``host:port`` of ``http://host:port`` (what gRPC dials)."""
    return url.removeprefix("http://").removeprefix("https://").rstrip("/")


def channel_credentials(
    ca_file: str | Path | None = None,
    cert_file: str | Path | None = None,
    key_file: str | Path | None = None,
) -> grpc.ChannelCredentials:
    """TLS credentials of a channel: trust ``ca_file`` (None: gRPC's default roots) and show
    the client certificate ``cert_file`` with ``key_file`` (mTLS) when given."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together: give both or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca_file).read_bytes() if ca_file is not None else None,
        private_key=Path(key_file).read_bytes() if key_file is not None else None,
        certificate_chain=Path(cert_file).read_bytes() if cert_file is not None else None,
    )


class WireClient:
    """Calls on one channel; ``async with WireClient(url) as client``. ``credentials``
    (see :func:`channel_credentials`) make it a TLS channel; an ``https://`` URL without
    them uses TLS with gRPC's default roots. ``token``: a bearer token sent as
    ``authorization`` metadata on every call, as Danube's clients do."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.metadata: tuple[tuple[str, str], ...] = (
            () if token is None else (("authorization", f"Bearer {token}"),)
        )
        if credentials is None and url.startswith("https://"):
            credentials = grpc.ssl_channel_credentials()
        if credentials is not None:
            self.channel = grpc.aio.secure_channel(target_of(url), credentials)
        else:
            self.channel = grpc.aio.insecure_channel(target_of(url))
        self._request_id = 0

        def unary(path: str, request: Any, response: Any) -> Any:
            return unary_method(self.channel, path, request, response)

        self._create = unary(
            "/danube.ProducerService/CreateProducer", pb.ProducerRequest, pb.ProducerResponse
        )
        self._send = unary(
            "/danube.ProducerService/SendMessage", pb.StreamMessage, pb.MessageResponse
        )
        self._lookup = unary(
            "/danube.Discovery/TopicLookup", pb.TopicLookupRequest, pb.TopicLookupResponse
        )
        self._subscribe = unary(
            "/danube.ConsumerService/Subscribe", pb.ConsumerRequest, pb.ConsumerResponse
        )
        self._ack = unary("/danube.ConsumerService/Ack", pb.AckRequest, pb.AckResponse)
        self._receive = self.channel.unary_stream(
            "/danube.ConsumerService/ReceiveMessages",
            request_serializer=pb.ReceiveRequest.SerializeToString,
            response_deserializer=pb.StreamMessage.FromString,
        )

    async def __aenter__(self) -> WireClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    def _next_id(self) -> int:
        self._request_id += 1
        return self._request_id

    async def lookup(self, topic: str) -> Any:
        """The TopicLookupResponse of ``topic``."""
        request = pb.TopicLookupRequest(request_id=self._next_id(), topic=topic)
        return await self._lookup(request, timeout=self.timeout_s, metadata=self.metadata)

    async def create_producer(
        self, topic: str, name: str, *, exclusive: bool = False, reliable: bool = True
    ) -> int:
        request = pb.ProducerRequest(
            request_id=self._next_id(),
            producer_name=name,
            topic_name=topic,
            producer_access_mode=pb.Exclusive if exclusive else pb.Shared,
            dispatch_strategy=pb.Reliable if reliable else pb.NonReliable,
        )
        reply = await self._create(request, timeout=self.timeout_s, metadata=self.metadata)
        return int(reply.producer_id)

    async def send(
        self,
        topic: str,
        producer_id: int,
        producer_name: str,
        payload: bytes,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
        publish_time_ms: int = 0,
    ) -> None:
        """One message; returns once the front door answered (stored as the topic says)."""
        message = pb.StreamMessage(
            request_id=self._next_id(),
            msg_id=pb.MsgID(producer_id=producer_id, topic_name=topic),
            payload=payload,
            publish_time=publish_time_ms,
            producer_name=producer_name,
            attributes=dict(attributes or {}),
        )
        if key is not None:
            message.routing_key = key
        await self._send(message, timeout=self.timeout_s, metadata=self.metadata)

    async def subscribe(self, topic: str, consumer: str, subscription: str, sub_type: str) -> int:
        request = pb.ConsumerRequest(
            request_id=self._next_id(),
            topic_name=topic,
            consumer_name=consumer,
            subscription=subscription,
            subscription_type=SUBSCRIPTION_TYPES[sub_type],
        )
        reply = await self._subscribe(request, timeout=self.timeout_s, metadata=self.metadata)
        return int(reply.consumer_id)

    async def receive(self, consumer_id: int) -> AsyncIterator[Any]:
        """The consumer's messages as the server streams them, until cancelled."""
        call = self._receive(
            pb.ReceiveRequest(request_id=self._next_id(), consumer_id=consumer_id),
            metadata=self.metadata,
        )
        try:
            async for message in call:
                yield message
        finally:
            call.cancel()

    async def ack(self, message: Any) -> None:
        request = pb.AckRequest(
            request_id=self._next_id(),
            msg_id=message.msg_id,
            subscription_name=message.subscription_name,
        )
        await self._ack(request, timeout=self.timeout_s, metadata=self.metadata)
