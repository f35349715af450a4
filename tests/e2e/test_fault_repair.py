"""Fault: one byte flipped in the leader's copy of a sealed, not yet uploaded WAL segment at
factor 3 / min in-sync 2 (three ingest processes, the whole mesh, fs object storage):
consumers read every message past it from an intact copy, the uploader uploads past it
(every offset in the objects, contents checked), and the damaged copy is repaired from a
follower's until its segment file is byte for byte the followers' (the damaged leader
hands leadership to an intact replica first)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_fault_damage import _attach, _consume, _flip, _metric, _offsets, _payload, _produce

from danube.bus import TopicName
from danube.frame import Record, decode_frames, decode_record, encode_record
from danube.meta import MetaStore
from danube.up import ServerProcess
from tests.walfiles import frames_end

from replication import Cluster, connect, fetch_served, leader, new_leader, wait_isr

ServiceFactory = Callable[..., ServerProcess]

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(120)]

COUNT = 3000
SEGMENT_BYTES = 64 * 1024  # about 290 messages per segment
TOPIC = "repairflip"


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs",
        "DANUBE_WAL_CLOUD__CLOUD__ROOT": str(tmp_path / "objects"),
        "DANUBE_WAL_CLOUD__UPLOADER__INTERVAL_SECONDS": "1",
        "DANUBE_WAL_CLOUD__WAL__ROTATION__MAX_BYTES": str(SEGMENT_BYTES),
        "DANUBE_WAL_CLOUD__WAL__CACHE_CAPACITY": "0",  # every read from the files
    }


def _segments(tmp_path: Path, node: str) -> list[Path]:
    return sorted((tmp_path / "wal" / node / "default" / TOPIC).glob("*.wal"))


def _framed(path: Path) -> bytes:
    """A segment file's bytes up to where its frames end (the open one goes on in the zeros
    it is allocated ahead with, as far as each copy's writes took it)."""
    data = path.read_bytes()
    return data[: frames_end(data)]


