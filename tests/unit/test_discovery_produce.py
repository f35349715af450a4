"""Discovery's produce path: a full instance answers 429 at once, and a bad batch is
refused by admission before the topic's policies are looked up or the topic created."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from danube.admission import Admission, Admitted, ProduceLimits
from danube.admission.exclusive import ExclusiveView
from danube.bus import Bus, TopicName
from danube.discovery.catalog.catalog import Catalog
from danube.discovery.doors.bodies.produce import ProduceRequest
from danube.discovery.doors.http.produce_json import JsonMessages
from danube.discovery.errors import BadRequestError, OverLimitError, http_status
from danube.discovery.produce.producer import Limits, Producer
from danube.meta.records import Policies, TopicConfig
from danube.security.gate import SecurityGate

pytestmark = pytest.mark.unit

T = TopicName("default", "t")
LIMITS = Limits(max_batch_records=10, timeout_s=1.0, auto_create=True)


class BlockingCatalog:
    """A catalog whose lookups wait until released, counting the calls they got."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.lookups = 0

    async def cached_topic(self, topic: TopicName) -> TopicConfig | None:
        self.lookups += 1
        self.entered.set()
        await self.release.wait()
        raise BadRequestError("stop here")  # the test only cares about admission

    async def ensure_topic(
        self, topic: TopicName, *, auto_create: bool, dispatch: str = "reliable"
    ) -> tuple[TopicConfig, bool]:
        await self.cached_topic(topic)
        raise AssertionError("unreachable")

    async def effective_policies(self, topic: TopicName) -> tuple[None, Policies]:
        await self.cached_topic(topic)
        return None, Policies()


def _producer(catalog: Any, max_inflight: int) -> Producer:
    return Producer(cast(Bus, object()), cast(Catalog, catalog), LIMITS, max_inflight=max_inflight)


def _request(payload: str = "x", encoding: str = "utf8") -> ProduceRequest:
    return ProduceRequest.model_validate({"messages": [{"payload": payload, "encoding": encoding}]})


ADMITTED = Admitted(T, Policies(), stamp=None, sequencing=None)


async def test_a_full_instance_answers_429_at_once() -> None:
    catalog = BlockingCatalog()
    producer = _producer(catalog, max_inflight=1)
    first = asyncio.create_task(producer.store(ADMITTED, [b"r"], [None], dispatch="reliable"))
    await asyncio.wait_for(catalog.entered.wait(), 5)
    with pytest.raises(OverLimitError) as caught:
        await producer.store(ADMITTED, [b"r"], [None], dispatch="reliable")
    assert (caught.value.code, http_status(caught.value), caught.value.retriable) == (
        "too_many_requests",
        429,
        True,
    )
    catalog.release.set()
    with pytest.raises(BadRequestError):
        await first
    assert catalog.lookups == 1
    # The slot is free again: the next request gets through to the lookup.
    with pytest.raises(BadRequestError):
        await producer.store(ADMITTED, [b"r"], [None], dispatch="reliable")
    assert catalog.lookups == 2


async def test_a_bad_batch_never_reaches_the_catalog() -> None:
    catalog = BlockingCatalog()
    admission = Admission(
        ProduceLimits(messages_max=10, payload_bytes_max=1024),
        security=SecurityGate.disabled(),
        policies=catalog,
        fence=ExclusiveView(),
    )
    with pytest.raises(BadRequestError) as caught:
        await admission.produce("anonymous", T, JsonMessages(_request("***", "base64")))
    assert caught.value.code == "bad_encoding"
    assert catalog.lookups == 0
