"""The idempotent producer without a server: routing equal to discovery's, sequences per
partition, a batch's keyless messages on one partition, resends of the same bytes, and the
answers of a deduplicating leader (duplicate, out_of_order_sequence, producer_fenced,
partition_required) over a fake transport that deduplicates as the ingest leader does."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import pytest

from danube.client import (
    AsyncDanubeClient,
    ConflictError,
    InvalidMessageError,
    RetryPolicy,
    _idempotent,
)
from danube.client._records import encode_frame
from danube.client._sequencing import Router, Sequences, key_of, stamp
from danube.discovery.produce.routing import RoundRobin, route
from danube.frame import Record, decode_record
from danube.frame.produce import scan_frames_for_produce
from danube.names import TopicName
from danube.routing import fnv1a_32

pytestmark = pytest.mark.unit

FAST = RetryPolicy(base_s=0.001, cap_s=0.004)
TOPIC = TopicName("default", "t")
_NAME = re.compile(r"danube-client-[0-9a-f]{12}")


def _frame(key: str | None = None, payload: bytes = b"x") -> bytes:
    return encode_frame(
        payload, key, None, producer=b"p", max_payload_bytes=1 << 20, sequenced=True
    )


def _records(body: bytes) -> list[Record]:
    frames = scan_frames_for_produce(body, max_count=10_000)  # checks every CRC
    return [decode_record(frames.record(i)) for i in range(len(frames))]


# --- the pure parts --------------------------------------------------------------------


def test_a_stamped_frame_carries_its_epoch_and_sequence_and_a_good_crc() -> None:
    frame = _frame("k", b"payload")
    head, rest = stamp(frame, 7, 2**40 + 3)
    (record,) = _records(head + bytes(rest))
    assert (record.producer_epoch, record.sequence) == (7, 2**40 + 3)
    assert (record.key, record.payload, record.producer) == ("k", b"payload", "p")
    assert key_of(frame) == b"k"
    assert key_of(_frame(None)) is None
    assert key_of(_frame("")) == b""


def test_keyed_routing_equals_discovery_routing() -> None:
    rng = random.Random(7)
    keys = ["".join(rng.choices("abcdeé中0123", k=rng.randrange(0, 12))) for _ in range(500)]
    for partitions in (1, 2, 3, 7, 16):
        router = Router(TOPIC)
        router.partitions = partitions
        mine = {
            index: partition.partition
            for partition, indexes in router.route([_frame(k) for k in keys]).items()
            for index in indexes
        }
        theirs = route(keys, partitions, RoundRobin())
        assert [mine[i] for i in range(len(keys))] == theirs


def test_keyless_messages_stick_to_one_partition_per_batch_round_robin_over_batches() -> None:
    router = Router(TOPIC, turn=0)
    router.partitions = 3
    seen = []
    for _ in range(6):
        routed = router.route([_frame() for _ in range(5)])
        assert len(routed) == 1  # the whole keyless batch: one request
        (partition,) = routed
        assert routed[partition] == list(range(5))
        seen.append(partition.partition)
    assert seen == [0, 1, 2, 0, 1, 2]
    # Keyed messages go where their key says; the keyless ones of that batch stay together.
    mixed = router.route([_frame(), _frame("a"), _frame(), _frame("b")])
    keyless = [p for p, indexes in mixed.items() if 0 in indexes]
    assert len(keyless) == 1
    assert 2 in mixed[keyless[0]]


def test_an_unpartitioned_or_unknown_topic_and_a_partition_take_every_message() -> None:
    frames = [_frame("a"), _frame()]
    assert Router(TOPIC).route(frames) == {TOPIC: [0, 1]}
    partition = TopicName("default", "t-part-2")
    assert Router(partition).route(frames) == {partition: [0, 1]}


def test_sequences_are_consecutive_per_partition_and_restart_with_an_epoch() -> None:
    sequences = Sequences()
    a, b = TOPIC.partition_name(0), TOPIC.partition_name(1)
    assert [sequences.take(a, 3), sequences.take(b, 2), sequences.take(a, 1)] == [0, 0, 3]
    assert (sequences.next(a), sequences.next(b)) == (4, 2)
    sequences.reset()
    assert sequences.take(a, 1) == 0


# --- a deduplicating leader behind a fake transport ------------------------------------


@dataclass
class _State:
    epoch: int
    next_sequence: int
    offsets: dict[int, int] = field(default_factory=dict)


@dataclass
class FakeMesh:
    """Discovery and the ingest leaders, as far as an idempotent producer sees them: each
    partition's log, deduplicated per producer name as the leader does."""

    partitions: int = 0  # the topic's, as lookup answers it (0: unpartitioned)
    epochs: dict[str, int] = field(default_factory=dict)
    logs: dict[str, list[Record]] = field(default_factory=dict)
    states: dict[tuple[str, str], _State] = field(default_factory=dict)
    bodies: list[tuple[str, bytes]] = field(default_factory=list)
    # Answers given before the leader's own, first to last (a status and code, or an
    # exception to raise; "lost": store, then lose the answer).
    faults: list[tuple[int, str] | str] = field(default_factory=list)
    gate: Callable[[str, bytes], Awaitable[None]] | None = None
    tell_partitions: bool = True  # answers carry the topic's partition count, as discovery's
    door: str | None = None  # the data door lookups name for every partition (None: none)
    # Called before a lookup is answered: an answer of its own (etcd out of reach) or None.
    lookup_fault: Callable[[], Awaitable[httpx.Response | None]] | None = None
    lookups: int = 0  # asked
    hosts: list[str] = field(default_factory=list)  # where each produce was posted

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.startswith("/v1/lookup/"):
            self.lookups += 1
            if self.lookup_fault is not None:
                answer = await self.lookup_fault()
                if answer is not None:
                    return answer
            names = TOPIC.partitions(self.partitions)
            door = {} if self.door is None else {"url": self.door}
            return httpx.Response(
                200,
                json={"name": str(TOPIC), "partitions": [{"name": str(n), **door} for n in names]},
            )
        if path.endswith("/epoch"):
            name = path.split("/")[-2]
            self.epochs[name] = self.epochs.get(name, 0) + 1
            return httpx.Response(200, json={"producer": name, "epoch": self.epochs[name]})
        match = re.fullmatch(r"/v1/topics/default/([\w-]+)/messages", path)
        assert match is not None, path
        partition = f"/default/{match[1]}"
        self.bodies.append((partition, request.content))
        self.hosts.append(request.url.host)
        if self.gate is not None:
            try:
                await self.gate(partition, request.content)
            except _NotFound:
                return _error(404, "topic_not_found")
        fault = self.faults.pop(0) if self.faults else None
        if isinstance(fault, tuple):
            return _error(*fault)
        if fault == "refused":
            raise httpx.ConnectError("refused", request=request)
        if partition == str(TOPIC) and self.partitions:
            return _error(400, "partition_required")
        answer = self._produce(partition, _records(request.content))
        if fault == "lost":
            raise httpx.ReadError("connection reset after the leader stored it", request=request)
        return answer

    def _produce(self, partition: str, records: list[Record]) -> httpx.Response:
        first = records[0]
        assert first.sequence is not None
        state = self.states.get((first.producer, partition))
        if state is None or first.producer_epoch > state.epoch:
            state = _State(first.producer_epoch, first.sequence)
            self.states[(first.producer, partition)] = state
        if first.producer_epoch < state.epoch:
            return _error(409, "producer_fenced")
        if first.sequence < state.next_sequence:  # a resend: the original offsets
            offset = state.offsets[first.sequence]
            run = {"partition": partition, "offset": offset, "count": len(records)}
            return httpx.Response(200, json={"runs": [{**run, "duplicate": True}]})
        if first.sequence != state.next_sequence:
            return _error(409, "out_of_order_sequence")
        log = self.logs.setdefault(partition, [])
        offset = len(log)
        for index, record in enumerate(records):
            assert record.sequence == first.sequence + index  # consecutive in a request
            state.offsets[record.sequence] = offset + index
        log += records
        state.next_sequence = first.sequence + len(records)
        run = {"partition": partition, "offset": offset, "count": len(records)}
        answer: dict[str, object] = {"runs": [run]}
        if self.tell_partitions:
            answer["partitions"] = self.partitions
        return httpx.Response(200, json=answer)

    def payloads(self, partition: str = str(TOPIC)) -> list[bytes]:
        return [r.payload for r in self.logs.get(partition, [])]


