"""Fault: flipped bytes in real files under real processes (ingest, uploader, cloud_reader,
dispatcher, discovery; fs object storage): a damaged WAL segment or object is read from the
other tier, every message delivered in order; damage in both tiers is an explicit
data_damaged error (one log line, one metric) until the operator skips it; a segment damaged
before upload has its good prefix uploaded and its damaged range reported, then skipped."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.bus import Bus, TopicName
from danube.config import BusConfig
from danube.frame import FRAME_HEADER
from danube.up import ServerProcess
from danube.wire.ingest.client import IngestClient
from tests.walfiles import frames_end

from meshrun import DANUBE

ServiceFactory = Callable[..., ServerProcess]  # the services fixture of tests/e2e/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.fault, pytest.mark.timeout(120)]

COUNT = 3000
BATCH = 500
SEGMENT_BYTES = 64 * 1024  # about 290 messages per segment: many sealed segments
_HEADER = FRAME_HEADER  # a frame's [u64 offset][u32 len][u32 crc32c]


def _payload(i: int) -> str:
    return f"m-{i:05d}-" + "x" * 200


def _mesh(services: ServiceFactory, tmp_path: Path, *, uploader: bool = True) -> dict[str, Any]:
    """The mesh on fs object storage; no WAL cache, so every read comes from the files."""
    env = {
        "DANUBE_WAL_CLOUD__CLOUD__BACKEND": "fs",
        "DANUBE_WAL_CLOUD__CLOUD__ROOT": str(tmp_path / "objects"),
        "DANUBE_WAL_CLOUD__UPLOADER__INTERVAL_SECONDS": "1",
        "DANUBE_WAL_CLOUD__WAL__ROTATION__MAX_BYTES": str(SEGMENT_BYTES),
        "DANUBE_WAL_CLOUD__WAL__CACHE_CAPACITY": "0",
    }
    mesh = {
        "env": env,
        "ingest": services("ingest", "ingest-0", **env),
        "cloud_reader": services("cloud_reader", "cloud-0", **env),
        "dispatcher": services("dispatcher", "disp-0", **env),
        "discovery": services("discovery", "disc-0", **env),
    }
    if uploader:
        mesh["uploader"] = services("uploader", "uploader-0", **env)
    return mesh


def _produce(http: httpx.Client, topic: str) -> None:
    for first in range(0, COUNT, BATCH):
        messages = [{"payload": _payload(i)} for i in range(first, first + BATCH)]
        answer = http.post(f"/v1/topics/default/{topic}/messages", json={"messages": messages})
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"][0]["offset"] == first


def _offsets(http: httpx.Client, topic: str) -> dict[str, Any]:
    found = http.get(f"/v1/topics/default/{topic}")
    assert found.status_code == 200, found.text
    offsets: dict[str, Any] = found.json()["partitions"][0]["offsets"]
    return offsets


def _wait_uploaded(http: httpx.Client, topic: str, through: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while _offsets(http, topic)["uploaded_through"] != through:
        assert time.monotonic() < deadline, _offsets(http, topic)
        time.sleep(0.2)


def _frames(path: Path) -> dict[int, tuple[int, int]]:
    """offset -> (byte position, payload length) of every frame of a segment or object."""
    data = path.read_bytes()
    end = frames_end(data)  # an open segment goes on in zeros
    found, position = {}, 0
    while position + _HEADER.size <= end:
        offset, length, _crc = _HEADER.unpack_from(data, position)
        found[offset] = (position, length)
        position += _HEADER.size + length
    return found


def _flip(files: list[Path], offset: int) -> Path:
    """Flip one payload byte of the frame of ``offset`` in whichever file holds it."""
    for path in files:
        frames = _frames(path)
        if offset in frames:
            position, length = frames[offset]
            with path.open("r+b") as file:
                file.seek(position + _HEADER.size + length // 2)
                byte = file.read(1)
                file.seek(-1, 1)
                file.write(bytes([byte[0] ^ 0xFF]))
            return path
    raise AssertionError(f"no file holds offset {offset}")


def _segments(tmp_path: Path, topic: str) -> list[Path]:
    return sorted((tmp_path / "wal" / "ingest-0" / "default" / topic).glob("*.wal"))


def _objects(tmp_path: Path, topic: str) -> list[Path]:
    return sorted(p for p in (tmp_path / "objects").rglob("*.dnb") if f"/{topic}/" in str(p))


def _attach(http: httpx.Client, topic: str, sub: str) -> str:
    body = {"name": "c", "type": "exclusive", "start": "earliest"}
    answer = http.post(f"/v1/topics/default/{topic}/subscriptions/{sub}/consumers", json=body)
    assert answer.status_code in (200, 201), answer.text
    consumer: str = answer.json()["consumer_id"]
    return consumer


def _consume(
    http: httpx.Client, consumer: str, until: int, timeout_s: float = 20
) -> tuple[list[int], httpx.Response | None]:
    """Offsets delivered (acked as they come) until ``until`` is reached, or the first
    error answer."""
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while (not got or got[-1] < until) and time.monotonic() < deadline:
        answer = http.get(
            f"/v1/consumers/{consumer}/messages", params={"max": 1000, "wait_ms": 500}
        )
        if answer.status_code != 200:
            return got, answer
        messages = answer.json()["messages"]
        for message in messages:
            assert message["payload"] == _payload(message["offset"])
        got += [m["offset"] for m in messages]
        if messages:
            refs = [{"partition": m["partition"], "offset": m["offset"]} for m in messages]
            acked = http.post(f"/v1/consumers/{consumer}/ack", json={"messages": refs})
            assert acked.status_code in (200, 204), acked.text
    return got, None


def _metric(process: ServerProcess, line: str) -> str:
    text = httpx.get(f"http://127.0.0.1:{process.spec.port}/metrics").text
    found = [row for row in text.splitlines() if row.startswith(line)]
    return found[0] if found else ""


async def _drop_below(nats_url: str, topic: str, offset: int) -> int:
    bus = await Bus.connect(BusConfig(servers=[nats_url]), name="damage-test")
    try:
        _removed, wal_start = await IngestClient(bus).drop_below(
            TopicName("default", topic), offset
        )
        return wal_start
    finally:
        await bus.close()


def test_a_damaged_wal_segment_is_read_from_its_object(
    services: ServiceFactory, tmp_path: Path
) -> None:
    mesh = _mesh(services, tmp_path)
    with httpx.Client(
        base_url=f"http://127.0.0.1:{mesh['discovery'].spec.port}", timeout=30
    ) as http:
        _produce(http, "walflip")
        _wait_uploaded(http, "walflip", COUNT - 1)
        damaged = _flip(_segments(tmp_path, "walflip"), 1500)
        consumer = _attach(http, "walflip", "s")
        got, error = _consume(http, consumer, COUNT - 1)
        assert error is None, error.text
        assert got == list(range(COUNT))  # every message once, in order
        from_cloud = _metric(
            mesh["dispatcher"], 'danube_dispatcher_read_messages_total{tier="cloud"}'
        )
        print(f"{len(got)} delivered; segment {damaged.name} damaged; {from_cloud}")
        assert float(from_cloud.split()[-1]) > 0


def test_a_damaged_object_is_read_from_the_wal(
    services: ServiceFactory, tmp_path: Path, nats_url: str
) -> None:
    mesh = _mesh(services, tmp_path)
    with httpx.Client(
        base_url=f"http://127.0.0.1:{mesh['discovery'].spec.port}", timeout=30
    ) as http:
        _produce(http, "objflip")
        _wait_uploaded(http, "objflip", COUNT - 1)
        wal_start = asyncio.run(_drop_below(nats_url, "objflip", 1200))
        assert 0 < wal_start <= 1200
        # Inside the cloud tier's first read (from 0, 1000 messages) but held by the WAL.
        damaged = _flip(_objects(tmp_path, "objflip"), wal_start + 5)
        consumer = _attach(http, "objflip", "s")
        got, error = _consume(http, consumer, COUNT - 1)
        assert error is None, error.text
        assert got == list(range(COUNT))
        print(f"{len(got)} delivered; WAL from {wal_start}; object {damaged.name} damaged")


def test_damage_in_both_tiers_is_an_explicit_error_until_skipped(
    services: ServiceFactory, tmp_path: Path
) -> None:
    mesh = _mesh(services, tmp_path)
    url = f"http://127.0.0.1:{mesh['discovery'].spec.port}"
    with httpx.Client(base_url=url, timeout=30) as http:
        _produce(http, "bothflip")
        _wait_uploaded(http, "bothflip", COUNT - 1)
        segment = _flip(_segments(tmp_path, "bothflip"), 1500)
        obj = _flip(_objects(tmp_path, "bothflip"), 1500)
        consumer = _attach(http, "bothflip", "s")
        got, error = _consume(http, consumer, COUNT - 1)
        assert got == list(range(1500))
        assert error is not None
        assert error.status_code == 500, error.text
        body = error.json()["error"]
        assert body["code"] == "data_damaged"
        for part in ("/default/bothflip", "offsets 1500..", segment.name, obj.name):
            assert part in body["message"], body["message"]
        for _ in range(5):  # asking again says the same, and says it in the log only once
            again = http.get(f"/v1/consumers/{consumer}/messages", params={"wait_ms": 500})
            assert again.status_code == 500
            assert again.json()["error"]["code"] == "data_damaged"
            time.sleep(0.3)
        dispatcher = mesh["dispatcher"]
        assert dispatcher.tail_log(1_000_000).count("damaged in every copy") == 1
        assert _metric(dispatcher, "danube_dispatcher_damaged_ranges_total") == (
            "danube_dispatcher_damaged_ranges_total 1.0"
        )
        described = http.get("/v1/topics/default/bothflip/subscriptions").json()
        assert "1500" in str(described), described

        skip = subprocess.run(
            [
                DANUBE,
                "admin",
                "subscriptions",
                "skip",
                "/default/bothflip",
                "s",
                "--service-addr",
                url,
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert skip.returncode == 0, skip.stderr
        print(skip.stdout.strip())
        resume = int(json.loads(skip.stdout)["to_offset"])
        assert 1500 < resume < COUNT
        rest, error = _consume(http, consumer, COUNT - 1)
        assert error is None, error.text
        assert rest == list(range(resume, COUNT))
        print(
            f"{len(got) + len(rest)} delivered, {resume - 1500} skipped",
            f"({segment.name}, {obj.name})",
        )


def test_a_segment_damaged_before_upload_uploads_its_good_prefix(
    services: ServiceFactory, tmp_path: Path
) -> None:
    mesh = _mesh(services, tmp_path, uploader=False)
    with httpx.Client(
        base_url=f"http://127.0.0.1:{mesh['discovery'].spec.port}", timeout=30
    ) as http:
        _produce(http, "preflip")
        segments = _segments(tmp_path, "preflip")
        damaged = _flip(segments, 1000)
        following = segments[segments.index(damaged) + 1]
        segment_end = int(following.name.split(".")[0])
        uploader = services("uploader", "uploader-0", **mesh["env"])
        deadline = time.monotonic() + 20
        while _offsets(http, "preflip").get("upload_damaged") is None:
            assert time.monotonic() < deadline, _offsets(http, "preflip")
            time.sleep(0.2)
        offsets = _offsets(http, "preflip")
        assert offsets["uploaded_through"] == 999  # everything before the damage
        assert offsets["upload_damaged"] == {
            "from_offset": 1000,
            "to_offset": segment_end,
            "file": damaged.name,
        }
        time.sleep(2.5)  # two more upload intervals: still reported once
        assert uploader.tail_log(1_000_000).count("uploads stop at offset 1000") == 1
        assert _metric(uploader, "danube_uploader_damaged_ranges_total") == (
            "danube_uploader_damaged_ranges_total 1.0"
        )
        assert _offsets(http, "preflip")["uploaded_through"] == 999

        skipped = http.post("/v1/partitions/default/preflip/uploads/skip", json={})
        assert skipped.status_code == 200, skipped.text
        assert skipped.json()["skipped"] == segment_end - 1000
        _wait_uploaded(http, "preflip", COUNT - 1)
        offsets = _offsets(http, "preflip")
        assert offsets["upload_damaged"] is None
        assert offsets["upload_skipped_offsets"] == segment_end - 1000
        print(f"uploaded 0..999 and {segment_end}..{COUNT - 1}; skipped 1000..{segment_end - 1}")
