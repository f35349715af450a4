"""`make compose-smoke`: the compose stack, scaled, on this machine, end to end.

Needs root (it may install docker.io and debootstrap, and start dockerd) and no image
registry. Steps, each bounded, all within ``--timeout-s``:

1. a Docker engine (the running one, else ``dockerd`` started here: smoke_engine.py);
2. local images: a debootstrap'd Debian base, a wheelhouse, the mesh image from
   deploy/Dockerfile and the servers image (smoke_images.py);
3. ``compose up --wait`` of docker-compose.yml + deploy/compose/loopback.yml (local
   images, host network, loopback ports) + tests/compose/smoke.yml (fast tiers), with
   ``--scale ingest=2 --scale dispatcher=3 --scale cloud_reader=2``;
4. through discovery's port: every replica registered under its own node id; produce
   keyed messages to a 2-partition topic, consume them all; wait until every partition is
   uploaded and the WAL dropped what it uploaded; read everything again from the earliest
   offset with a new subscription (the dropped part comes from object storage, as the
   cloud readers' /metrics show); each ingest replica has its own WAL directory on the
   shared volume; then both ingest containers are recreated (as an upgrade does), come back
   as the same nodes ingest-0 and ingest-1, and the live subscription gets exactly the
   messages produced after that;
5. ``compose down -v`` and a sweep of anything left by label; dockerd stopped if started.

Exit 0 with a timing summary, or 1 with what failed; the containers' logs are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from docker.models.containers import Container

from danube.client import AsyncConsumer, AsyncDanubeClient, ReceivedMessage
from danube.client.admin import AsyncAdmin, TopicDescription
from danube.runtime import free_port

from smoke_engine import ComposeStack, Engine, SmokeError, compose_command
from smoke_images import (
    MESH_DOCKERFILE,
    build_image,
    ensure_base_image,
    ensure_wheelhouse,
    mesh_context,
    servers_context,
)

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILES = (
    REPO / "docker-compose.yml",
    REPO / "deploy/compose/loopback.yml",
    REPO / "tests/compose/smoke.yml",
)
MESH_IMAGE = "danube-mesh:smoke"
SERVERS_IMAGE = "danube-servers:smoke"
SCALE = {"ingest": 2, "dispatcher": 3, "cloud_reader": 2}
NODE_COUNTS = {**SCALE, "uploader": 1, "retention": 1, "discovery": 1}
TOPIC = "/default/compose-smoke"
PARTITIONS = 2
MESSAGES = 512
PAYLOAD_BYTES = 8192  # 4 MiB in all: ~2 MiB a partition, over the 1 MiB WAL limit of smoke.yml
AFTER_RECREATE_MESSAGES = 64
WAIT_HEALTHY_S = 240
CLUSTER_WAIT_S = 60.0
TRANSFER_WAIT_S = 120.0
TIERS_WAIT_S = 120.0
TIMEOUT_S_DEFAULT = 1500
_T = TypeVar("_T")


class SmokeTimeout(Exception):
    """The whole run took longer than ``--timeout-s``."""


@dataclass
class Timings:
    """How long each step took, in order."""

    started: float = field(default_factory=time.monotonic)
    steps: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(f"compose-smoke: {name} ...", flush=True)
        began = time.monotonic()
        yield
        took = time.monotonic() - began
        self.steps.append((name, took))
        print(f"compose-smoke: {name}: {took:.1f} s", flush=True)

    def summary(self) -> str:
        width = max(len(name) for name, _ in [*self.steps, ("total", 0.0)])
        lines = [f"  {name:<{width}} {took:7.1f} s" for name, took in self.steps]
        lines.append(f"  {'total':<{width}} {time.monotonic() - self.started:7.1f} s")
        return "\n".join(lines)


def payload(index: int) -> bytes:
    """Message ``index``: its number, then filler up to PAYLOAD_BYTES (text: no base64)."""
    head = f"{index:06d}:".encode()
    return head + b"x" * (PAYLOAD_BYTES - len(head))


async def wait_for_cluster(admin: AsyncAdmin) -> dict[str, list[str]]:
    """Node ids by kind, once every replica is registered under an id of its own."""
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while True:
        cluster = await admin.cluster()
        ids = {
            kind: sorted(node.node_id for node in nodes) for kind, nodes in cluster.nodes.items()
        }
        if all(len(ids.get(kind, [])) == count for kind, count in NODE_COUNTS.items()):
            return ids
        if time.monotonic() > deadline:
            raise SmokeError(f"registered nodes {ids}, expected counts {NODE_COUNTS}")
        await asyncio.sleep(0.5)


async def take(consumer: AsyncConsumer, count: int) -> list[ReceivedMessage]:
    """``count`` messages (acked), or SmokeError after TRANSFER_WAIT_S."""
    got: list[ReceivedMessage] = []
    deadline = time.monotonic() + TRANSFER_WAIT_S
    while len(got) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SmokeError(f"received {len(got)} of {count} messages")
        try:
            message = await consumer.receive(timeout_s=min(left, 5.0))
        except TimeoutError:
            continue
        consumer.ack(message)
        got.append(message)
    await consumer.flush_acks()
    return got


def check_messages(got: list[ReceivedMessage], what: str, expected: range) -> None:
    """Messages ``expected`` (by index) each once, and each partition's offsets in order."""
    indexes = sorted(int(message.payload[:6]) for message in got)
    if indexes != list(expected):
        missing = sorted(set(expected) - set(indexes))
        raise SmokeError(f"{what}: {len(got)} messages, missing {missing[:10]}..., or doubles")
    if any(message.payload != payload(int(message.payload[:6])) for message in got):
        raise SmokeError(f"{what}: a payload came back changed")
    offsets: dict[str, list[int]] = defaultdict(list)
    for message in got:
        offsets[message.partition].append(message.offset)
    for partition, seen in offsets.items():
        if seen != sorted(seen):
            raise SmokeError(f"{what}: {partition} out of order")


