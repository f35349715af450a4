"""The async client: one connection pool to a Danube server, and the producers, consumers
and admin made from it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from danube.client._http import HttpCore
from danube.client.errors import ClosedError, InvalidArgumentError
from danube.client.messages import topic_name
from danube.client.producer import AsyncProducer, ProducerOptions
from danube.client.retry import RetryPolicy
from danube.client.tls import ClientTls
from danube.names import TopicName

if TYPE_CHECKING:
    import httpx

    # Imported where first used: a producer alone (`danube produce`) never loads the admin,
    # consumer, schema and security halves of the SDK (and pydantic with them).
    from danube.client.admin import AsyncAdmin
    from danube.client.consumer import AsyncConsumer, ConsumerOptions
    from danube.client.multi import AsyncMultiConsumer
    from danube.client.schemas import AsyncSchemas
    from danube.client.security import AsyncSecurity

DEFAULT_URL = "http://127.0.0.1:8080"
# Longer than the server's own produce deadline (discovery.produce_timeout_s, 10 s), so a
# slow produce ends with the server's answer (503 no_owner) rather than a client timeout.
DEFAULT_TIMEOUT_S = 15.0


def _options(kind: type[Any], base: Any, overrides: dict[str, Any]) -> Any:
    try:
        return dataclasses.replace(base or kind(), **overrides)
    except TypeError as exc:  # an unknown option
        raise InvalidArgumentError(f"{kind.__name__}: {exc}") from exc


class AsyncDanubeClient:
    """Talks to any discovery instance at ``url``. ``timeout_s`` bounds each request;
    ``retry`` is the backoff of every retry loop; ``transport`` replaces the network (tests);
    ``tls`` is the CA and client certificate of an ``https://`` server (None: the system's
    CAs, no client certificate).
    ``token`` is a bearer token sent with every request (a server with security enabled).

    Use as ``async with AsyncDanubeClient(url) as client:``; :meth:`close` closes every
    producer and consumer made from it, then the connections."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        tls: ClientTls | None = None,
        token: str | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise InvalidArgumentError(f"url must start with http:// or https://, got {url!r}")
        self.url = url
        self._http = HttpCore(
            url,
            timeout_s=timeout_s,
            retry=retry or RetryPolicy(),
            transport=transport,
            ssl_context=tls.ssl_context() if tls is not None else None,
            token=token,
        )
        self._producers: list[AsyncProducer] = []
        self._consumers: list[AsyncConsumer] = []
        self._closed = False

    @cached_property
    def admin(self) -> AsyncAdmin:
        """The admin routes (namespaces, topics, subscriptions, the cluster)."""
        from danube.client.admin import AsyncAdmin

        return AsyncAdmin(self._http)

    @cached_property
    def security(self) -> AsyncSecurity:
        """The security routes (roles, bindings, API keys, tokens)."""
        from danube.client.security import AsyncSecurity

        return AsyncSecurity(self._http)

    @cached_property
    def schemas(self) -> AsyncSchemas:
        """The schema registry's routes."""
        from danube.client.schemas import AsyncSchemas

        return AsyncSchemas(self._http)

    async def __aenter__(self) -> AsyncDanubeClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def producer(
        self, topic: str | TopicName, options: ProducerOptions | None = None, **overrides: Any
    ) -> AsyncProducer:
        """A producer to ``topic`` (``/ns/topic``, or ``topic`` in ``default``); options as
        a :class:`ProducerOptions` and/or its fields as keywords (``linger_ms=10``)."""
        self._check_open()
        producer = AsyncProducer(
            self._http, topic_name(topic), _options(ProducerOptions, options, overrides)
        )
        self._producers.append(producer)
        return producer

    def consumer(
        self,
        topic: str | TopicName,
        subscription: str,
        options: ConsumerOptions | None = None,
        **overrides: Any,
    ) -> AsyncConsumer:
        """A consumer of ``subscription`` on ``topic``, not attached yet (``async with`` or
        :meth:`AsyncConsumer.start` attaches); options as for :meth:`producer`."""
        from danube.client.consumer import AsyncConsumer, ConsumerOptions

        self._check_open()
        consumer = AsyncConsumer(
            self._http,
            topic_name(topic),
            subscription,
            _options(ConsumerOptions, options, overrides),
        )
        self._consumers.append(consumer)
        return consumer

    def multi_consumer(
        self,
        namespace: str,
        subscription: str,
        options: ConsumerOptions | None = None,
        *,
        topics: Sequence[str] | None = None,
        topics_pattern: str | None = None,
        refresh_interval_s: float | None = None,
        **overrides: Any,
    ) -> AsyncMultiConsumer:
        """One subscription over many topics of ``namespace``: those ``topics`` names or
        ``topics_pattern`` (a regex matching a whole topic name) matches, now and as they
        appear (:mod:`danube.client.multi`); not started yet (``async with`` starts it)."""
        from danube.client.consumer import AsyncConsumer, ConsumerOptions
        from danube.client.multi import REFRESH_INTERVAL_S, AsyncMultiConsumer

        self._check_open()
        chosen = _options(ConsumerOptions, options, overrides)

        def make(topic: TopicName, opts: ConsumerOptions) -> AsyncConsumer:
            consumer = AsyncConsumer(self._http, topic, subscription, opts)
            self._consumers.append(consumer)
            return consumer

        return AsyncMultiConsumer(
            make,
            self.admin,
            namespace,
            subscription,
            chosen,
            topics=topics,
            topics_pattern=topics_pattern,
            refresh_interval_s=REFRESH_INTERVAL_S
            if refresh_interval_s is None
            else refresh_interval_s,
        )

    async def subscribe(
        self,
        topic: str | TopicName,
        subscription: str,
        options: ConsumerOptions | None = None,
        **overrides: Any,
    ) -> AsyncConsumer:
        """:meth:`consumer`, attached."""
        consumer = self.consumer(topic, subscription, options, **overrides)
        await consumer.start()
        return consumer

    async def close(self) -> None:
        """Close every producer (flushing it) and consumer made here, then the connections."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.gather(
                *(p.close() for p in self._producers),
                *(c.close() for c in self._consumers),
                return_exceptions=True,
            )
        finally:
            await self._http.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the client is closed")
