"""The non-reliable fan-out core: who gets each message, bounded buffers, drops by reason."""

from __future__ import annotations

import pytest

from danube.dispatcher.fanout import Buffered, Fanout
from danube.wire.dispatcher.errors import ConsumerNotFoundError, SubscriptionTakenError

pytestmark = pytest.mark.unit


def batch(first: int, count: int, partition: str = "p0", size: int = 1) -> list[Buffered]:
    return [Buffered(partition, o, b"x" * size) for o in range(first, first + count)]


def offsets(messages: list[Buffered]) -> list[int]:
    return [m.offset for m in messages]


def test_without_consumers_everything_is_dropped_as_no_consumer() -> None:
    fanout = Fanout("shared", 10)
    assert fanout.offer(batch(0, 5)) == {"slow_consumer": 0, "no_consumer": 5}


def test_a_full_buffer_drops_its_oldest_and_counts_them() -> None:
    fanout = Fanout("exclusive", 3)
    fanout.attach("c")
    assert fanout.offer(batch(0, 5)) == {"slow_consumer": 2, "no_consumer": 0}
    assert offsets(fanout.take("c", 10, 1 << 20)) == [2, 3, 4]
    assert fanout.take("c", 10, 1 << 20) == []


def test_exclusive_refuses_a_second_consumer() -> None:
    fanout = Fanout("exclusive", 3)
    fanout.attach("a")
    with pytest.raises(SubscriptionTakenError):
        fanout.attach("b")
    fanout.detach("a")
    fanout.attach("b")
    assert fanout.consumers == ["b"]


def test_failover_sends_everything_to_the_first_then_to_the_next() -> None:
    fanout = Fanout("failover", 10)
    fanout.attach("a")
    fanout.attach("b")
    fanout.offer(batch(0, 3))
    assert fanout.buffered("a") == 3
    assert fanout.buffered("b") == 0
    assert fanout.detach("a") == 3  # lost with it: at-most-once
    fanout.offer(batch(3, 2))
    assert offsets(fanout.take("b", 10, 1 << 20)) == [3, 4]


def test_shared_gives_each_message_to_the_least_loaded_consumer() -> None:
    fanout = Fanout("shared", 100)
    for name in ("a", "b", "c"):
        fanout.attach(name)
    fanout.offer(batch(0, 30))
    taken = {name: offsets(fanout.take(name, 100, 1 << 20)) for name in ("a", "b", "c")}
    assert sorted(o for got in taken.values() for o in got) == list(range(30))
    assert all(len(got) == 10 for got in taken.values())
    assert all(got == sorted(got) for got in taken.values())


def test_take_respects_count_and_bytes_but_always_gives_one() -> None:
    fanout = Fanout("exclusive", 100)
    fanout.attach("c")
    fanout.offer(batch(0, 10, size=1000))
    assert offsets(fanout.take("c", 3, 1 << 20)) == [0, 1, 2]
    assert offsets(fanout.take("c", 10, 1)) == [3]  # one always fits
    assert len(fanout.take("c", 10, 4096 + 2 * 1128)) == 2


def test_an_unknown_consumer_is_not_found() -> None:
    fanout = Fanout("shared", 10)
    with pytest.raises(ConsumerNotFoundError):
        fanout.take("nobody", 1, 1 << 20)
