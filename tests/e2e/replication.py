"""Helpers of the replication fault tests: ingest nodes as real processes, a producer and a
reader that record a history (tests/history.py), and the partition's keys in etcd."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from danube.bus import Bus, NoRespondersError, TopicName
from danube.errors import DanubeError
from danube.frame import Frame, Record, decode_record, encode_record
from danube.meta import MetaStore
from danube.meta import keys as meta_keys
from danube.meta.records import Owner, PartitionState
from danube.up import ProcessSpec, ServerProcess
from danube.wire.ingest import protocol
from danube.wire.ingest.client import FetchReply, IngestClient
from tests.history import History

READ_LEADER_WAIT_S = 10.0  # a read waits this long for a new leader to serve
# Short leases and lag bounds keep each failover round to a few seconds.
NODE_ENV = {
    "DANUBE_INGEST__LEASE_TTL_S": "2",
    "DANUBE_INGEST__REPLICA_LAG_MAX_S": "2",
    "DANUBE_INGEST__REPLICA_FETCH_WAIT_S": "0.2",
}


@dataclass
class Cluster:
    """Ingest nodes by id, each a real process with its own data directory."""

    specs: dict[str, ProcessSpec]
    log_dir: Path
    processes: dict[str, ServerProcess] = field(default_factory=dict)
    starts: int = 0

    def start(self, node: str) -> ServerProcess:
        self.starts += 1
        process = ServerProcess(self.specs[node], self.log_dir / f"{node}-{self.starts}.log")
        process.start()
        self.processes[node] = process
        return process

    def pid(self, node: str) -> int:
        pid = self.processes[node].pid
        assert pid is not None
        return pid

    def kill(self, node: str) -> None:
        self.processes[node].kill()

    def freeze(self, node: str) -> None:
        os.kill(self.pid(node), signal.SIGSTOP)

    def thaw(self, node: str) -> None:
        os.kill(self.pid(node), signal.SIGCONT)

    def stop_all(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(OSError):
                os.kill(process.pid or 0, signal.SIGCONT)
            process.stop()


async def leader(store: MetaStore, partition: TopicName, *, timeout_s: float = 30.0) -> Owner:
    """The partition's live leader, waiting for one."""
    async with asyncio.timeout(timeout_s):
        while True:
            owner = await store.get_model(meta_keys.partition_owner_key(partition), Owner)
            if owner is not None:
                return owner
            await asyncio.sleep(0.05)


async def new_leader(
    store: MetaStore, partition: TopicName, after_epoch: int, *, timeout_s: float = 30.0
) -> Owner:
    """The first leader of an epoch after ``after_epoch``."""
    async with asyncio.timeout(timeout_s):
        while True:
            owner = await store.get_model(meta_keys.partition_owner_key(partition), Owner)
            if owner is not None and owner.epoch > after_epoch:
                return owner
            await asyncio.sleep(0.05)


async def state(store: MetaStore, partition: TopicName) -> PartitionState | None:
    return await store.get_model(meta_keys.partition_state_key(partition), PartitionState)


async def wait_isr(
    store: MetaStore, partition: TopicName, size: int, *, timeout_s: float = 30.0
) -> PartitionState:
    """Wait until the ISR holds ``size`` replicas."""
    async with asyncio.timeout(timeout_s):
        while True:
            found = await state(store, partition)
            if found is not None and len(found.isr) == size:
                return found
            await asyncio.sleep(0.05)


