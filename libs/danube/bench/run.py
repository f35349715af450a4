"""The measurements behind `danube bench`: produce, consume and end-to-end runs over the SDK,
with no terminal I/O (the command draws progress from :class:`Meter` and prints the result).

Latencies: ``produce`` times each message from ``send()`` (which waits while the producer's
queue is full) to its stored offset; ``e2e`` also times each message from ``send()`` to its
delivery (a wall-clock stamp in attribute ``bench_ns``: producer and consumer run in this
process, so they share one clock), and from the produce's answer to the delivery
(``after_ack_ms``: the delivery path alone, 0 for a message delivered before its producer
heard the answer, ``delivered_before_ack`` counts those). Without ``rate`` a run is
closed-loop (as fast as the server takes it), so its latency includes queueing; ``rate``
sends at a fixed pace.
MB is 10^6 bytes of payload.

Client CPU: a run reports this process's CPU seconds over its timed part
(``client_cpu_s``), their share of the wall time (``client_cpu_per_wall``: near 1.0, the
client is what bounds the row) and per message (``client_cpu_us_per_msg``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from danube.bench.stats import SAMPLES_MAX, Latencies, cpu_summary, rates
from danube.client.errors import ClientError, DeadlineExceededError

if TYPE_CHECKING:
    from danube.client.client import AsyncDanubeClient
    from danube.client.consumer import Mode
    from danube.client.messages import ReceivedMessage
    from danube.client.producer import AsyncProducer

# Latency samples kept per measure (reservoir sampling past it): bounded memory on any run.
# A consumer that receives nothing this long ends its run (the rest are reported missing).
DRAIN_TIMEOUT_S = 30.0
RECEIVE_STEP_S = 0.2
STAMP = "bench_ns"

Kind = Literal["produce", "consume", "e2e"]
Transport = Literal["binary", "json"]


@dataclass
class Meter:
    """Counters a run updates and the progress display reads."""

    total: int | None  # messages the run aims at (None: until the duration ends)
    duration_s: float | None
    started: float = field(default_factory=time.monotonic)
    produced: int = 0
    consumed: int = 0
    errors: int = 0
    phase: str = "run"

    def done_fraction(self, kind: Kind) -> float:
        """How far the run is, 0..1."""
        if self.total:
            progress = self.consumed if kind != "produce" else self.produced
            return min(1.0, progress / self.total)
        assert self.duration_s is not None
        return min(1.0, (time.monotonic() - self.started) / self.duration_s)


@dataclass(frozen=True)
class BenchSpec:
    """What to run (the command's options)."""

    kind: Kind
    topic: str
    size_bytes: int = 1024
    batch_max_messages: int = 1000
    linger_ms: float = 5.0
    inflight: int = 1
    producers: int = 1
    duration_s: float | None = 10.0
    count: int | None = None
    rate: float = 0.0  # messages per second, all producers together (0: as fast as it goes)
    mode: Mode = "stream"
    receiver_queue_size: int = 1000
    consume_transport: Transport = "binary"  # how the consumer gets messages (not produce)
    payload: bytes | None = None  # what every message carries (default: size_bytes of text)
    transport: Transport = "binary"  # the producers' body (danube.client ProducerOptions)
    # Produce through send_many() (batch_max_messages per call) rather than send() each.
    send_many: bool = False
    # Each send awaited before the next (a closed loop, as a synchronous publish).
    sync: bool = False
    # Idempotent producers (the SDK's default: docs/client.md, "Exactly once into the log").
    idempotent: bool = True
    direct: bool = True  # to the leaders' data doors (idempotent producers only)
    consume_direct: bool = True  # the consumer on its subscription owner's consume door
    # Messages sent in the run's first warmup_s are sent, stored and delivered as any, but
    # their latencies are reported apart (``warmup_latency_ms``): the first lookups,
    # connections and the topic's first leader are the start's, not the steady state's.
    warmup_s: float = 0.0


def payload_of(size: int) -> bytes:
    """A printable payload of ``size`` bytes (text travels without base64)."""
    rng = random.Random(size)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=size)).encode()