async def wait_for_tiers(admin: AsyncAdmin) -> TopicDescription:
    """The topic once every partition is uploaded to its end and its WAL starts above 0:
    the first offsets now exist only in object storage."""
    deadline = time.monotonic() + TIERS_WAIT_S
    while True:
        topic = await admin.describe_topic(TOPIC)
        done = [
            p.offsets.next_offset is not None
            and p.offsets.uploaded_through == p.offsets.next_offset - 1
            and (p.offsets.wal_start or 0) > 0
            for p in topic.partitions
        ]
        if done and all(done):
            return topic
        if time.monotonic() > deadline:
            shown = [(p.name, p.offsets) for p in topic.partitions]
            raise SmokeError(f"tiers did not move in {TIERS_WAIT_S} s: {shown}")
        await asyncio.sleep(1.0)


async def round_trip(url: str, timings: Timings) -> TopicDescription:
    """Produce, consume, wait for upload and WAL drop, read again from the earliest."""
    async with AsyncDanubeClient(url) as client:
        admin = client.admin
        with timings.step("every replica registered"):
            ids = await wait_for_cluster(admin)
        print(f"compose-smoke: nodes {ids}", flush=True)
        await admin.create_topic(TOPIC, partitions=PARTITIONS)
        live = await client.subscribe(TOPIC, "smoke-live", start="earliest", name="live")
        with timings.step(f"produce {MESSAGES} x {PAYLOAD_BYTES} B"):
            async with client.producer(TOPIC, name="compose-smoke") as producer:
                futures = [await producer.send(payload(i), key=f"k{i}") for i in range(MESSAGES)]
                results = [await future for future in futures]
        if len({result.partition for result in results}) != PARTITIONS:
            raise SmokeError(f"messages went to {len({r.partition for r in results})} partitions")
        with timings.step("consume them"):
            check_messages(await take(live, MESSAGES), "live subscription", range(MESSAGES))
            await live.close()
        with timings.step("uploaded and dropped from the WAL"):
            topic = await wait_for_tiers(admin)
        tiers = ", ".join(
            f"{p.name}: wal from {p.offsets.wal_start}, uploaded through "
            f"{p.offsets.uploaded_through}, owner {p.owner.node_id if p.owner else None}"
            for p in topic.partitions
        )
        print(f"compose-smoke: {tiers}", flush=True)
        with timings.step("read again from the earliest"):
            replay = await client.subscribe(TOPIC, "smoke-replay", start="earliest", name="replay")
            replayed = await take(replay, MESSAGES)
            check_messages(replayed, "replay from earliest", range(MESSAGES))
            firsts = {m.partition: m.offset for m in reversed(replayed)}
            if any(offset != 0 for offset in firsts.values()):
                raise SmokeError(f"replay did not start at offset 0: {firsts}")
            await replay.close()
        return topic


