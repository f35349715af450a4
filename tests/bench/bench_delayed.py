"""Delayed delivery at scale: N messages (default 1 000 000) each delayed by a random 1-120 s
(``deliver_after_ms`` over HTTP JSON, produced as fast as the mesh takes them, PRODUCERS
batches at a time) on a shared subscription of a 4-partition topic, two dispatchers (the
second standing by), two HTTP long-poll consumers acking in the background. KILL_AT_S into
the run (producing or not) the dispatcher serving the subscription is killed with SIGKILL;
the other takes over (lease 3 s). Delay snapshots go to a local directory (fs objects),
shared by both dispatchers as object storage would be.

Prints: how long producing took; the serving dispatcher's resident memory (VmRSS, sampled
every second: peak while it held everything) and the subscription's ``delayed`` count; the
lateness of every delivery against its due time (publish time + delay), split into messages
due while a dispatcher served and those due during the takeover; duplicates; messages lost
(must be 0) and delivered early (must be 0); what the new owner read from the log again and
took from snapshots (its metrics).

Run: .venv/bin/python tests/bench/bench_delayed.py [messages] [max delay s] [kill at s]
(``CONSUME=proxy``: the consumers poll through discovery instead of the owner's door)
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import gc
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mesh import bench_mesh

TOPIC = "/v1/topics/default/delayed"
SUB = "s"
PARTITIONS = 4
BATCH = 1000
CONSUMERS = 2
PRODUCERS = 4  # batches under way at once
# Consumers poll their subscription owner's consume door with JSON (DESIGN §10); CONSUME=proxy:
# through discovery, as before the doors; CONSUME=sdk: the SDK's consumers (binary frames
# streamed from the owner's door, acks grouped), as an application would.
CONSUME = os.environ.get("CONSUME", "direct")
DIRECT = CONSUME != "proxy"
# This process holds a due time and an arrival per message (two dicts of a million tuple
# keys): a full collection of its own walks them all while deliveries wait in its sockets,
# which would count as the dispatcher's lateness. BENCH_GC=freeze (the default) moves what
# it holds out of the collector's way each second; BENCH_GC=on leaves the collector alone.
# Either way its own pauses are printed.
BENCH_GC = os.environ.get("BENCH_GC", "freeze")
_own_pauses_s: list[float] = []
_own_started = [0.0]


def _time_own_collections(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _own_started[0] = time.perf_counter()
    else:
        _own_pauses_s.append(time.perf_counter() - _own_started[0])


def _own_gc() -> str:
    pauses = _own_pauses_s
    return (
        f"this process's collections {len(pauses)}, held {sum(pauses):.2f} s, longest "
        f"{max(pauses, default=0) * 1000:.0f} ms, over 10 ms {sum(p > 0.01 for p in pauses)} "
        f"(BENCH_GC={BENCH_GC})"
    )


@dataclass
class Run:
    due: dict[tuple[str, int], int] = field(default_factory=dict)  # ref -> due ms
    first: dict[tuple[str, int], int] = field(default_factory=dict)  # ref -> arrival ms
    deliveries: int = 0
    rss_kib: dict[str, int] = field(default_factory=dict)  # node -> peak VmRSS
    delayed_max: int = 0
    killed_ms: int | None = None
    served_again_ms: int | None = None
    produced: bool = False
    produced_ms: int | None = None  # when the last batch was acknowledged
    complete: asyncio.Event = field(default_factory=asyncio.Event)
    # This process's own loop, sampled every 10 ms: (wall ms, how late the sample ran).
    # With the SDK consumers its timers release held messages: its lag is their lateness.
    lags: list[tuple[int, int]] = field(default_factory=list)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _sample_own_loop(run: Run, done: asyncio.Event) -> None:
    while not done.is_set():
        before = time.monotonic()
        await asyncio.sleep(0.01)
        run.lags.append((_now_ms(), int((time.monotonic() - before - 0.01) * 1000)))


def _own_loop(run: Run, since_ms: int) -> str:
    lags = [lag for at, lag in run.lags if at >= since_ms]
    return (
        f"this process's loop after producing: {len(lags)} samples, late by over 10 ms "
        f"{sum(lag > 10 for lag in lags)}, over 50 ms {sum(lag > 50 for lag in lags)}, "
        f"at most {max(lags, default=0)} ms"
    )


def _explained(run: Run, late: dict[tuple[str, int], int], over_ms: int = 50) -> str:
    """Of the messages more than ``over_ms`` late, how many came in a stall of this process's
    own loop at least that long less 20 ms (a sample at most 30 ms after the arrival): with
    the SDK's consumers the message was in this process, held, and its timer ran late."""
    lags = sorted(run.lags)
    times = [at for at, _ in lags]
    slow = [(ref, ms) for ref, ms in late.items() if ms > over_ms]
    explained = 0
    for ref, ms in slow:
        arrived = run.first[ref]
        start = bisect.bisect_left(times, arrived)
        end = bisect.bisect_right(times, arrived + 30)
        if any(lag >= ms - 20 for _, lag in lags[start:end]):
            explained += 1
    return (
        f"messages over {over_ms} ms late: {len(slow)}, of which in a stall of this "
        f"process's loop as long: {explained}"
    )


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def _produce(http: httpx.AsyncClient, run: Run, count: int, delay_max_s: float) -> None:
    rng = random.Random(34)
    batches = iter(range(0, count, BATCH))

    async def producer() -> None:
        for first in batches:
            size = min(BATCH, count - first)
            delays = [rng.randrange(1000, int(delay_max_s * 1000)) for _ in range(size)]
            body = {"messages": [{"payload": str(d), "deliver_after_ms": d} for d in delays]}
            answer = await http.post(f"{TOPIC}/messages", json=body)
            answer.raise_for_status()
            sent_ms = _now_ms()
            for delay, result in zip(delays, answer.json()["results"], strict=True):
                # Due at its publish time + delay: at most this (the delivery says exactly).
                run.due.setdefault((result["partition"], result["offset"]), sent_ms + delay)

    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))