class _Producing:
    """The producer side of a run: counts, latencies, errors."""

    def __init__(self, spec: BenchSpec, meter: Meter, stamp: bool) -> None:
        self.spec = spec
        self.meter = meter
        self.stamp = stamp
        self.latency = Latencies()
        self.warmup = Latencies()  # of the messages sent in the warm-up (BenchSpec.warmup_s)
        self._warm_until_ns = 0  # time.perf_counter_ns() when the warm-up ends
        self.warm_until_wall_ns = 0  # the same moment by time.time_ns() (the stamps' clock)
        self.last_error: ClientError | None = None
        # By stamp, when the producer heard the answer (e2e; at most SAMPLES_MAX kept).
        self.acked_ns: dict[str, int] = {}
        self.payload = spec.payload if spec.payload is not None else payload_of(spec.size_bytes)
        # When each unsettled future of a run without stamps was sent: one dict entry per
        # message rather than a closure (an object the GC tracks) per message.
        self._started_ns: dict[asyncio.Future[Any], int] = {}

    def _settled(self, started_ns: int, stamp: str | None) -> Callable[[asyncio.Future[Any]], None]:
        def done(future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                if stamp is not None and len(self.acked_ns) < SAMPLES_MAX:
                    self.acked_ns[stamp] = time.time_ns()
                self.meter.produced += 1
                self.latency_of(started_ns).add((time.perf_counter_ns() - started_ns) / 1e9)
            else:
                self.meter.errors += 1
                if isinstance(error, ClientError):
                    self.last_error = error

        return done

    def _done(self, future: asyncio.Future[Any]) -> None:
        """:meth:`_settled` of a message without a stamp (its start in ``_started_ns``)."""
        started_ns = self._started_ns.pop(future)
        if future.cancelled():
            return
        if future.exception() is None:
            self.meter.produced += 1
            self.latency_of(started_ns).add((time.perf_counter_ns() - started_ns) / 1e9)
        else:
            self._settled(started_ns, None)(future)

    def _group_settled(self, started_ns: int, count: int) -> Callable[[asyncio.Future[Any]], None]:
        def done(future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is None:
                self.meter.produced += count
                latency_s = (time.perf_counter_ns() - started_ns) / 1e9
                latency = self.latency_of(started_ns)
                for _ in range(count):  # each message of the group waited this long
                    latency.add(latency_s)
            else:
                self.meter.errors += count
                if isinstance(error, ClientError):
                    self.last_error = error

        return done

    async def run(self, client: AsyncDanubeClient, share: int | None, index: int) -> None:
        """One producer's loop: ``share`` messages, or until the duration ends."""
        spec = self.spec
        producer: AsyncProducer = client.producer(
            spec.topic,
            name=f"bench-{index}",
            linger_ms=spec.linger_ms,
            batch_max_messages=spec.batch_max_messages,
            max_inflight_batches=spec.inflight,
            max_pending_messages=max(10_000, 2 * spec.batch_max_messages * spec.inflight),
            transport=spec.transport,
            idempotent=spec.idempotent and spec.transport == "binary",
            direct=spec.direct,
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = None if spec.duration_s is None or share is not None else start + spec.duration_s
        pace = spec.producers / spec.rate if spec.rate else 0.0
        sent = 0
        async with producer:
            while (share is None or sent < share) and (end is None or loop.time() < end):
                if spec.send_many and not pace and not self.stamp:
                    count = spec.batch_max_messages
                    if share is not None:
                        count = min(count, share - sent)
                    started_ns = time.perf_counter_ns()
                    group = await producer.send_many([self.payload] * count)
                    group.add_done_callback(self._group_settled(started_ns, count))
                    sent += count
                    continue
                if pace:
                    delay = start + sent * pace - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                stamp = str(time.time_ns()) if self.stamp else None
                attributes = {STAMP: stamp} if stamp is not None else None
                started_ns = time.perf_counter_ns()
                future = await producer.send(self.payload, attributes=attributes)
                if stamp is None:
                    self._started_ns[future] = started_ns
                    future.add_done_callback(self._done)
                else:
                    future.add_done_callback(self._settled(started_ns, stamp))
                sent += 1
                if spec.sync:
                    # Settled (counted by its callback) before the next is sent; a failure
                    # is counted there too and the loop goes on, as a paced one does. A
                    # plain await: asyncio.wait() cost 6-13 us more a message, inside what
                    # the run measures.
                    with contextlib.suppress(Exception):
                        await future
        # close() flushed: every future is settled.

    def latency_of(self, started_ns: int) -> Latencies:
        """Where the latency of a message sent at ``started_ns`` is counted."""
        return self.latency if started_ns >= self._warm_until_ns else self.warmup

    def start_warmup(self) -> None:
        """The run starts now: its warm-up ends ``warmup_s`` from now."""
        warmup_ns = int(self.spec.warmup_s * 1e9)
        self._warm_until_ns = time.perf_counter_ns() + warmup_ns
        self.warm_until_wall_ns = time.time_ns() + warmup_ns

    def warmup_report(self) -> dict[str, Any]:
        """The warm-up's share of a run's result (nothing without one)."""
        if not self.spec.warmup_s:
            return {}
        return {"warmup_s": self.spec.warmup_s, "warmup_latency_ms": self.warmup.summary_ms()}

    async def run_all(self, client: AsyncDanubeClient) -> None:
        """Every producer of the run, concurrently."""
        spec = self.spec
        if not self._warm_until_ns:  # (an e2e run started it before its consumer)
            self.start_warmup()
        shares: list[int | None] = [None] * spec.producers
        if spec.count is not None:
            base, extra = divmod(spec.count, spec.producers)
            shares = [base + (1 if i < extra else 0) for i in range(spec.producers)]
        async with asyncio.TaskGroup() as tg:
            for index, share in enumerate(shares):
                tg.create_task(self.run(client, share, index))


def _base(spec: BenchSpec) -> dict[str, Any]:
    return {
        "bench": spec.kind,
        "topic": spec.topic,
        "message_size_bytes": spec.size_bytes,
        "batch_max_messages": spec.batch_max_messages,
        "linger_ms": spec.linger_ms,
        "producers": spec.producers,
        "inflight_batches": spec.inflight,
        "rate": spec.rate or None,
        "transport": spec.transport,
        "sync": spec.sync,
        "idempotent": spec.idempotent and spec.transport == "binary",
        "direct": spec.direct and spec.idempotent and spec.transport == "binary",
        "consume_direct": spec.consume_direct,
    }


async def bench_produce(client: AsyncDanubeClient, spec: BenchSpec, meter: Meter) -> dict[str, Any]:
    """Produce for the duration (or ``count`` messages); rates and send→stored latency."""
    producing = _Producing(spec, meter, stamp=False)
    started = time.monotonic()
    meter.started = started
    cpu_started = time.process_time()
    await producing.run_all(client)
    cpu_s = time.process_time() - cpu_started
    elapsed = time.monotonic() - started
    return {
        **_base(spec),
        "messages": meter.produced,
        "errors": meter.errors,
        "last_error": str(producing.last_error) if producing.last_error else None,
        "bytes": meter.produced * spec.size_bytes,
        **rates(meter.produced, spec.size_bytes, elapsed),
        **cpu_summary(meter.produced, cpu_s, elapsed),
        "latency_ms": producing.latency.summary_ms(),
        **producing.warmup_report(),
    }


async def bench_consume(client: AsyncDanubeClient, spec: BenchSpec, meter: Meter) -> dict[str, Any]:
    """Fill the topic with ``count`` messages (not timed), attach a consumer (not timed),
    then time consuming them all from the earliest offset (acking each)."""
    assert spec.count is not None
    meter.phase = "fill"
    fill = dataclasses.replace(spec, kind="produce", inflight=max(spec.inflight, 4), rate=0.0)
    filling = _Producing(fill, Meter(total=spec.count, duration_s=None), stamp=False)
    await filling.run_all(client)
    if filling.last_error is not None:
        raise filling.last_error
    meter.phase = "consume"
    async with client.consumer(
        spec.topic,
        "bench",
        start="earliest",
        mode=spec.mode,
        receiver_queue_size=spec.receiver_queue_size,
        transport=spec.consume_transport,
        direct=spec.consume_direct,
    ) as consumer:
        # Timed once the consumer is attached (its subscription created), as a JetStream
        # pull consumer is created before the clock starts (tests/bench/bench_peers.py).
        started = time.monotonic()
        meter.started = started
        seen: set[tuple[str, int]] = set()
        while len(seen) < spec.count:
            message = await consumer.receive(DRAIN_TIMEOUT_S)
            message.ack()
            seen.add((message.partition, message.offset))
            meter.consumed = len(seen)
        elapsed = time.monotonic() - started
        await consumer.flush_acks()
    return {
        **_base(spec),
        "mode": spec.mode,
        "consume_transport": spec.consume_transport,
        "messages": len(seen),
        "errors": meter.errors,
        "bytes": len(seen) * spec.size_bytes,
        **rates(len(seen), spec.size_bytes, elapsed),
        "latency_ms": None,
    }


def _after_ack(received_ns: dict[str, int], acked_ns: dict[str, int]) -> tuple[Latencies, int]:
    """How long after its producer heard "stored" each sampled message was delivered, and
    how many were delivered before that (the live path can beat the answer)."""
    after_ack = Latencies()
    before_ack = 0
    for stamp, got_ns in received_ns.items():
        acked = acked_ns.get(stamp)
        if acked is not None:
            before_ack += got_ns < acked
            after_ack.add(max(got_ns - acked, 0) / 1e9)
    return after_ack, before_ack


class _Deliveries:
    """What an e2e run's consumer received: each message once (``duplicates`` counts the
    others), its send→delivered latency, and the delivery time of a sample of them (for
    ``after_ack_ms``)."""

    def __init__(self, meter: Meter) -> None:
        self.meter = meter
        self.seen: set[tuple[str, int]] = set()
        self.duplicates = 0
        self.latency = Latencies()
        self.warmup = Latencies()  # of messages sent in the warm-up (BenchSpec.warmup_s)
        self.warm_until_ns = 0  # by time.time_ns(), the stamps' clock
        self.received_ns: dict[str, int] = {}  # by stamp, at most SAMPLES_MAX

    def take(self, message: ReceivedMessage) -> None:
        """One delivery."""
        ref = (message.partition, message.offset)
        seen = self.seen
        if ref in seen:
            self.duplicates += 1
            return
        seen.add(ref)
        self.meter.consumed = len(seen)
        stamp = message.attributes.get(STAMP)
        if stamp is not None:
            now_ns = time.time_ns()
            sent_ns = int(stamp)
            latency = self.latency if sent_ns >= self.warm_until_ns else self.warmup
            latency.add((now_ns - sent_ns) / 1e9)
            if len(self.received_ns) < SAMPLES_MAX:
                self.received_ns[stamp] = now_ns


def _e2e_warmup(spec: BenchSpec, delivered: Latencies, stored: Latencies) -> dict[str, Any]:
    """An e2e run's warm-up (nothing without one): send→delivered and send→stored."""
    if not spec.warmup_s:
        return {}
    return {
        "warmup_s": spec.warmup_s,
        "warmup_latency_ms": delivered.summary_ms(),
        "warmup_produce_latency_ms": stored.summary_ms(),
    }


async def bench_e2e(client: AsyncDanubeClient, spec: BenchSpec, meter: Meter) -> dict[str, Any]:
    """Produce and consume at once; send→stored and send→delivered latencies."""
    producing = _Producing(spec, meter, stamp=True)
    deliveries = _Deliveries(meter)
    seen = deliveries.seen
    async with client.consumer(
        spec.topic,
        "bench",
        start="earliest",
        mode=spec.mode,
        receiver_queue_size=spec.receiver_queue_size,
        transport=spec.consume_transport,
        direct=spec.consume_direct,
    ) as consumer:
        producers_done = asyncio.Event()
        loop = asyncio.get_running_loop()
        started = last_delivery = loop.time()

        async def consume() -> None:
            nonlocal last_delivery
            # Until every stored message came, or none came for DRAIN_TIMEOUT_S.
            while not (producers_done.is_set() and len(seen) >= meter.produced):
                try:
                    message = await consumer.receive(RECEIVE_STEP_S)
                except DeadlineExceededError:
                    if loop.time() - last_delivery > DRAIN_TIMEOUT_S:
                        return
                    continue
                last_delivery = loop.time()
                deliveries.take(message)
                message.ack()

        meter.started = time.monotonic()
        producing.start_warmup()
        deliveries.warm_until_ns = producing.warm_until_wall_ns
        async with asyncio.TaskGroup() as tg:
            receiving = tg.create_task(consume())
            await producing.run_all(client)
            producers_done.set()
            await receiving
        elapsed = last_delivery - started
        await consumer.flush_acks()
        # Whether the consumer stayed on a consume door (a fall back goes through discovery).
        on_door = consumer.door_url is not None and consumer.door_fallbacks == 0
    after_ack, before_ack = _after_ack(deliveries.received_ns, producing.acked_ns)
    return {
        **_base(spec),
        "mode": spec.mode,
        "consume_transport": spec.consume_transport,
        "consumed_on_door": on_door,
        "produced": meter.produced,
        "consumed": len(seen),
        "messages": len(seen),
        "duplicates": deliveries.duplicates,
        "missing": meter.produced - len(seen),
        "errors": meter.errors,
        "last_error": str(producing.last_error) if producing.last_error else None,
        "bytes": len(seen) * spec.size_bytes,
        **rates(len(seen), spec.size_bytes, elapsed),
        "latency_ms": deliveries.latency.summary_ms(),
        "produce_latency_ms": producing.latency.summary_ms(),
        **_e2e_warmup(spec, deliveries.warmup, producing.warmup),
        "after_ack_ms": after_ack.summary_ms(),
        "delivered_before_ack": before_ack,
    }