def _wait(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _readers(services: ServiceFactory, env: dict[str, str]) -> ServerProcess:
    """A cloud reader and a dispatcher, then discovery (returned)."""
    for kind, node in (("cloud_reader", "cloud-0"), ("dispatcher", "disp-0")):
        services(kind, node, **env)
    return services("discovery", "disc-0", **env)


def _produced_in_sync(http: httpx.Client) -> Any:
    """Produce COUNT messages; the partition's offsets once every replica holds them all."""
    _produce(http, TOPIC)
    return _wait(
        "every replica in sync at the end",
        lambda: (o := _offsets(http, TOPIC))["next_offset"] == COUNT and len(o["isr"]) == 3 and o,
    )


def _object_payloads(tmp_path: Path) -> dict[int, str]:
    """offset -> payload of every frame of every object of the topic (CRC-checked)."""
    found: dict[int, str] = {}
    for path in sorted((tmp_path / "objects").rglob("*.dnb")):
        if f"/{TOPIC}/" not in str(path):
            continue
        frames, consumed = decode_frames(path.read_bytes())
        assert consumed == path.stat().st_size, path
        for frame in frames:
            assert frame.offset not in found, f"offset {frame.offset} in two objects"
            found[frame.offset] = decode_record(frame.payload).payload.decode()
    return found


def test_a_damaged_leader_copy_is_read_around_uploaded_past_and_repaired(
    cluster: Callable[..., Cluster], services: ServiceFactory, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    nodes = cluster(3, factor=3, min_insync=2, **env)
    discovery = _readers(services, env)
    with httpx.Client(base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=30) as http:
        offsets = _produced_in_sync(http)
        described = http.get(f"/v1/topics/default/{TOPIC}").json()["partitions"][0]
        leader = described["owner"]["node_id"]
        followers = [n for n in offsets["replicas"] if n != leader]
        # The copies are alike file for file (the same frames, rotated at the same sizes).
        names = [p.name for p in _segments(tmp_path, leader)]
        assert len(names) > 4, names
        for node in followers:
            assert [p.name for p in _segments(tmp_path, node)] == names
        damaged = _flip(_segments(tmp_path, leader), 1500)
        assert damaged != _segments(tmp_path, leader)[-1]  # sealed: a later one exists
        intact = [tmp_path / "wal" / node / "default" / TOPIC / damaged.name for node in followers]
        assert intact[0].read_bytes() == intact[1].read_bytes() != damaged.read_bytes()

        # Readers and the uploader read around it; the leader repairs its copy.
        services("uploader", "uploader-0", **env)
        consumer = _attach(http, TOPIC, "s")
        got, error = _consume(http, consumer, COUNT - 1, timeout_s=40)
        assert error is None, error.text
        assert got == list(range(COUNT))  # every message once, in order, contents checked
        _wait(
            "the upload of every offset",
            lambda: _offsets(http, TOPIC)["uploaded_through"] == COUNT - 1,
        )
        assert _offsets(http, TOPIC)["upload_damaged"] is None
        objects = _object_payloads(tmp_path)
        assert sorted(objects) == list(range(COUNT))
        assert all(objects[offset] == _payload(offset) for offset in range(COUNT))

        _wait(
            "the damaged copy repaired",
            lambda: damaged.read_bytes() == intact[0].read_bytes(),
            timeout_s=20,
        )
        for node in [leader, *followers]:  # every copy of every segment alike
            copies = {p.name: _framed(p) for p in _segments(tmp_path, node)}
            assert copies == {p.name: _framed(p) for p in _segments(tmp_path, leader)}
        # The damaged leader handed leadership to an intact replica before it repaired.
        logged = nodes.processes[leader].tail_log(1_000_000)
        assert "this copy is damaged at offset 1500; handing leadership to" in logged
        metrics = nodes.processes[leader]
        repaired = _metric(metrics, "danube_ingest_damaged_ranges_repaired_total")
        around = _metric(metrics, "danube_ingest_reads_around_damage_total")
        assert repaired == "danube_ingest_damaged_ranges_repaired_total 1.0", repaired
        assert float(around.split()[-1]) >= 1, around
        print(f"leader {leader}: {damaged.name} repaired; {repaired}; {around}")


async def test_a_damaged_copy_repairs_from_the_leader_before_it_leads_again(
    cluster: Callable[..., Cluster], nats_url: str, store: MetaStore, tmp_path: Path
) -> None:
    """The preferred leader stops; its copy of a sealed segment is damaged while it is down,
    with the damage kept in its ``damaged.json`` (as when a node is killed after a read found
    the damage and before it repaired). Restarted, it repairs that segment from the new
    leader's copy until it is byte for byte the leader's, and only then gets leadership back
    (by the preferred-leader transfer, which never picks a damaged copy)."""
    # The preferred leader gets leadership back 0.2 s after it is ready (not 2 s): shorter.
    settle = {"DANUBE_INGEST__PREFERRED_LEADER_SETTLE_S": "0.2"}
    nodes = cluster(3, factor=3, min_insync=2, **_env(tmp_path), **settle)
    partition = TopicName("default", TOPIC)
    bus, client = await connect(nats_url, "repair-follower")
    try:
        for first in range(0, COUNT, 100):
            records = [
                encode_record(Record(payload=_payload(i).encode(), publish_time_ms=1, producer="t"))
                for i in range(first, first + 100)
            ]
            offset = await client.produce(partition, records, timeout_s=20)
            assert offset == first
        await wait_isr(store, partition, 3)
        owner = await leader(store, partition)
        preferred = owner.node_id  # the first leader is the placement's preferred one
        await asyncio.to_thread(nodes.processes[preferred].stop)  # hands leadership over
        elected = await new_leader(store, partition, owner.epoch)
        assert elected.node_id != preferred
        damaged = _flip(_segments(tmp_path, preferred), 1500)
        assert damaged != _segments(tmp_path, preferred)[-1]
        (damaged.parent / "damaged.json").write_text('{"version": 1, "offsets": [1500]}')
        intact = tmp_path / "wal" / elected.node_id / "default" / TOPIC / damaged.name
        assert damaged.read_bytes() != intact.read_bytes()

        process = await asyncio.to_thread(nodes.start, preferred)
        async with asyncio.timeout(30):
            while True:  # repaired first, then led again
                repaired = damaged.read_bytes() == intact.read_bytes()
                if repaired and (await leader(store, partition)).node_id == preferred:
                    break
                await asyncio.sleep(0.1)
        assert not (damaged.parent / "damaged.json").exists()
        # The node logs its term just after etcd records it: wait for the line, then read.
        async with asyncio.timeout(10):
            while True:
                logged = process.tail_log(1_000_000)
                if "leading epoch" in logged:
                    break
                await asyncio.sleep(0.05)
        repaired_at = logged.index("repaired offsets 1500..")
        assert "from " + elected.node_id in logged[repaired_at : repaired_at + 200]
        assert logged.index("leading epoch") > repaired_at  # not led while damaged
        whole: list[tuple[int, str]] = []
        offset = 0
        while offset < COUNT:
            # The owner key named it a moment before it serves the partition's subjects.
            reply = await fetch_served(client, partition, offset)
            whole += [(f.offset, decode_record(f.payload).payload.decode()) for f in reply.frames]
            offset = reply.next_offset
        assert whole == [(i, _payload(i)) for i in range(COUNT)]
    finally:
        await bus.close()


def test_damage_in_every_copy_is_said_naming_every_copy(
    cluster: Callable[..., Cluster], services: ServiceFactory, tmp_path: Path
) -> None:
    """The same offset flipped in all three copies (nothing uploaded): reads stop at it with
    data_damaged naming each copy's file, i.e. only once every copy was tried; everything
    before it is delivered."""
    env = _env(tmp_path)
    cluster(3, factor=3, min_insync=2, **env)
    discovery = _readers(services, env)
    with httpx.Client(base_url=f"http://127.0.0.1:{discovery.spec.port}", timeout=30) as http:
        offsets = _produced_in_sync(http)
        flipped = {node: _flip(_segments(tmp_path, node), 1500) for node in offsets["replicas"]}
        consumer = _attach(http, TOPIC, "s")
        got, error = _consume(http, consumer, COUNT - 1, timeout_s=30)
        assert got == list(range(1500))  # in order, contents checked, up to the damage
        assert error is not None
        assert error.status_code == 500, error.text
        body = error.json()["error"]
        assert body["code"] == "data_damaged"
        assert "offsets 1500.." in body["message"], body["message"]
        named = body["message"].split(" in every copy (")[1].split(")")[0].split(", ")
        assert sorted(named) == sorted(f"{n}/{p.name}" for n, p in flipped.items())
        print(body["message"])