async def _attach(http: httpx.AsyncClient, name: str) -> tuple[str, str | None]:
    """The consumer's id and its subscription owner's consume door (None: none named)."""
    async with asyncio.timeout(120):
        while True:
            answer = await http.post(
                f"{TOPIC}/subscriptions/{SUB}/consumers",
                json={"name": name, "type": "shared", "start": "earliest"},
            )
            if answer.status_code == 201:
                body = answer.json()
                url = body.get("url") if DIRECT else None
                return str(body["consumer_id"]), url
            await asyncio.sleep(0.1)


async def _consume(http: httpx.AsyncClient, run: Run, name: str, done: asyncio.Event) -> None:
    consumer, url = await _attach(http, name)
    acks: set[asyncio.Task[Any]] = set()
    doors: dict[str, httpx.AsyncClient] = {}
    try:
        while not done.is_set():
            # The owner's consume door when the attach named one (DESIGN §10), else discovery.
            if url is not None and url not in doors:
                doors[url] = httpx.AsyncClient(base_url=url, timeout=30)
            at = http if url is None else doors[url]
            sent = _now_ms()
            try:
                answer = await at.get(
                    f"/v1/consumers/{consumer}/messages", params={"max": 1000, "wait_ms": 500}
                )
            except httpx.TransportError:  # the door's dispatcher was killed
                consumer, url = await _attach(http, name)
                continue
            arrived = _now_ms()
            if answer.status_code != 200:
                # Its dispatcher was killed (404, 503), or the subscription moved (421).
                assert answer.status_code in (404, 421, 503), answer.text
                consumer, url = await _attach(http, name)
                continue
            await _took(run, answer.json()["messages"], sent, arrived, at, consumer, acks)
    finally:
        for door in doors.values():
            await door.aclose()


async def _consume_sdk(url: str, run: Run, name: str, done: asyncio.Event) -> None:
    """A consumer of the SDK: frames streamed from the owner's door, re-attached by the SDK
    when its dispatcher dies; each message acked as it comes (the SDK groups the acks)."""
    from danube.client import AsyncDanubeClient

    async with AsyncDanubeClient(url) as client:
        topic = TOPIC.removeprefix("/v1/topics")
        async with client.consumer(
            topic, SUB, name=name, type="shared", start="earliest"
        ) as consumer:
            while not done.is_set():
                try:
                    message = await consumer.receive(timeout_s=0.5)
                except TimeoutError:
                    continue
                arrived = _now_ms()
                killed = run.killed_ms
                if killed is not None and arrived > killed + 100 and run.served_again_ms is None:
                    run.served_again_ms = arrived
                run.deliveries += 1
                ref = (message.partition, message.offset)
                run.first.setdefault(ref, arrived)
                run.due[ref] = message.publish_time_ms + int(message.payload)
                message.ack()
                if run.produced and len(run.first) >= len(run.due):
                    run.complete.set()


async def _took(
    run: Run,
    messages: list[dict[str, Any]],
    sent: int,
    arrived: int,
    at: httpx.AsyncClient,
    consumer: str,
    acks: set[asyncio.Task[Any]],
) -> None:
    # Served again: a poll sent after the kill answered (one in flight may still bring
    # what the killed dispatcher sent just before).
    killed = run.killed_ms
    if messages and killed is not None and sent > killed and run.served_again_ms is None:
        run.served_again_ms = arrived
    run.deliveries += len(messages)
    for m in messages:
        ref = (m["partition"], m["offset"])
        run.first.setdefault(ref, arrived)
        run.due[ref] = m["publish_time_ms"] + int(m["payload"])  # exact: as stored
    if run.produced and len(run.first) >= len(run.due):
        run.complete.set()
    if messages:
        refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
        task = asyncio.create_task(_ack(at, consumer, refs))
        acks.add(task)
        task.add_done_callback(acks.discard)


