"""`make compose-smoke`: the real docker-compose.yml, scaled, on this machine, end to end.

Needs root (it may install docker.io, debootstrap and busybox-static, and start dockerd) and
no image registry. It runs the file users run, on the engine's default (bridge) networking:
compose's project network, container DNS names (nats, etcd, s3), the published port of
discovery, the healthchecks and one-shots of the file, and its security (TLS, tokens, the
logins of nats and etcd). What differs from a user's run, and only that: the images are
local stand-ins, passed by the variables the file has (NATS_IMAGE, ETCD_IMAGE, S3_IMAGE,
DANUBE_IMAGE), and tests/compose/smoke.yml adds environment settings (only those: checked
here) that make the tiers move in seconds. Steps, each bounded, all
within ``--timeout-s``:

1. a Docker engine (the running one, else ``dockerd`` started here with its defaults:
   smoke_engine.py);
2. local images: a debootstrap'd Debian base, a wheelhouse, the mesh image from
   deploy/Dockerfile, and stand-ins of nats, etcd and SeaweedFS (smoke_images.py);
3. ``compose up --wait --scale ingest=2 --scale dispatcher=3 --scale cloud_reader=2`` of
   docker-compose.yml + tests/compose/smoke.yml; every container on the project's bridge
   network, every long-running one healthy, the one-shots (security-init, etcd-setup,
   s3-init) exited 0; the CA and the admin token security-init wrote, read out of the
   volume ``secure`` through the discovery container that mounts it;
4. through discovery's published port, over HTTPS verified with that CA and with the admin
   token as ``authorization: Bearer`` on every call: every replica registered under its own
   node id;
   produce keyed messages to a 2-partition topic, consume them all; wait until every
   partition is uploaded and the WAL dropped what it uploaded; read everything again from
   the earliest offset with a new subscription (the dropped part comes from object storage,
   as the cloud readers' /metrics, scraped over HTTPS at their container addresses, show); a
   produce
   with an x-request-id gets it back in the response and finds it as the trace id of log
   lines of discovery and ingest (smoke.yml sets their DANUBE_LOG_LEVEL to debug); each ingest
   replica has its own WAL directory on the shared volume; then both ingest containers are
   recreated (as an upgrade does), come back as the same nodes ingest-0 and ingest-1, and
   the live subscription gets exactly the messages produced after that;
5. ``compose down -v`` and a sweep of anything left by label (containers, volumes, the
   network); dockerd stopped if started here.

Exit 0 with a timing summary, or 1 with what failed; the containers' logs are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import io
import json
import os
import shutil
import signal
import socket
import ssl
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import yaml
from docker.models.containers import Container

from danube.client import AsyncConsumer, AsyncDanubeClient, ReceivedMessage
from danube.client.admin import AsyncAdmin, TopicDescription
from danube.client.tls import ClientTls
from danube.up import free_port

from smoke_engine import ComposeStack, Engine, SmokeError, compose_command
from smoke_images import (
    MESH_DOCKERFILE,
    build_image,
    ensure_base_image,
    ensure_wheelhouse,
    mesh_context,
    standin_context,
)

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
SMOKE_OVERRIDE = REPO / "tests/compose/smoke.yml"
MESH_IMAGE = "danube-mesh:smoke"
# The stand-ins, by the variable of docker-compose.yml that names the image, with their
# stand-in file under tests/compose/standins/.
STANDIN_IMAGES = {
    "NATS_IMAGE": ("danube-standin/nats:smoke", "nats"),
    "ETCD_IMAGE": ("danube-standin/etcd:smoke", "etcd"),
    "S3_IMAGE": ("danube-standin/seaweedfs:smoke", "seaweedfs"),
}
# Published ports of docker-compose.yml, by their variable: the defaults unless taken here.
PUBLISHED_PORTS = {"DANUBE_API_PORT": 8080, "DANUBE_GRPC_PORT": 6650}
METRICS_PORT = 9100  # deploy/config/compose.yml: every service but discovery
SCALE = {"ingest": 2, "dispatcher": 3, "cloud_reader": 2}
BACKING = {"nats": 1, "etcd": 1, "s3": 1}
# The one-shots of docker-compose.yml: each must have run and exited 0.
ONE_SHOTS = ("security-init", "etcd-setup", "s3-init")
# What security-init writes into the volume `secure`, as the mesh containers mount it.
SECURE_DIR = "/run/danube/secure"
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


@dataclass(frozen=True)
class Access:
    """How to reach the secured mesh from this host: discovery's URL (its published port),
    the CA file that verifies every listener's certificate, and the admin's bearer token."""

    url: str
    ca_file: Path
    token: str

    def client(self) -> AsyncDanubeClient:
        return AsyncDanubeClient(self.url, tls=ClientTls(ca_file=self.ca_file), token=self.token)

    def ssl_context(self, *, check_hostname: bool = True) -> ssl.SSLContext:
        """A context that verifies a listener's certificate against the CA; without
        ``check_hostname`` the chain only (a container's bridge address is not one of the
        certificate's names: localhost, 127.0.0.1, discovery, $DANUBE_PUBLIC_HOST)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.check_hostname = check_hostname
        return context


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


async def round_trip(access: Access, timings: Timings) -> TopicDescription:
    """Produce, consume, wait for upload and WAL drop, read again from the earliest."""
    async with access.client() as client:
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


async def after_recreate(access: Access, timings: Timings) -> dict[str, str]:
    """After the ingest containers were replaced: the same node ids again, and the live
    subscription gets exactly what is produced next (its cursor survived)."""
    async with access.client() as client:
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
    """Replicas as scaled, every long-running container healthy (the backing services by
    the healthchecks of docker-compose.yml), every one-shot (the credentials, etcd's
    authentication, the bucket) exited 0."""
    for service in ONE_SHOTS:
        shots = stack.containers(service)
        if len(shots) != 1:
            raise SmokeError(f"{service}: {len(shots)} containers, expected 1")
        exit_code = shots[0].attrs["State"]["ExitCode"]
        if shots[0].status != "exited" or exit_code != 0:
            raise SmokeError(f"{service} is {shots[0].status}, exit code {exit_code}")
    for service, count in {**BACKING, **NODE_COUNTS}.items():
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


def secure_access(stack: ComposeStack, url: str, run_dir: Path) -> Access:
    """The CA certificate and the admin token security-init wrote into the volume
    ``secure``, read through the running discovery container that mounts it (the engine's
    archive API: the one-shot has exited, and a volume is read through a container using
    it); the CA is written to ``run_dir`` for the clients."""
    (discovery,) = stack.containers("discovery")
    ca = container_files(discovery, f"{SECURE_DIR}/pki/ca.pem").get("ca.pem", b"")
    token = container_files(discovery, f"{SECURE_DIR}/admin.token").get("admin.token", b"")
    if b"BEGIN CERTIFICATE" not in ca or not token.strip():
        raise SmokeError(f"no CA certificate or admin token under {SECURE_DIR} of discovery")
    ca_file = run_dir / "danube-ca.pem"
    ca_file.write_bytes(ca)
    return Access(url=url, ca_file=ca_file, token=token.decode().strip())


def check_secured(access: Access) -> None:
    """Discovery is secured as docker-compose.yml says: plain HTTP is not served on its
    port, and a request over HTTPS without a token is refused with 401."""
    plain = access.url.replace("https://", "http://", 1)
    try:
        with urllib.request.urlopen(f"{plain}/v1/cluster", timeout=10) as response:
            raise SmokeError(f"plain HTTP answered {response.status} at {plain}")
    except (OSError, http.client.HTTPException):
        pass  # not answered: TLS only (URLError, a reset, a bad status line)
    request = urllib.request.Request(f"{access.url}/v1/cluster")
    try:
        with urllib.request.urlopen(request, timeout=10, context=access.ssl_context()) as reply:
            raise SmokeError(f"a request without a token got {reply.status}")
    except urllib.error.HTTPError as exc:
        if exc.code != 401:
            raise SmokeError(f"a request without a token got {exc.code}, not 401") from exc


def check_backing_secured(stack: ComposeStack) -> None:
    """nats-server runs with security-init's nats.conf: it asks for a login and refuses a
    client without one (the NATS protocol over a plain socket, at the container's address).
    etcd has authentication on (etcd-setup): etcdctl in the etcd container, with no login,
    gets its endpoint status (the healthcheck) but is refused a read of the mesh's prefix."""
    (nats,) = stack.containers("nats")
    with socket.create_connection((address_of(nats), 4222), timeout=10) as conn:
        stream = conn.makefile("rwb")
        info = stream.readline()
        if not info.startswith(b"INFO ") or not json.loads(info[5:]).get("auth_required"):
            raise SmokeError(f"nats-server asks for no login: {info[:200]!r}")
        stream.write(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        stream.flush()
        answer = stream.readline()
        if b"Authorization Violation" not in answer:
            raise SmokeError(f"nats-server let a client in with no login: {answer[:200]!r}")
    (etcd,) = stack.containers("etcd")
    etcdctl = ["/usr/local/bin/etcdctl", "--endpoints=http://127.0.0.1:2379"]
    status = etcd.exec_run([*etcdctl, "endpoint", "status"])
    if status.exit_code != 0:
        raise SmokeError(f"etcdctl endpoint status exited {status.exit_code}: {status.output!r}")
    read = etcd.exec_run([*etcdctl, "get", "--prefix", "--keys-only", "/danube"])
    if read.exit_code == 0:
        raise SmokeError(f"etcd served a read with no login: {read.output!r}")


def address_of(container: Container) -> str:
    """The container's address on its (one) network: reachable from this host, as any
    address on an engine's bridge is."""
    (network,) = container.attrs["NetworkSettings"]["Networks"].values()
    address: str = network["IPAddress"]
    if not address:
        raise SmokeError(f"{container.name} has no address")
    return address


def metrics_of(container: Container, access: Access) -> str:
    """A mesh container's /metrics text, at its address and the metrics port of
    deploy/config/compose.yml (what Prometheus scrapes in the observability profile), over
    HTTPS: the certificate's chain verified against the CA (not its names)."""
    url = f"https://{address_of(container)}:{METRICS_PORT}/metrics"
    context = access.ssl_context(check_hostname=False)
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        text: str = response.read().decode()
    return text


def check_networks(stack: ComposeStack) -> str:
    """Every container on the project's own network, a bridge of the engine (compose's
    default), none on the host's network; the network's name."""
    expected = f"{stack.project}_default"
    network = stack.client.networks.get(expected)
    if network.attrs["Driver"] != "bridge":
        raise SmokeError(f"{expected} is a {network.attrs['Driver']} network, not a bridge")
    for container in stack.containers():
        mode = container.attrs["HostConfig"]["NetworkMode"]
        names = set(container.attrs["NetworkSettings"]["Networks"])
        if mode == "host" or names != {expected}:
            raise SmokeError(f"{container.name}: network mode {mode}, networks {names}")
    return expected


def check_override(path: Path) -> list[str]:
    """What tests/compose/smoke.yml changes: environment settings of mesh services, and
    nothing else (no image, network, port, command, healthcheck or volume); their names."""
    doc = yaml.safe_load(path.read_text())
    settings: set[str] = set()
    for key, value in doc.items():
        if key.startswith("x-"):
            continue  # an anchor
        if key != "services":
            raise SmokeError(f"{path.name} sets {key!r}: only services' environment is allowed")
        for service, fields in value.items():
            if set(fields) != {"environment"}:
                raise SmokeError(f"{path.name} sets {sorted(fields)} of {service}")
            if not all(name.startswith("DANUBE_") for name in fields["environment"]):
                raise SmokeError(f"{path.name}: {service} gets more than DANUBE_* settings")
            settings |= set(fields["environment"])
    return sorted(settings)


def published_ports() -> dict[str, str]:
    """The port variables to set: none when the file's defaults are free on this machine,
    else free ports for those taken (another mesh may be running here)."""
    env = {}
    for variable, default in PUBLISHED_PORTS.items():
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", default))
            except OSError:
                env[variable] = str(free_port())
    return env


def check_cloud_reads(stack: ComposeStack, topic: TopicDescription, access: Access) -> int:
    """The replay's offsets below each WAL start came through the cloud readers: the
    messages they served, summed over the replicas."""
    served = 0.0
    for container in stack.containers("cloud_reader"):
        for line in metrics_of(container, access).splitlines():
            if line.startswith("danube_cloud_reader_messages_total "):
                served += float(line.split()[1])
    below_wal = sum(p.offsets.wal_start or 0 for p in topic.partitions)
    if served < below_wal:
        raise SmokeError(f"cloud readers served {served:.0f} messages, {below_wal} were dropped")
    return int(served)


def check_trace(stack: ComposeStack, access: Access) -> int:
    """A produce with an ``x-request-id`` through the published port: the id comes back in
    the response header and is the ``trace_id`` of log lines of discovery and of the ingest
    node it reached over the bus (their JSON lines, as ``docker compose logs`` shows them);
    how many lines carry it."""
    trace_id = f"compose-smoke-{os.getpid()}"
    request = urllib.request.Request(
        f"{access.url}/v1/topics/default/compose-smoke-traced/messages",
        data=json.dumps({"messages": [{"payload": "traced"}]}).encode(),
        headers={
            "content-type": "application/json",
            "x-request-id": trace_id,
            "authorization": f"Bearer {access.token}",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30, context=access.ssl_context()) as response:
        echoed = response.headers.get("x-request-id")
    if echoed != trace_id:
        raise SmokeError(f"sent x-request-id {trace_id}, the response has {echoed}")
    marker = f'"trace_id":"{trace_id}"'
    deadline = time.monotonic() + 10.0
    while True:
        found = {
            service: [
                line
                for container in stack.containers(service)
                for line in container.logs().decode(errors="replace").splitlines()
                if marker in line
            ]
            for service in ("discovery", "ingest")
        }
        if all(found.values()):
            return sum(len(lines) for lines in found.values())
        if time.monotonic() > deadline:
            counts = {service: len(lines) for service, lines in found.items()}
            raise SmokeError(f"log lines with trace id {trace_id}: {counts}")
        time.sleep(0.5)


def check_wal_directories(stack: ComposeStack, owners: set[str]) -> list[str]:
    """The ingest replicas keep their WALs on the shared volume, each under its own node id:
    a directory for every partition owner, none but the replicas' ids; the directories."""
    directories: set[str] = set()
    for container in stack.containers("ingest"):
        for name in container_files(container, "/var/lib/danube/wal"):
            directories.add(name.split("/")[1])  # wal/<node id>/<topic>/...
    replicas = {f"ingest-{n}" for n in range(SCALE["ingest"])}
    if not owners <= directories <= replicas:
        raise SmokeError(f"WAL directories {sorted(directories)}, owners {sorted(owners)}")
    return sorted(directories)


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


def run(
    timeout_s: int, cache_dir: Path, run_dir: Path, *, fresh: bool, iptables: bool = True
) -> Timings:
    timings = Timings()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(timeout_s)
    try:
        with Engine(run_dir, iptables=iptables) as engine:
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
            env = {"DANUBE_IMAGE": MESH_IMAGE}
            for variable, (tag, kind) in STANDIN_IMAGES.items():
                with timings.step(f"stand-in {kind} image"):
                    build_image(
                        client,
                        standin_context(REPO, kind, wheels=wheels, requirements=servers),
                        tag=tag,
                        dockerfile="Dockerfile",
                        buildargs={"BASE_IMAGE": base} if kind == "seaweedfs" else {},
                        log_path=run_dir / "build.log",
                        fresh=fresh,
                    )
                env[variable] = tag
            env |= published_ports()
            api_port = env.get("DANUBE_API_PORT", str(PUBLISHED_PORTS["DANUBE_API_PORT"]))
            overridden = check_override(SMOKE_OVERRIDE)
            print(f"compose-smoke: variables {env}", flush=True)
            print(f"compose-smoke: {SMOKE_OVERRIDE.name} sets only {overridden}", flush=True)
            stack = ComposeStack(
                client,
                compose_command(),
                project=f"danube-smoke-{os.getpid()}",
                files=(COMPOSE_FILE, SMOKE_OVERRIDE),
                env=env,
                cwd=REPO,
                log_dir=run_dir / "logs",
            )
            try:
                scale = " ".join(f"--scale {s}={n}" for s, n in SCALE.items())
                with timings.step(f"compose up --wait {scale}"):
                    stack.up(scale=SCALE, wait_timeout_s=WAIT_HEALTHY_S)
                check_containers(stack)
                check_backing_secured(stack)
                print(
                    "compose-smoke: nats-server refuses a client with no login; etcd refuses "
                    "a read with no login (etcdctl in the etcd container)",
                    flush=True,
                )
                network = check_networks(stack)
                print(f"compose-smoke: every container on bridge network {network}", flush=True)
                # The port discovery publishes; its certificate names 127.0.0.1.
                access = secure_access(stack, f"https://127.0.0.1:{api_port}", run_dir)
                check_secured(access)
                print(
                    "compose-smoke: discovery serves HTTPS only and refuses a request "
                    "without a token (401); the admin token and CA come from the volume",
                    flush=True,
                )
                topic = run_async(round_trip(access, timings))
                traced = check_trace(stack, access)
                print(
                    f"compose-smoke: {traced} log lines of discovery and ingest carry the "
                    "produce's x-request-id",
                    flush=True,
                )
                served = check_cloud_reads(stack, topic, access)
                print(f"compose-smoke: cloud readers served {served} messages", flush=True)
                owners = {p.owner.node_id for p in topic.partitions if p.owner is not None}
                wals = check_wal_directories(stack, owners)
                print(f"compose-smoke: WAL directories {wals}, owners {sorted(owners)}", flush=True)
                before = {c.name: c.id for c in stack.containers("ingest")}
                with timings.step("compose up --force-recreate ingest (an upgrade)"):
                    stack.recreate("ingest", replicas=SCALE["ingest"], wait_timeout_s=120)
                after = {c.name: c.id for c in stack.containers("ingest")}
                if set(before.values()) & set(after.values()):
                    raise SmokeError(f"ingest containers not replaced: {before} {after}")
                check_containers(stack)
                check_networks(stack)
                owned = run_async(after_recreate(access, timings))
                print(f"compose-smoke: owners after recreate {owned}", flush=True)
                check_wal_directories(stack, set(owned.values()) - {"none"})
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
    parser.add_argument(
        "--no-iptables",
        action="store_true",
        help="start dockerd (when none runs) with --iptables=false: bridge networking "
        "without the engine's firewall rules, for a machine where they cannot be set",
    )
    args = parser.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="danube-compose-smoke-"))
    try:
        timings = run(
            args.timeout_s, args.cache_dir, run_dir, fresh=args.fresh, iptables=not args.no_iptables
        )
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
