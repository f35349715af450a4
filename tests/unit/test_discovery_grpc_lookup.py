"""Discovery's gRPC lookup while etcd does not answer (danube.discovery.doors.grpc.handlers
.leader_door): the last leader read, else this instance (None), never an error."""

from __future__ import annotations

from typing import Any

import pytest

from danube.admission.last_good import LastGood
from danube.discovery.doors.grpc.handlers import leader_door
from danube.meta import MetaTimeoutError, MetaUnavailableError, TopicName

PART = TopicName("default", "t-part-0")
OTHER = TopicName("default", "t-part-1")


class Doors:
    """LeaderDoors.door_of over an etcd that answers, or raises ``down``."""

    def __init__(self) -> None:
        self.owners = {PART: "http://10.0.0.1:7002"}
        self.down: Exception | None = None

    async def door_of(self, partition: TopicName) -> str | None:
        if self.down is not None:
            raise self.down
        return self.owners.get(partition)


async def test_the_last_leader_read_is_named_while_etcd_does_not_answer() -> None:
    doors, lookups = Doors(), LastGood[tuple[str, ...], Any]()
    assert await leader_door(lookups, PART, doors.door_of) == "http://10.0.0.1:7002"
    doors.owners[PART] = "http://10.0.0.2:7002"
    doors.down = MetaTimeoutError("etcd get: no answer within the deadline")
    assert await leader_door(lookups, PART, doors.door_of) == "http://10.0.0.1:7002"
    doors.down = MetaUnavailableError("refused")
    assert await leader_door(lookups, PART, doors.door_of) == "http://10.0.0.1:7002"
    doors.down = None  # etcd back: the leader it names now
    assert await leader_door(lookups, PART, doors.door_of) == "http://10.0.0.2:7002"


async def test_a_partition_never_read_is_served_here_while_etcd_does_not_answer() -> None:
    doors, lookups = Doors(), LastGood[tuple[str, ...], Any]()
    doors.down = MetaTimeoutError("etcd get: no answer within the deadline")
    assert await leader_door(lookups, OTHER, doors.door_of) is None


async def test_a_topic_gone_is_not_hidden() -> None:
    doors, lookups = Doors(), LastGood[tuple[str, ...], Any]()
    await leader_door(lookups, PART, doors.door_of)
    doors.down = LookupError("gone")
    with pytest.raises(LookupError):
        await leader_door(lookups, PART, doors.door_of)