async def _ack(at: httpx.AsyncClient, consumer: str, refs: list[dict[str, Any]]) -> None:
    with contextlib.suppress(httpx.TransportError):  # a killed door: they come again
        await at.post(f"/v1/consumers/{consumer}/ack", json={"messages": refs})


async def _owner(http: httpx.AsyncClient) -> tuple[str | None, int]:
    listed = (await http.get(f"{TOPIC}/subscriptions")).json()["subscriptions"]
    for sub in listed:
        if sub["name"] == SUB:
            owner = sub["owner"]
            return (None if owner is None else owner["node_id"]), sub.get("delayed") or 0
    return None, 0


async def _watch(
    http: httpx.AsyncClient, run: Run, pids: dict[str, int], done: asyncio.Event
) -> None:
    while not done.is_set():
        for node, pid in pids.items():
            if node.startswith("bench-dispatcher"):
                run.rss_kib[node] = max(run.rss_kib.get(node, 0), _rss_kib(pid))
        try:
            _, delayed = await _owner(http)
            run.delayed_max = max(run.delayed_max, delayed)
        except httpx.HTTPError:
            pass
        if BENCH_GC == "freeze":
            gc.freeze()
        await asyncio.sleep(1.0)


def _metrics_of(pid: int, prefix: str = "danube_dispatcher_delayed") -> dict[str, float]:
    """The metrics named ``prefix``... of the process ``pid``: its listening ports are found
    in /proc, the one answering /metrics is its metrics port."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
            ports.append(int(fields[1].split(":")[1], 16))
    for port in ports:  # the consume door listens too: the one whose /metrics answers
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            if answer.status_code != 200:
                continue
            text = answer.text
            return {
                name: float(value)
                for name, _, value in (line.partition(" ") for line in text.splitlines())
                if name.startswith(prefix)
            }
    return {}


def _stalls(pid: int) -> str:
    """How often the process ``pid``'s event loop was late and its collections long (its
    danube_event_loop_lag_seconds and danube_gc_pause_seconds)."""
    metrics = _metrics_of(pid, "danube_")

    def count(name: str, labels: str = "") -> int:  # labels: 'generation="2"' or none
        return int(metrics.get(f"{name}_count{{{labels}}}" if labels else f"{name}_count", 0))

    def over(name: str, bound: str, labels: str = "") -> int:
        le = f'{labels},le="{bound}"' if labels else f'le="{bound}"'
        return count(name, labels) - int(metrics.get(f"{name}_bucket{{{le}}}", 0))

    lag, gc = "danube_event_loop_lag_seconds", "danube_gc_pause_seconds"
    collections = {g: count(gc, f'generation="{g}"') for g in "012"}
    long_ones = {g: over(gc, "0.01", f'generation="{g}"') for g in "012"}
    held_s = {g: round(metrics.get(f'{gc}_sum{{generation="{g}"}}', 0.0), 2) for g in "012"}
    return (
        f"loop lag samples {count(lag)}: over 10 ms {over(lag, '0.01')}, 50 ms "
        f"{over(lag, '0.05')}, 100 ms {over(lag, '0.1')}; collections {collections}, "
        f"over 10 ms {long_ones}, seconds held {held_s}"
    )


def _quantiles(values: list[int]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    marks = " ".join(
        f"{name} {ordered[min(len(ordered) - 1, int(q * len(ordered)))]}"
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))
    )
    return f"n {len(ordered)} {marks} max {ordered[-1]} ms"


async def main(count: int, delay_max_s: float, kill_at_s: float) -> None:
    gc.callbacks.append(_time_own_collections)
    pids: dict[str, int] = {}
    run = Run()
    done = asyncio.Event()
    survivor: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-delayed-") as tmp:
        env = {
            "DANUBE_DISPATCHER__LEASE_TTL_S": "3",
            # Delay snapshots (off by default): DELAY_SNAPSHOTS=0 measures without them.
            "DANUBE_DISPATCHER__DELAYED_SEAL_INTERVAL_S": os.environ.get("DELAY_SNAPSHOTS", "1.0"),
            "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs",
            "DANUBE_WAL_CLOUD__CLOUD__ROOT": str(Path(tmp) / "objects"),
        }
        services = ["ingest", "dispatcher", "dispatcher", "discovery"]
        async with bench_mesh(Path(tmp), services, env, pids=pids) as http:
            answer = await http.put(TOPIC, json={"partitions": PARTITIONS})
            answer.raise_for_status()
            consume = (
                functools.partial(_consume_sdk, str(http.base_url))
                if CONSUME == "sdk"
                else functools.partial(_consume, http)
            )
            consumers = [asyncio.create_task(consume(run, f"c{i}", done)) for i in range(CONSUMERS)]
            watcher = asyncio.create_task(_watch(http, run, pids, done))
            sampler = asyncio.create_task(_sample_own_loop(run, done))
            started = time.monotonic()

            async def kill() -> str | None:
                await asyncio.sleep(kill_at_s)
                owner, delayed = await _owner(http)
                for _ in range(40):  # a listing under load may miss the owner: ask again
                    if owner is not None:
                        break
                    await asyncio.sleep(0.5)
                    owner, delayed = await _owner(http)
                else:  # still none: the dispatcher holding the most is the owner
                    rss = {n: _rss_kib(pid) for n, pid in pids.items() if "dispatcher" in n}
                    owner = max(rss, key=rss.__getitem__)
                print(
                    f"at {time.monotonic() - started:.0f} s: owner {owner}, delayed {delayed}, "
                    f"{len(run.due)} produced, peak RSS so far "
                    f"{ {n: f'{k / 1024:.0f} MiB' for n, k in run.rss_kib.items()} }"
                )
                if owner is not None:
                    print(f"{owner} until now: {_stalls(pids[owner])}")
                if owner is not None and kill_at_s > 0:
                    os.kill(pids[owner], signal.SIGKILL)
                    run.killed_ms = _now_ms()
                    print(f"killed {owner} (SIGKILL)")
                return owner

            killer = asyncio.create_task(kill())
            await _produce(http, run, count, delay_max_s)
            produced_s = time.monotonic() - started
            run.produced = True
            run.produced_ms = _now_ms()
            print(f"produced {count} in {produced_s:.1f} s ({count / produced_s:.0f}/s)")
            killed_node = await killer
            # Each consumer checks after every poll; the run ends when all came, or on time out.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_max_s + 120):
                    await run.complete.wait()
            done.set()
            for outcome in await asyncio.gather(
                *consumers, watcher, sampler, return_exceptions=True
            ):
                if isinstance(outcome, Exception):
                    print(f"a consumer or the watcher failed: {outcome!r}")
            others = [n for n in pids if n.startswith("bench-dispatcher") and n != killed_node]
            survivor = _metrics_of(pids[others[0]]) if others else {}
    lost = [ref for ref in run.due if ref not in run.first]
    early = [ref for ref, at in run.due.items() if ref in run.first and run.first[ref] < at]
    killed = run.killed_ms if run.killed_ms is not None else 2**62
    settled = (run.served_again_ms or killed) + 1000
    late = {r: run.first[r] - at for r, at in run.due.items() if r in run.first}
    before = [ms for r, ms in late.items() if run.due[r] < killed]
    # The machine is saturated while 1 000 000 messages go in as fast as the mesh takes them:
    # the lateness of those due meanwhile is apart from the steady state's.
    produced_ms = run.produced_ms or killed
    producing = [ms for r, ms in late.items() if run.due[r] < min(produced_ms, killed)]
    steady = [ms for r, ms in late.items() if produced_ms <= run.due[r] < killed]
    takeover = [ms for r, ms in late.items() if killed <= run.due[r] < settled]
    after = [ms for r, ms in late.items() if run.due[r] >= settled]
    print(
        f"messages {len(run.due)}, delivered {len(run.first)}, lost {len(lost)}, "
        f"early {len(early)}, duplicates {run.deliveries - len(run.first)}"
    )
    print(
        f"delayed held at most {run.delayed_max}; dispatchers' peak RSS "
        f"{ {n: f'{k / 1024:.0f} MiB' for n, k in run.rss_kib.items()} }"
    )
    print(_own_gc())
    print(_own_loop(run, produced_ms))
    print(_explained(run, late))
    print(f"lateness, due before the kill: {_quantiles(before)}")
    print(f"  of which due while producing: {_quantiles(producing)}")
    print(f"  of which due after producing: {_quantiles(steady)}")
    window_ms = 0 if run.killed_ms is None else settled - run.killed_ms
    print(f"lateness, due during the takeover ({window_ms} ms): {_quantiles(takeover)}")
    print(f"lateness, due after it: {_quantiles(after)}")
    print(f"the new owner's delay metrics: {survivor or 'none'}")


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(
        main(
            int(args[0]) if args else 1_000_000,
            float(args[1]) if len(args) > 1 else 120.0,
            float(args[2]) if len(args) > 2 else 120.0,
        )
    )
