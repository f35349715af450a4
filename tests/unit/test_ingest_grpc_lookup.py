"""An ingest gRPC door's decisions with small fakes (danube.ingest.grpc_door.IngestApi):
where TopicLookup sends a client, and the not_leader refusal of a produce it does not lead."""

from __future__ import annotations

from typing import Any

import pytest

from danube.errors import NotLeaderError, UnavailableError
from danube.grpc_door.api import Lookup
from danube.ingest.grpc_door import IngestApi
from danube.meta import TopicName
from danube.meta.records import Policies, TopicConfig
from danube.wire import DanubeApi_pb2 as pb

SELF = "http://10.0.0.1:7002"
OTHER = "http://10.0.0.2:7002"
DISCOVERY = "http://10.0.0.9:6650"
LED = TopicName("default", "t-part-0")
NOT_LED = TopicName("default", "t-part-1")


class Leaders:
    def leader_of(self, name: TopicName) -> Any:
        return object() if name == LED else None


class Doors:
    def __init__(self, owners: dict[TopicName, str], discovery: str | None) -> None:
        self.owners = owners
        self.discovery = discovery

    async def door_of(self, partition: TopicName) -> str | None:
        return self.owners.get(partition)

    async def discovery_door(self) -> str | None:
        return self.discovery


class Policy:
    def __init__(self, configs: dict[TopicName, TopicConfig]) -> None:
        self.configs = configs

    async def effective_policies(self, topic: TopicName) -> tuple[TopicConfig | None, Policies]:
        return self.configs.get(topic), Policies()


class Admission:
    def __init__(self, configs: dict[TopicName, TopicConfig]) -> None:
        self.policies = Policy(configs)


def api(owners: dict[TopicName, str], discovery: str | None = DISCOVERY) -> IngestApi:
    configs = {
        TopicName("default", "t"): TopicConfig(partitions=2, created_ms=1),
        TopicName("default", "plain"): TopicConfig(partitions=0, created_ms=1),
    }
    return IngestApi(
        Leaders(),
        Doors(owners, discovery),  # type: ignore[arg-type]
        admission=Admission(configs),
        security=None,
        sessions=None,
        clients=None,
        dispatcher=None,
        streams=None,
        advertised_url=SELF,
    )


async def test_a_partition_led_here_is_redirected_here() -> None:
    assert await api({}).lookup(LED) == Lookup.redirect(SELF)


async def test_a_partition_led_elsewhere_is_redirected_to_its_leader() -> None:
    answer = await api({NOT_LED: OTHER}).lookup(NOT_LED)
    assert answer == Lookup(pb.TopicLookupResponse.Redirect, OTHER, False)


@pytest.mark.parametrize(
    "topic",
    [
        TopicName("default", "t"),  # a partitioned topic's own name: its partitions are asked
        TopicName("default", "new"),  # not a topic yet: discovery creates it
        NOT_LED,  # no leader now
    ],
)
async def test_otherwise_discovery_is_named_in_proxy_mode(topic: TopicName) -> None:
    answer = await api({TopicName("default", "t"): OTHER}).lookup(topic)
    assert answer == Lookup(pb.TopicLookupResponse.Connect, DISCOVERY, True)


async def test_no_leader_and_no_discovery_known_is_unavailable() -> None:
    with pytest.raises(UnavailableError) as refused:
        await api({}, discovery=None).lookup(NOT_LED)
    assert refused.value.code == "no_owner"


async def test_a_produce_not_led_here_is_refused_not_leader_naming_the_leaders_door() -> None:
    await api({}).serving(LED)  # led: taken
    with pytest.raises(NotLeaderError) as refused:
        await api({NOT_LED: OTHER}).serving(NOT_LED)
    assert refused.value.leader_url == OTHER
    assert OTHER in refused.value.message
