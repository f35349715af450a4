"""The `danube produce|consume|admin|bench` commands, run as the installed console script
against discovery, ingest and a dispatcher in-process on real NATS and etcd: what they
print, what they store, and their exit codes and messages on errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from danube.bus import Bus
from danube.client import AsyncDanubeClient, DeadlineExceededError
from danube.frame import decode_record
from danube.names import TopicName
from danube.routing import partition_for_key
from danube.up import free_port
from danube.wire.ingest.client import IngestClient

pytestmark = pytest.mark.integration

DANUBE = str(Path(sys.executable).parent / "danube")
COMMAND_TIMEOUT_S = 90.0
ONE = {"messages": [{"payload": "x"}]}


async def _danube(*args: str) -> tuple[int, str, str]:
    """Run `danube ARGS`; its exit code, stdout and stderr."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("DANUBE_SERVICE_ADDR", None)
    process = await asyncio.create_subprocess_exec(
        DANUBE,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _url(http: httpx.AsyncClient) -> str:
    return str(http.base_url).rstrip("/")


async def test_produce_1000_then_consume_1000_in_order_and_acked(
    consume_http: httpx.AsyncClient,
) -> None:
    url = _url(consume_http)
    code, out, err = await _danube(
        "produce", "-s", url, "-t", "/default/cli", "-m", "hello", "-c", "1000",
        "-a", "src:cli,n:1", "--key", "k1",
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines() == [f"/default/cli {i}" for i in range(1000)]
    assert "produced 1000 message(s)" in err

    code, out, err = await _danube(
        "consume", "-s", url, "-t", "/default/cli", "-m", "sub", "--start", "earliest",
        "-c", "1000", "--json",
    )  # fmt: skip
    assert code == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    assert [m["offset"] for m in got] == list(range(1000))
    assert {(m["partition"], m["payload"], m["key"], m["redelivery_count"]) for m in got} == {
        ("/default/cli", "hello", "k1", 0)
    }
    # Idempotent (the default) and unnamed: a name of its own.
    (producer,) = {m["producer"] for m in got}
    assert re.fullmatch(r"danube-client-[0-9a-f]{12}", producer), producer
    assert all(m["attributes"] == {"src": "cli", "n": "1"} for m in got)

    # The command acked all 1000 before it detached: the subscription has nothing left.
    async with AsyncDanubeClient(url) as client, client.consumer("/default/cli", "sub") as again:
        with pytest.raises(DeadlineExceededError):
            await again.receive(1.0)


async def test_partitions_key_file_and_text_output(
    consume_http: httpx.AsyncClient, tmp_path: Path
) -> None:
    url = _url(consume_http)
    code, out, err = await _danube(
        "produce", "-s", url, "-t", "/default/parts", "-p", "3", "-m", "x",
        "--key", "user-1", "-c", "5",
    )  # fmt: skip
    assert code == 0, err
    assert "created /default/parts: 3 partitions, reliable" in err
    partition = f"/default/parts-part-{partition_for_key('user-1', 3)}"
    assert out.splitlines() == [f"{partition} {i}" for i in range(5)]

    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes([0xFF, 0x00, 0x01]))
    code, out, err = await _danube("produce", "-s", url, "-t", "blobs", "-f", str(binary))
    assert (code, out) == (0, "/default/blobs 0\n"), err
    code, out, err = await _danube(
        "consume", "-s", url, "-t", "blobs", "-m", "s", "--start", "0", "-c", "1",
        "--mode", "poll",
    )  # fmt: skip
    assert code == 0, err
    assert out == "[/default/blobs@0] <3 bytes, base64> /wAB\n"


async def test_admin_commands(consume_http: httpx.AsyncClient) -> None:
    url = _url(consume_http)
    assert (await _danube("admin", "namespaces", "create", "ops", "-s", url))[0] == 0
    code, out, _ = await _danube("admin", "namespaces", "list", "-s", url, "--json")
    assert code == 0
    assert "ops" in json.loads(out)
    code, out, err = await _danube(
        "admin", "topics", "create", "/ops/jobs", "-p", "2", "--dispatch", "non_reliable",
        "-s", url,
    )  # fmt: skip
    assert (code, out) == (0, "created: /ops/jobs, 2 partitions, non_reliable, fsync\n"), err
    code, out, _ = await _danube("admin", "topics", "list", "ops", "-s", url)
    assert out == "/ops/jobs\n"
    code, out, _ = await _danube("admin", "topics", "lookup", "/ops/jobs", "-s", url, "--json")
    lookup: dict[str, Any] = json.loads(out)
    assert [p["name"] for p in lookup["partitions"]] == ["/ops/jobs-part-0", "/ops/jobs-part-1"]
    code, out, _ = await _danube("admin", "topics", "describe", "/ops/jobs", "-s", url)
    assert code == 0
    assert "/ops/jobs-part-1" in out
    code, _, err = await _danube("admin", "namespaces", "delete", "ops", "-s", url)
    assert code == 1
    assert "namespace_not_empty" in err
    assert (await _danube("admin", "topics", "delete", "/ops/jobs", "-s", url))[0] == 0
    assert (await _danube("admin", "namespaces", "delete", "ops", "-s", url))[0] == 0
    code, out, _ = await _danube("admin", "cluster", "-s", url, "--json")
    assert code == 0
    assert [n["node_id"] for n in json.loads(out)["nodes"]["ingest"]] == ["ingest-1"]


@pytest.mark.parametrize(
    ("args", "exit_code", "says"),
    [
        (["admin", "topics", "describe", "/default/missing"], 1, "topic_not_found"),
        (["produce", "-t", "/nowhere/t", "-m", "x"], 1, "namespace_not_found"),
        (["produce", "-t", "/default/bad.name", "-m", "x"], 2, "invalid_name"),
        (["produce", "-t", "/default/t"], 2, "exactly one of --message and --file"),
        (["consume", "-t", "t", "-m", "s", "--start", "soon"], 2, "--start"),
    ],
)
async def test_expected_errors_are_one_line_and_an_exit_code(
    consume_http: httpx.AsyncClient, args: list[str], exit_code: int, says: str
) -> None:
    code, _, err = await _danube(*args, "-s", _url(consume_http))
    assert code == exit_code, err
    assert says in err
    assert "Traceback" not in err


async def test_an_unreachable_server_is_an_error_not_a_traceback() -> None:
    code, _, err = await _danube("admin", "cluster", "-s", f"http://127.0.0.1:{free_port()}")
    assert code == 1
    assert "cannot reach" in err
    assert "Traceback" not in err


async def test_bench_warmup_reports_the_start_apart(consume_http: httpx.AsyncClient) -> None:
    """--warmup: the messages sent in the first seconds are produced, delivered and counted
    like any, their latencies reported apart (the first lookups and connections)."""
    url = _url(consume_http)
    code, out, err = await _danube(
        "bench", "e2e", "-s", url, "-d", "1.5", "--rate", "400", "--warmup", "0.5",
        "--size", "100", "--json",
    )  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["consumed"] == result["produced"] > 0
    assert result["warmup_s"] == 0.5
    warm, steady = result["warmup_latency_ms"], result["latency_ms"]
    # Paced at 400/s: about a third of the messages were sent in the first half second.
    assert 0.2 < warm["samples"] / result["consumed"] < 0.45, (warm, steady)
    assert warm["samples"] + steady["samples"] == result["consumed"]
    stored = result["produce_latency_ms"]["samples"]
    assert stored + result["warmup_produce_latency_ms"]["samples"] == result["produced"]
    # The first message (its lookup and connections) is the warm-up's.
    assert warm["max"] >= steady["p50"]

    code, out, err = await _danube(
        "bench", "produce", "-s", url, "-d", "1", "--rate", "200", "--warmup", "0.5", "--json"
    )
    assert code == 0, err
    produced = json.loads(out)
    warm, steady = produced["warmup_latency_ms"], produced["latency_ms"]
    assert warm["samples"] + steady["samples"] == produced["messages"]
    assert 0.3 < warm["samples"] / produced["messages"] < 0.7

    code, out, err = await _danube("bench", "produce", "-s", url, "-n", "50", "--json")
    assert code == 0, err
    assert "warmup_latency_ms" not in json.loads(out)  # none asked: none reported


async def test_bench_e2e_json_counts_and_latencies(consume_http: httpx.AsyncClient) -> None:
    url = _url(consume_http)
    code, out, err = await _danube(
        "bench", "e2e", "-s", url, "-d", "2", "--size", "100", "--batch-size", "200", "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    for name in ("msgs_per_s", "mb_per_s", "duration_s", "latency_ms", "produce_latency_ms"):
        assert name in result, result
    assert result["produced"] > 0
    assert result["consumed"] == result["produced"] == result["messages"]
    assert (result["duplicates"], result["errors"]) == (0, 0)
    assert result["bytes"] == result["messages"] * 100
    latency = result["latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["p999"] <= latency["max"]
    assert latency["samples"] == result["consumed"]
    assert result["msgs_per_s"] == pytest.approx(
        result["messages"] / result["duration_s"], rel=0.01
    )

    code, out, err = await _danube("bench", "produce", "-s", url, "-n", "3000", "--json")
    assert code == 0, err
    produced = json.loads(out)
    assert (produced["messages"], produced["errors"]) == (3000, 0)
    assert produced["latency_ms"]["samples"] == 3000
    code, out, err = await _danube(
        "bench", "produce", "-s", url, "-n", "2500", "--batch-size", "1000", "--send-many",
        "--json",
    )  # fmt: skip
    assert code == 0, err
    grouped = json.loads(out)
    assert (grouped["messages"], grouped["errors"]) == (2500, 0)  # groups of 1000, 1000, 500
    assert grouped["latency_ms"]["samples"] == 2500

    # --sync: a closed loop, each message stored before the next is sent, so no message
    # waits behind another: one takes at least its own latency (flat out, a queue forms).
    code, out, err = await _danube(
        "bench", "produce", "-s", url, "-n", "300", "--batch-size", "1", "--linger-ms", "0",
        "--sync", "--json",
    )  # fmt: skip
    assert code == 0, err
    closed = json.loads(out)
    assert (closed["messages"], closed["errors"], closed["sync"]) == (300, 0, True)
    per_message_ms = closed["duration_s"] * 1000 / closed["messages"]
    assert per_message_ms >= 0.9 * closed["latency_ms"]["p50"]
    code, _, err = await _danube("bench", "produce", "-s", url, "--sync", "--send-many")
    assert code == 2
    assert "--sync" in err

    code, out, err = await _danube(
        "bench", "consume", "-s", url, "-n", "2000", "--mode", "poll", "--json"
    )
    assert code == 0, err
    consumed = json.loads(out)
    assert (consumed["messages"], consumed["bytes"]) == (2000, 2000 * 1024)
    assert consumed["msgs_per_s"] > 0


# Runs a command with SIGINT as a terminal's foreground job has it: a test run started in the
# background (a non-interactive shell's `&`) ignores SIGINT, and children inherit that.
WITH_DEFAULT_SIGINT = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
)


async def test_ctrl_c_stops_consume_after_acking_what_it_printed(
    consume_http: httpx.AsyncClient,
) -> None:
    url = _url(consume_http)
    process = await asyncio.create_subprocess_exec(
        *WITH_DEFAULT_SIGINT, DANUBE,
        "consume", "-s", url, "-t", "tail", "-m", "s", "--start", "earliest",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            assert "consuming /default/tail" in (await process.stderr.readline()).decode()
            async with AsyncDanubeClient(url) as client, client.producer("tail") as producer:
                for i in range(3):
                    await producer.send(f"t{i}")
            lines = [(await process.stdout.readline()).decode() for _ in range(3)]
            process.send_signal(signal.SIGINT)
            # Drain both pipes while waiting: a bare wait() deadlocks once the command has
            # written a pipe buffer's worth (64 KiB) to stderr that nobody reads, e.g. retry
            # warnings on a busy machine, and the test then times out on a healthy command.
            _, err_bytes = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    err = err_bytes.decode()
    assert lines == [f"[/default/tail@{i}] t{i}\n" for i in range(3)]
    assert process.returncode == 130, err
    assert "Traceback" not in err
    async with AsyncDanubeClient(url) as client, client.consumer("tail", "s") as again:
        with pytest.raises(DeadlineExceededError):
            await again.receive(1.0)


async def test_admin_subscriptions_list_seek_delete(consume_http: httpx.AsyncClient) -> None:
    url = _url(consume_http)
    assert (await _danube("produce", "-s", url, "-t", "subs", "-m", "x", "-c", "3", "-q"))[0] == 0
    code, _, err = await _danube(
        "consume", "-s", url, "-t", "subs", "-m", "s", "--start", "earliest", "-c", "3",
        "--no-ack",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = await _danube("admin", "subscriptions", "list", "subs", "-s", url, "--json")
    assert code == 0, err
    (sub,) = json.loads(out)
    assert (sub["name"], sub["type"], sub["backlog"], sub["consumers"]) == ("s", "exclusive", 3, [])

    code, out, err = await _danube(
        "admin", "subscriptions", "seek", "subs", "s", "--to", "latest", "-s", url
    )
    assert (code, out) == (0, "/default/subs 3\n"), err
    code, out, _ = await _danube("admin", "subscriptions", "list", "subs", "-s", url, "--json")
    assert json.loads(out)[0]["backlog"] == 0

    assert (await _danube("admin", "subscriptions", "delete", "subs", "s", "-s", url))[0] == 0
    code, _, err = await _danube("admin", "subscriptions", "delete", "subs", "s", "-s", url)
    assert code == 1
    assert "subscription_not_found" in err


async def test_produce_with_an_exclusive_session_and_list_producers(
    consume_http: httpx.AsyncClient,
) -> None:
    url, topic = _url(consume_http), "/default/excl"
    async with (
        AsyncDanubeClient(url) as client,
        client.producer(topic, name="holder", access_mode="exclusive") as holder,
    ):
        assert (await holder.send_and_wait("first")).offset == 0
        # The SDK producer holds the topic: the command is refused, and so is a bare produce.
        code, _, err = await _danube(
            "produce", "-s", url, "-t", topic, "-m", "x", "--access-mode", "exclusive"
        )
        assert code == 1
        assert "exclusive_producer" in err
        fenced = await consume_http.post("/v1/topics/default/excl/messages", json=ONE)
        assert (fenced.status_code, fenced.json()["error"]["code"]) == (409, "producer_fenced")

        code, out, err = await _danube("admin", "topics", "producers", topic, "-s", url, "--json")
        assert code == 0, err
        listed = json.loads(out)
        assert [(p["producer_id"], p["name"], p["access_mode"]) for p in listed] == [
            (holder.producer_id, "holder", "exclusive")
        ]
    # Closed with the producer: the command now takes the topic, and lets it go at the end.
    code, out, err = await _danube(
        "produce", "-s", url, "-t", topic, "-m", "x", "-c", "3", "--access-mode", "exclusive",
    )  # fmt: skip
    assert code == 0, err
    assert out.splitlines() == [f"{topic} {i}" for i in range(1, 4)]
    assert "producer session" in err
    assert (await consume_http.get("/v1/topics/default/excl/producers")).json() == {"producers": []}


async def test_consume_key_shared_with_key_filters(consume_http: httpx.AsyncClient) -> None:
    url = _url(consume_http)
    messages = [{"payload": f"m{i}", "key": ("user-1", "order-1")[i % 2]} for i in range(6)]
    produced = await consume_http.post(
        "/v1/topics/default/ks-cli/messages", json={"messages": messages}
    )
    assert produced.status_code == 200, produced.text
    code, out, err = await _danube(
        "consume", "-s", url, "-t", "/default/ks-cli", "-m", "ks", "--start", "earliest",
        "--sub-type", "key-shared", "--key-filter", "user-*", "--key-filter", "eu-?",
        "-c", "3", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert "(key_shared," in err
    got = [json.loads(line) for line in out.splitlines()]
    assert [(m["offset"], m["key"]) for m in got] == [(0, "user-1"), (2, "user-1"), (4, "user-1")]
    listed = await consume_http.get("/v1/topics/default/ks-cli/subscriptions")
    assert [s["type"] for s in listed.json()["subscriptions"]] == ["key_shared"]

    code, _, err = await _danube(
        "consume", "-s", url, "-t", "/default/ks-cli", "-m", "other", "--key-filter", "a*",
    )  # fmt: skip
    assert code != 0
    assert "--key-filter needs --sub-type key-shared" in err


async def test_produce_is_idempotent_unless_told_not_to(
    consume_http: httpx.AsyncClient, consume_bus: Bus
) -> None:
    url = _url(consume_http)
    for topic, flags in (("/default/cli-idem", ()), ("/default/cli-plain", ("--no-idempotent",))):
        code, _, err = await _danube(
            "produce", "-s", url, "-t", topic, "-m", "m", "-c", "3", *flags
        )
        assert code == 0, err
    ingest = IngestClient(consume_bus)
    idem = await ingest.fetch(TopicName.parse("/default/cli-idem"), 0)
    plain = await ingest.fetch(TopicName.parse("/default/cli-plain"), 0)
    stored = [decode_record(frame.payload) for frame in idem.frames]
    assert [(r.sequence, r.producer_epoch) for r in stored] == [(0, 0), (1, 0), (2, 0)]
    stored = [decode_record(frame.payload) for frame in plain.frames]
    assert [(r.sequence, r.producer) for r in stored] == [(None, "danube-cli")] * 3


async def test_produce_compressed_and_consume_it_back(
    consume_http: httpx.AsyncClient, consume_bus: Bus, tmp_path: Path
) -> None:
    url = _url(consume_http)
    line = json.dumps({"level": "INFO", "message": "checkout ok " * 80}).encode()
    (tmp_path / "line.json").write_bytes(line)
    for codec in ("zstd", "lz4"):
        topic = f"/default/cli-{codec}"
        code, _, err = await _danube(
            "produce", "-s", url, "-t", topic, "-f", str(tmp_path / "line.json"), "-c", "2",
            "--compression", codec,
        )  # fmt: skip
        assert code == 0, err
        fetched = await IngestClient(consume_bus).fetch(TopicName.parse(topic), 0)
        stored = [decode_record(frame.payload) for frame in fetched.frames]
        assert [(r.payload, r.compression) for r in stored] == [(line, codec)] * 2
        assert all(len(frame.payload) < len(line) / 4 for frame in fetched.frames)
    code, out, err = await _danube(
        "consume", "-s", url, "-t", "/default/cli-lz4", "-m", "cli-c", "--start", "earliest",
        "-c", "2", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert [json.loads(row)["payload"] for row in out.splitlines()] == [line.decode()] * 2
    code, _, err = await _danube(
        "produce", "-s", url, "-t", "/default/cli-x", "-m", "m", "--compression", "gzip"
    )
    assert code != 0
    assert "gzip" in err