def _error(status: int, code: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": code}})


def _client(mesh: FakeMesh) -> AsyncDanubeClient:
    transport = httpx.MockTransport(mesh)
    return AsyncDanubeClient("http://danube.test", transport=transport, retry=FAST)


async def test_an_unnamed_producer_gets_a_unique_name_and_epoch_0() -> None:
    mesh = FakeMesh()
    async with _client(mesh) as client:
        first, second = client.producer("t"), client.producer("t")
        async with first, second:
            await first.send_and_wait("a")
            await second.send_and_wait("b")
    assert _NAME.fullmatch(first.name)
    assert _NAME.fullmatch(second.name)
    assert first.name != second.name
    assert [(r.producer, r.producer_epoch, r.sequence) for r in mesh.logs["/default/t"]] == [
        (first.name, 0, 0),
        (second.name, 0, 0),
    ]
    assert mesh.epochs == {}  # no epoch asked


async def test_a_named_producer_asks_its_epoch_once_and_a_new_instance_fences_the_old() -> None:
    mesh = FakeMesh()
    async with _client(mesh) as client:
        old = client.producer("t", name="orders-writer")
        assert (await old.send_and_wait("1")).offset == 0
        await old.send_and_wait("2")
        new = client.producer("t", name="orders-writer")
        await new.send_and_wait("3")
        with pytest.raises(ConflictError) as fenced:
            await old.send_and_wait("4")
        assert fenced.value.code == "producer_fenced"
        with pytest.raises(ConflictError) as later:  # closed for sending from now on
            await old.send("5")
        assert later.value.code == "producer_fenced"
        await new.send_and_wait("6")
    assert mesh.epochs == {"orders-writer": 2}
    assert mesh.payloads() == [b"1", b"2", b"3", b"6"]
    assert [(r.producer_epoch, r.sequence) for r in mesh.logs["/default/t"]] == [
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]


async def test_an_unnamed_producer_refused_as_fenced_fails_only_that_batch() -> None:
    # What an unnamed producer hears as producer_fenced is another's exclusive session.
    mesh = FakeMesh(faults=[(409, "producer_fenced")])
    async with _client(mesh) as client, client.producer("t") as p:
        with pytest.raises(ConflictError):
            await p.send_and_wait("refused")
        assert (await p.send_and_wait("later")).offset == 0
    assert mesh.payloads() == [b"later"]


async def test_a_partitioned_topic_gets_per_partition_consecutive_sequences() -> None:
    mesh = FakeMesh(partitions=3)
    async with _client(mesh) as client, client.producer("t", batch_max_messages=7) as p:
        futures = [await p.send(f"m{i}", key=f"k{i % 5}") for i in range(40)]
        futures += [await p.send(f"free{i}") for i in range(20)]
        results = [await f for f in futures]
    assert all(len(_records(body)) >= 1 for _, body in mesh.bodies)
    for partition, body in mesh.bodies:  # one partition per request
        assert partition != "/default/t"
        assert {r.key for r in _records(body)} <= {None} | {f"k{i}" for i in range(5)}
    stored = 0
    for index in range(3):
        log = mesh.logs.get(f"/default/t-part-{index}", [])
        assert [r.sequence for r in log] == list(range(len(log)))
        stored += len(log)
    assert stored == 60
    for i, result in enumerate(results[:40]):
        assert result.partition == f"/default/t-part-{route([f'k{i % 5}'], 3, RoundRobin())[0]}"


async def test_a_retried_batch_is_the_same_bytes_and_a_lost_answer_stores_once() -> None:
    mesh = FakeMesh(faults=["refused", (503, "no_owner"), "lost", (429, "too_many_requests")])
    async with _client(mesh) as client, client.producer("t") as p:
        results = await (await p.send_many([f"m{i}" for i in range(5)]))
    assert len({body for _, body in mesh.bodies}) == 1  # five attempts, one body
    assert len(mesh.bodies) == 5
    assert mesh.payloads() == [f"m{i}".encode() for i in range(5)]
    assert [r.offset for r in results] == list(range(5))
    assert all(r.duplicate for r in results)  # the answer came from the resend


async def test_an_overtaking_batch_is_resent_after_the_earlier_one_settles() -> None:
    # Two batches in flight to one partition; the second reaches the leader first and is
    # refused as a gap, then resent (same bytes) once the first is stored.
    held = asyncio.Event()
    release = asyncio.Event()
    order: list[int] = []

    async def gate(partition: str, body: bytes) -> None:
        sequence = _records(body)[0].sequence
        assert sequence is not None
        order.append(sequence)
        if sequence == 2 and not held.is_set():
            held.set()
            await release.wait()
        elif sequence == 4 and not release.is_set():
            # Let the gap be answered, then the earlier batch go.
            asyncio.get_running_loop().call_later(0.05, release.set)

    mesh = FakeMesh(gate=gate)
    async with (
        _client(mesh) as client,
        client.producer("t", batch_max_messages=2, max_inflight_batches=2) as p,
    ):
        assert [r.offset for r in await (await p.send_many(["a", "b"]))] == [0, 1]
        early = await p.send_many(["c", "d"])
        await held.wait()
        late = await p.send_many(["e", "f"])
        assert [r.offset for r in await early] == [2, 3]
        assert [r.offset for r in await late] == [4, 5]
    assert mesh.payloads() == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert order == [0, 2, 4, 4]  # the later batch: refused once, resent
    late_bodies = [body for _, body in mesh.bodies if _records(body)[0].sequence == 4]
    assert late_bodies[0] == late_bodies[1]


async def test_batches_behind_a_partitions_opening_batch_wait_for_its_answer() -> None:
    # The leader would take an unknown producer's batch at any sequence: the second batch
    # must not open the stream while the first is still on its way.
    release = asyncio.Event()
    order: list[int] = []

    async def gate(partition: str, body: bytes) -> None:
        sequence = _records(body)[0].sequence
        assert sequence is not None
        order.append(sequence)
        if sequence == 0:
            asyncio.get_running_loop().call_later(0.05, release.set)
            await release.wait()

    mesh = FakeMesh(gate=gate)
    async with (
        _client(mesh) as client,
        client.producer("t", batch_max_messages=2, max_inflight_batches=2) as p,
    ):
        early = await p.send_many(["a", "b"])
        late = await p.send_many(["c", "d"])
        assert [r.offset for r in await early] == [0, 1]
        assert [r.offset for r in await late] == [2, 3]
    assert order == [0, 2]


async def test_a_gap_fails_its_batch_clearly_and_the_next_batch_takes_a_new_epoch() -> None:
    mesh = FakeMesh(faults=[(409, "out_of_order_sequence")])
    async with _client(mesh) as client, client.producer("t") as p:
        with pytest.raises(ConflictError) as gap:
            await p.send_and_wait("lost")
        assert gap.value.code == "out_of_order_sequence"
        assert "new epoch" in gap.value.message
        await p.send_and_wait("next")
    assert [(r.payload, r.producer_epoch, r.sequence) for r in mesh.logs["/default/t"]] == [
        (b"next", 1, 0)
    ]


async def test_a_topic_partitioned_meanwhile_is_routed_again() -> None:
    mesh = FakeMesh()
    async with _client(mesh) as client, client.producer("t") as p:
        assert (await p.send_and_wait("before")).partition == "/default/t"
        mesh.partitions = 2  # re-created partitioned: the parent refuses sequenced batches
        results = await (await p.send_many([f"k{i}" for i in range(6)]))
    assert {r.partition for r in results} <= {"/default/t-part-0", "/default/t-part-1"}
    assert len({r.partition for r in results}) == 1  # keyless: one partition per batch
    log = mesh.logs[results[0].partition]
    assert [r.sequence for r in log] == list(range(6))


async def test_a_topic_created_again_with_fewer_partitions_is_routed_again() -> None:
    mesh = FakeMesh(partitions=3, tell_partitions=False)  # the 404 alone tells it
    missing: set[str] = set()

    async def gate(partition: str, body: bytes) -> None:
        if partition in missing:
            raise _NotFound()

    mesh.gate = gate
    async with _client(mesh) as client, client.producer("t") as p:
        await p.send_and_wait("warm")  # the producer looked: 3 partitions
        mesh.partitions = 2  # deleted and created again with 2: part-2 is no more
        missing.add("/default/t-part-2")
        sent = len(mesh.bodies)
        # Keyless batches take the partitions in turn: one of three goes to part-2.
        results = [await p.send_and_wait(f"m{i}") for i in range(3)]
    assert "/default/t-part-2" in [partition for partition, _ in mesh.bodies[sent:]]
    assert {r.partition for r in results} <= {"/default/t-part-0", "/default/t-part-1"}
    stored = mesh.payloads("/default/t-part-0") + mesh.payloads("/default/t-part-1")
    assert {b"m0", b"m1", b"m2"} <= set(stored)


class _NotFound(Exception):
    """Makes the fake answer 404 for a partition that is no more."""


async def test_idempotent_false_and_the_json_transport_send_unsequenced_records() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.headers["content-type"] == "application/json":
            return httpx.Response(200, json={"results": [{"partition": "/default/t", "offset": 0}]})
        runs = [{"partition": "/default/t", "offset": 0, "count": 1}]
        return httpx.Response(200, json={"runs": runs})

    transport = httpx.MockTransport(handler)
    async with AsyncDanubeClient("http://danube.test", transport=transport) as client:
        plain = client.producer("t", idempotent=False)
        json_ = client.producer("t", transport="json")
        await plain.send_and_wait("a", key="k")
        await json_.send_and_wait("b")
    assert not plain.idempotent
    assert not json_.idempotent
    assert (plain.name, json_.name) == ("danube-client", "danube-client")
    assert [r.url.path for r in seen] == ["/v1/topics/default/t/messages"] * 2  # no lookup
    (record,) = _records(seen[0].content)
    assert record.sequence is None
    assert record.key == "k"
    assert b"sequence" not in seen[1].content


async def test_a_topic_that_grew_is_routed_over_its_new_partitions() -> None:
    """Every answer carries the topic's partition count: once it grew, the next batches are
    routed over the new partitions, without asking the lookup again."""
    mesh = FakeMesh(partitions=2)
    async with _client(mesh) as client, client.producer(TOPIC, linger_ms=0) as producer:
        keys = [f"k{i}" for i in range(40)]
        for key in keys:
            await producer.send_and_wait(b"before", key=key)
        mesh.partitions = 4
        await producer.send_and_wait(b"tells the producer", key="k0")
        lookups_before = sum(1 for p, _ in mesh.bodies if "lookup" in p)
        for key in keys:
            stored = await producer.send_and_wait(b"after", key=key)
            expected = fnv1a_32(key.encode()) % 4
            assert stored.partition == str(TOPIC.partition_name(expected))
        assert sum(1 for p, _ in mesh.bodies if "lookup" in p) == lookups_before


async def test_messages_stamped_at_send_take_a_new_epochs_sequences_after_a_failure() -> None:
    # Once the epoch and partitions are known, a message is stamped as it is sent; the
    # messages queued behind a batch that fails carry the old epoch and must go out under
    # the new one, their sequences consecutive from 0 again, in the order they were sent.
    mesh = FakeMesh(partitions=3)
    release, arrived = asyncio.Event(), asyncio.Event()

    async def gate(partition: str, body: bytes) -> None:
        if b"held" in body:
            arrived.set()
            await release.wait()
            mesh.faults.insert(0, (409, "out_of_order_sequence"))  # this request's answer

    mesh.gate = gate
    async with (
        _client(mesh) as client,
        client.producer("t", batch_max_messages=4, linger_ms=0) as p,
    ):
        await p.send_and_wait("first", key="k0")  # the epoch and partitions are known now
        held = await p.send("held", key="k1")
        await arrived.wait()
        queued = [await p.send(f"q{i}", key=f"k{i % 5}") for i in range(10)]
        queued.append(await p.send("keyless"))
        release.set()
        with pytest.raises(ConflictError):
            await held
        stored = await asyncio.gather(*queued)
    assert all(not r.duplicate for r in stored)
    records = [r for log in mesh.logs.values() for r in log]
    assert sorted(r.payload for r in records) == sorted(
        [b"first", b"keyless"] + [f"q{i}".encode() for i in range(10)]
    )
    for partition, log in mesh.logs.items():
        renewed = [r for r in log if r.producer_epoch == 1]
        assert [r.sequence for r in renewed] == list(range(len(renewed))), partition
        sent = [r.payload for r in renewed if r.payload != b"keyless"]
        assert sent == sorted(sent, key=lambda payload: int(payload[1:])), partition
    assert {r.payload for r in records if r.producer_epoch == 0} == {b"first"}


async def test_send_many_stamps_as_it_queues_and_a_bad_message_takes_no_sequence() -> None:
    # send_many checks every message before it queues any: a bad one in the list must leave
    # the sequences as they were, or the next message would be refused as a gap.
    mesh = FakeMesh()
    async with _client(mesh) as client, client.producer("t", max_payload_bytes=64) as p:
        await p.send_and_wait("first")
        with pytest.raises(InvalidMessageError):
            await p.send_many(["ok", "x" * 65])
        assert p.pending == 0
        results = await (await p.send_many(["a", "b", "c"]))
        assert [r.offset for r in results] == [1, 2, 3]
        assert (await p.send_and_wait("last")).offset == 4
    assert [(r.payload, r.sequence) for r in mesh.logs["/default/t"]] == [
        (b"first", 0),
        (b"a", 1),
        (b"b", 2),
        (b"c", 3),
        (b"last", 4),
    ]
    assert all(r.producer_epoch == 0 for r in mesh.logs["/default/t"])


async def test_a_lookup_for_a_missing_door_runs_beside_the_sends_and_its_failure_costs_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition with no door known is looked up again in the background: while that
    lookup hangs (etcd frozen behind discovery) sends go on by the proxy path, no second
    lookup is asked, and one that fails leaves the producer as it was."""
    monkeypatch.setattr(_idempotent, "LOOKUP_AGAIN_S", 0.0)
    mesh = FakeMesh()
    held = asyncio.Event()
    release = asyncio.Event()

    async def frozen() -> httpx.Response:
        held.set()
        await release.wait()
        return _error(503, "timeout")

    async with _client(mesh) as client, client.producer(TOPIC, linger_ms=0) as producer:
        await producer.send_and_wait(b"0")  # the first lookup: the partition count
        assert mesh.lookups == 1
        mesh.lookup_fault = frozen
        async with asyncio.timeout(5):  # a bound on a hang: a send waiting for the lookup
            for number in range(1, 6):
                stored = await producer.send_and_wait(str(number).encode())
                assert stored.offset == number
            await held.wait()
        assert mesh.lookups == 2  # one lookup in flight, not one per batch
        mesh.lookup_fault = None
        release.set()
        while mesh.lookups < 3:  # the failed one is over: the next batch asks again
            await producer.send_and_wait(b"more")
    assert mesh.payloads()[:6] == [str(n).encode() for n in range(6)]
    assert set(mesh.hosts) == {"danube.test"}


async def test_a_door_that_failed_while_no_lookup_answers_leaves_the_part_to_the_proxy() -> None:
    """The leader's door answers 503 and discovery cannot look the topic up (etcd out of
    reach): the part goes the proxy path within its time, stored once."""
    mesh = FakeMesh(door="http://door.test")

    async def unreachable_etcd() -> httpx.Response:
        return _error(503, "timeout")

    client = _client(mesh)
    async with client, client.producer(TOPIC, linger_ms=0, send_timeout_s=1.0) as producer:
        assert (await producer.send_and_wait(b"a")).offset == 0
        assert mesh.hosts == ["door.test"]
        mesh.lookup_fault = unreachable_etcd
        mesh.faults = [(503, "unavailable")]
        assert (await producer.send_and_wait(b"b")).offset == 1
    assert mesh.hosts == ["door.test", "door.test", "danube.test"]
    assert mesh.payloads() == [b"a", b"b"]