async def after_recreate(url: str, timings: Timings) -> dict[str, str]:
    """After the ingest containers were replaced: the same node ids again, and the live
    subscription gets exactly what is produced next (its cursor survived)."""
    async with AsyncDanubeClient(url) as client:
        with timings.step("every replica registered again"):
            ids = await wait_for_cluster(client.admin)
        if ids["ingest"] != [f"ingest-{n}" for n in range(SCALE["ingest"])]:
            raise SmokeError(f"recreated ingest nodes are {ids['ingest']}")
        more = range(MESSAGES, MESSAGES + AFTER_RECREATE_MESSAGES)
        with timings.step(f"produce and consume {len(more)} more"):
            async with client.producer(TOPIC, name="compose-smoke") as producer:
                futures = [await producer.send(payload(i), key=f"k{i}") for i in more]
                for future in futures:
                    await future
            live = await client.subscribe(TOPIC, "smoke-live", name="live")
            check_messages(await take(live, len(more)), "live after recreate", more)
            await live.close()
        topic = await client.admin.describe_topic(TOPIC)
        return {p.name: p.owner.node_id if p.owner else "none" for p in topic.partitions}


def check_containers(stack: ComposeStack) -> None:
    """Replicas as scaled, every long-running container healthy."""
    for service, count in NODE_COUNTS.items():
        running = [c for c in stack.containers(service) if c.status == "running"]
        if len(running) != count:
            raise SmokeError(f"{service}: {len(running)} containers running, expected {count}")
        for container in running:
            health = container.attrs["State"].get("Health", {}).get("Status")
            if health != "healthy":
                raise SmokeError(f"{container.name} is {health}")


def container_files(container: Container, path: str) -> dict[str, bytes]:
    """The regular files under ``path`` in a container, by their path inside the archive
    (``wal/ingest-0/...``), read through the engine's archive API: no process started in
    the container (a short `docker exec` may lose its output on this engine version)."""
    chunks, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        return {
            member.name: extracted.read()
            for member in tar.getmembers()
            if member.isfile() and (extracted := tar.extractfile(member)) is not None
        }


def metrics_of(container: Container) -> str:
    """A container's /metrics text, at the port its health file names (host network: the
    same loopback address from here)."""
    (health,) = container_files(container, "/run/danube/health.json").values()
    url = json.loads(health)["url"].removesuffix("/readyz") + "/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
    return text


def check_cloud_reads(stack: ComposeStack, topic: TopicDescription) -> int:
    """The replay's offsets below each WAL start came through the cloud readers: the
    messages they served, summed over the replicas."""
    served = 0.0
    for container in stack.containers("cloud_reader"):
        for line in metrics_of(container).splitlines():
            if line.startswith("danube_cloud_reader_messages_total "):
                served += float(line.split()[1])
    below_wal = sum(p.offsets.wal_start or 0 for p in topic.partitions)
    if served < below_wal:
        raise SmokeError(f"cloud readers served {served:.0f} messages, {below_wal} were dropped")
    return int(served)


def check_wal_directories(stack: ComposeStack) -> None:
    """Each ingest replica wrote its WAL under its own node id on the shared volume (once
    it owns a partition: the topic's two went one to each)."""
    directories: set[str] = set()
    for container in stack.containers("ingest"):
        for name in container_files(container, "/var/lib/danube/wal"):
            directories.add(name.split("/")[1])  # wal/<node id>/<topic>/...
    if directories != {f"ingest-{n}" for n in range(SCALE["ingest"])}:
        raise SmokeError(f"WAL directories on the ingest volume: {sorted(directories)}")


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise SmokeTimeout("the compose smoke ran out of time")