class Producer:
    """Sends numbered single-message batches, records every attempt and answer."""

    def __init__(self, client: IngestClient, partition: TopicName, history: History) -> None:
        self.client = client
        self.partition = partition
        self.history = history
        self.number = 0
        self.acked = 0
        self.stalls: list[float] = []  # longest gap between two acks, per measured window

    async def send(self, count: int, *, timeout_s: float = 20.0) -> None:
        """Send ``count`` messages one by one, retrying each until acknowledged."""
        for _ in range(count):
            await self.send_one(timeout_s=timeout_s)

    async def send_one(self, *, timeout_s: float = 20.0) -> int:
        msg_id = f"m{self.number}"
        self.number += 1
        record = encode_record(Record(payload=msg_id.encode(), publish_time_ms=1, producer="t"))
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"{msg_id} never acknowledged")
            try:
                offset = await self.client.produce(
                    self.partition, [record], timeout_s=min(3.0, remaining)
                )
            except Exception:
                self.history.produced(msg_id, acked=False)
                continue
            self.history.produced(msg_id, partition=str(self.partition), offset=offset, acked=True)
            self.acked += 1
            return offset

    async def run(self, stop: asyncio.Event) -> None:
        """Produce until ``stop``, measuring the longest wait for an acknowledgement."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        longest = 0.0
        while not stop.is_set():
            await self.send_one(timeout_s=60.0)
            now = loop.time()
            longest = max(longest, now - last)
            last = now
        self.stalls.append(longest)


async def read_all(
    client: IngestClient, partition: TopicName, history: History, *, consumer: str = "reader"
) -> list[int]:
    """Read the partition from offset 0 to its high watermark, recording each delivery."""
    offsets: list[int] = []
    offset = 0
    while True:
        reply = await fetch_served(client, partition, offset)
        assert not reply.below_wal_start
        for frame in reply.frames:
            msg_id = decode_record(frame.payload).payload.decode()
            history.delivered(
                msg_id, partition=str(partition), offset=frame.offset, consumer=consumer
            )
            offsets.append(frame.offset)
        if reply.next_offset == offset:
            return offsets
        offset = reply.next_offset


async def fetch_served(
    client: IngestClient, partition: TopicName, offset: int
) -> FetchReply[Frame]:
    """A fetch that waits (10 s at most) for a leader to serve: a new leader's owner key is
    written before it subscribes to its partition's subjects, so a read between the two
    finds no responder."""
    async with asyncio.timeout(READ_LEADER_WAIT_S):
        while True:
            try:
                return await client.fetch(partition, offset, max_count=5000)
            except NoRespondersError:
                await asyncio.sleep(0.05)


class Tailer:
    """A reader that follows the partition from offset 0 as it grows (through whichever
    node leads), recording every delivery: what it saw must never disappear later."""

    def __init__(self, client: IngestClient, partition: TopicName, history: History) -> None:
        self.client = client
        self.partition = partition
        self.history = history
        self.position = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                reply = await self.client.fetch(self.partition, self.position, timeout_s=1.0)
            except Exception:
                await asyncio.sleep(0.05)
                continue
            for frame in reply.frames:
                msg_id = decode_record(frame.payload).payload.decode()
                self.history.delivered(
                    msg_id, partition=str(self.partition), offset=frame.offset, consumer="tail"
                )
            if reply.next_offset == self.position:
                await asyncio.sleep(0.02)
            self.position = reply.next_offset


async def connect(nats_url: str, name: str) -> tuple[Bus, IngestClient]:
    from danube.config import BusConfig

    bus = await Bus.connect(BusConfig(servers=[nats_url]), name=name)
    return bus, IngestClient(bus)


@dataclass
class Send:
    """One produce call: when it started and ended (loop time), and its answer."""

    msg_id: str
    started: float
    ended: float | None = None
    offset: int | None = None
    error: str | None = None  # the error's code when it was refused


class TimedProducer:
    """Sends numbered single-message batches one at a time, each a single
    ``IngestClient.produce`` with the whole produce deadline (as discovery gives it:
    ``produce_timeout_s``), recording every call; a message refused with a retriable code is
    sent again (as the SDK does) until acknowledged."""

    def __init__(
        self,
        client: IngestClient,
        partition: TopicName,
        history: History,
        *,
        prefix: str,
        timeout_s: float = 10.0,
    ) -> None:
        self.client = client
        self.partition = partition
        self.history = history
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.sends: list[Send] = []
        self.number = 0

    def in_flight_at(self, at: float) -> list[Send]:
        """The calls started before ``at`` and not answered by then."""
        return [s for s in self.sends if s.started < at and (s.ended is None or s.ended > at)]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.send_one()

    async def send_one(self, *, total_s: float = 30.0) -> None:
        msg_id = f"{self.prefix}{self.number}"
        self.number += 1
        record = encode_record(Record(payload=msg_id.encode(), publish_time_ms=1, producer="t"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total_s
        while loop.time() < deadline:
            send = Send(msg_id, loop.time())
            self.sends.append(send)
            try:
                offset = await self.client.produce(
                    self.partition, [record], timeout_s=self.timeout_s
                )
            except (DanubeError, TimeoutError) as exc:
                send.ended = loop.time()
                send.error = exc.code if isinstance(exc, DanubeError) else "timeout"
                self.history.produced(msg_id, acked=False)
                if isinstance(exc, DanubeError) and not exc.retriable:
                    raise
                await asyncio.sleep(0.05)
                continue
            send.ended = loop.time()
            send.offset = offset
            self.history.produced(msg_id, partition=str(self.partition), offset=offset, acked=True)
            return
        raise TimeoutError(f"{msg_id} never acknowledged in {total_s}s")


class SequencedProducer:
    """An idempotent producer over the ingest contract: batches of 1..``batch_max`` records
    of one producer name and epoch with consecutive sequences, each resent with the same
    bytes until acknowledged (the leader answers a resend it stored before as a duplicate).
    Records every message's answer in the history."""

    def __init__(
        self,
        client: IngestClient,
        partition: TopicName,
        history: History,
        *,
        name: str,
        batch_max: int = 4,
    ) -> None:
        self.client = client
        self.partition = partition
        self.history = history
        self.name = name
        self.batch_max = batch_max
        self.sequence = 0
        self.sent = 0  # messages the producer was asked to send (each acknowledged in the end)
        self.duplicate_answers = 0
        self.last: tuple[bytes, int] | None = None  # the last batch's body and first offset

    async def send_batch(self, *, total_s: float = 60.0) -> int:
        count = 1 + self.sequence % self.batch_max
        ids = [f"{self.name}-{self.sequence + i}" for i in range(count)]
        records = [
            encode_record(
                Record(
                    payload=msg_id.encode(),
                    publish_time_ms=1,
                    producer=self.name,
                    sequence=self.sequence + i,
                )
            )
            for i, msg_id in enumerate(ids)
        ]
        self.sequence += count
        self.sent += count
        body = protocol.encode_produce_request(records)
        reply = await self._send(body, ids, total_s)
        self.last = (body, reply.first_offset)
        return count

    async def resend_last(self) -> protocol.ProduceReply:
        """Send the last acknowledged batch again, as a producer whose answer was lost."""
        assert self.last is not None
        body, _ = self.last
        return await self.client.produce_answer(self.partition, body, timeout_s=30.0)

    async def _send(self, body: bytes, ids: list[str], total_s: float) -> protocol.ProduceReply:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total_s
        while True:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise TimeoutError(f"{ids[0]}.. never acknowledged in {total_s}s")
            try:
                reply = await self.client.produce_answer(
                    self.partition, body, timeout_s=min(3.0, remaining_s)
                )
            except (DanubeError, TimeoutError) as exc:
                if isinstance(exc, DanubeError) and exc.code in (
                    protocol.OUT_OF_ORDER_SEQUENCE,
                    protocol.PRODUCER_FENCED,
                ):
                    raise
                for msg_id in ids:
                    self.history.produced(msg_id, acked=False)
                await asyncio.sleep(0.05)
                continue
            self.duplicate_answers += reply.duplicate
            for index, msg_id in enumerate(ids):
                self.history.produced(
                    msg_id,
                    partition=str(self.partition),
                    offset=reply.first_offset + index,
                    acked=True,
                )
            return reply

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.send_batch()
