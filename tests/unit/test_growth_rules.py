"""Partition growth without servers: the one rule both doors follow
(danube.discovery.catalog.growth), the fraction of keys a growth moves, and a subscription machine
that takes a new partition into its round robin."""

from __future__ import annotations

import pytest

from danube.discovery.catalog.growth import grown, moved_fraction
from danube.discovery.errors import BadRequestError, ConflictError
from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import Ack, ConsumerAttached, Deliver, MessagesAvailable, Poll
from danube.meta import TopicName
from danube.meta.records import TopicConfig
from danube.routing import fnv1a_32

pytestmark = pytest.mark.unit

TOPIC = TopicName("default", "t")


def config(partitions: int) -> TopicConfig:
    return TopicConfig(partitions=partitions, created_ms=0)


def test_growth_rules() -> None:
    assert grown(config(4), TOPIC, 8, exact=True).partitions == 8
    same = config(4)
    assert grown(same, TOPIC, 4, exact=True) is same  # nothing to write
    assert grown(same, TOPIC, 2, exact=False) is same  # "at least" (the gRPC door)
    with pytest.raises(ConflictError) as shrink:
        grown(same, TOPIC, 2, exact=True)
    assert shrink.value.code == "partitions_cannot_shrink"
    with pytest.raises(ConflictError) as flat:
        grown(config(0), TOPIC, 2, exact=False)
    assert flat.value.code == "not_partitioned"
    with pytest.raises(BadRequestError) as many:
        grown(same, TOPIC, 1025, exact=True)
    assert many.value.code == "too_many_partitions"


def test_doubling_moves_about_half_the_keys() -> None:
    hashes = [fnv1a_32(f"user-{i}".encode()) for i in range(100_000)]
    # h mod 4 == h mod 8 exactly when bit 2 of h is clear: half the keys stay.
    assert moved_fraction(hashes, 4, 8) == pytest.approx(0.5, abs=0.01)
    # 4 -> 5: a key stays only when h mod 20 is 0..3: a fifth of the keys stay.
    assert moved_fraction(hashes, 4, 5) == pytest.approx(0.8, abs=0.01)
    assert moved_fraction([], 4, 8) == 0.0


def test_a_machine_reads_an_added_partition() -> None:
    machine = SubscriptionMachine("shared", {"t-part-0": PartitionCursor(0)})
    machine.handle(ConsumerAttached("c", "c"))
    machine.handle(MessagesAvailable("t-part-0", [(0, b"a")]))
    machine.add_partitions({"t-part-1": PartitionCursor(0), "t-part-0": PartitionCursor(9)})
    machine.handle(MessagesAvailable("t-part-1", [(0, b"b"), (1, b"c")]))
    machine.validate()
    (deliver,) = [a for a in machine.handle(Poll("c", 10, 0.0)) if isinstance(a, Deliver)]
    assert sorted(zip(deliver.partitions, deliver.offsets, strict=True)) == [
        ("t-part-0", 0),
        ("t-part-1", 0),
        ("t-part-1", 1),
    ]
    machine.handle(Ack("c", (("t-part-1", 0), ("t-part-1", 1), ("t-part-0", 0))))
    machine.validate()
    # The partition read already kept its cursor (not replaced by the one offered again).
    assert machine.cursor_states()["t-part-0"].next_offset == 1
    assert machine.cursor_states()["t-part-1"].next_offset == 2