def run_async(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` within what is left of the alarm: the event loop would only log an
    exception the alarm raised inside one of its callbacks, so the alarm is paused and the
    loop gets the same deadline as an ``asyncio.timeout``."""
    left_s = signal.alarm(0)
    began = time.monotonic()

    async def bounded() -> _T:
        async with asyncio.timeout(left_s):
            return await coro

    try:
        return asyncio.run(bounded())
    except TimeoutError as exc:
        raise SmokeTimeout("the compose smoke ran out of time") from exc
    finally:
        signal.alarm(max(1, int(left_s - (time.monotonic() - began))))


def run(timeout_s: int, cache_dir: Path, run_dir: Path, *, fresh: bool) -> Timings:
    timings = Timings()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(timeout_s)
    try:
        with Engine(run_dir) as engine:
            client = engine.client
            how = "started here" if engine.started_here else "already running"
            print(f"compose-smoke: docker engine {how}", flush=True)
            with timings.step("base image (debootstrap, docker import)"):
                base = ensure_base_image(client, run_dir, fresh=fresh)
            with timings.step("wheelhouse (pip wheel)"):
                wheels, servers = ensure_wheelhouse(REPO, cache_dir, fresh=fresh)
            with timings.step("mesh image (deploy/Dockerfile)"):
                mesh = build_image(
                    client,
                    mesh_context(REPO, wheels),
                    tag=MESH_IMAGE,
                    dockerfile=MESH_DOCKERFILE,
                    buildargs={"BASE_IMAGE": base, "WHEELS_ONLY": "true"},
                    log_path=run_dir / "build.log",
                    fresh=fresh,
                )
            size_mb = client.images.get(mesh).attrs["Size"] / 1e6
            print(f"compose-smoke: {mesh} is {size_mb:.0f} MB (base {base})", flush=True)
            with timings.step("servers image (nats, etcd, moto)"):
                build_image(
                    client,
                    servers_context(REPO, wheels, servers),
                    tag=SERVERS_IMAGE,
                    dockerfile="Dockerfile",
                    buildargs={"MESH_IMAGE": MESH_IMAGE},
                    log_path=run_dir / "build.log",
                    fresh=fresh,
                )
            ports = {
                name: str(free_port())
                for name in ("NATS", "NATS_MONITOR", "ETCD", "ETCD_PEER", "S3", "API")
            }
            env = {f"LOOPBACK_{name}_PORT": port for name, port in ports.items()}
            env |= {"DANUBE_IMAGE": MESH_IMAGE, "SERVERS_IMAGE": SERVERS_IMAGE}
            stack = ComposeStack(
                client,
                compose_command(),
                project=f"danube-smoke-{os.getpid()}",
                files=COMPOSE_FILES,
                env=env,
                cwd=REPO,
                log_dir=run_dir / "logs",
            )
            try:
                scale = " ".join(f"--scale {s}={n}" for s, n in SCALE.items())
                with timings.step(f"compose up --wait {scale}"):
                    stack.up(scale=SCALE, wait_timeout_s=WAIT_HEALTHY_S)
                check_containers(stack)
                topic = run_async(round_trip(f"http://127.0.0.1:{ports['API']}", timings))
                served = check_cloud_reads(stack, topic)
                print(f"compose-smoke: cloud readers served {served} messages", flush=True)
                check_wal_directories(stack)
                before = {c.name: c.id for c in stack.containers("ingest")}
                with timings.step("compose up --force-recreate ingest (an upgrade)"):
                    stack.recreate("ingest", replicas=SCALE["ingest"], wait_timeout_s=120)
                after = {c.name: c.id for c in stack.containers("ingest")}
                if set(before.values()) & set(after.values()):
                    raise SmokeError(f"ingest containers not replaced: {before} {after}")
                check_containers(stack)
                owners = run_async(after_recreate(f"http://127.0.0.1:{ports['API']}", timings))
                print(f"compose-smoke: owners after recreate {owners}", flush=True)
                check_wal_directories(stack)
            finally:
                with timings.step("compose down -v (and sweep)"):
                    stack.close()
    finally:
        signal.alarm(0)
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout-s", type=int, default=TIMEOUT_S_DEFAULT)
    cache_home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    parser.add_argument("--cache-dir", type=Path, default=cache_home / "danube" / "compose-smoke")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="build the base image, the wheelhouse and both images again, with no cache",
    )
    args = parser.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="danube-compose-smoke-"))
    try:
        timings = run(args.timeout_s, args.cache_dir, run_dir, fresh=args.fresh)
    except (SmokeError, SmokeTimeout) as exc:
        print(f"compose-smoke: FAILED: {exc}\ncompose-smoke: logs in {run_dir}", file=sys.stderr)
        return 1
    except Exception:
        print(f"compose-smoke: FAILED (a bug?); logs in {run_dir}", file=sys.stderr)
        raise
    print(f"compose-smoke: passed\n{timings.summary()}", flush=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
