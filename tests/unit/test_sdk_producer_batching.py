"""The producer's per-batch bookkeeping (send_many, the bound on pending messages, flush) over
a fake transport, and the lean HTTP/1.1 client of its posts against a small local server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import orjson
import pytest

from danube.client import AsyncDanubeClient, NotFoundError, RetryPolicy
from danube.client._http import HttpCore
from danube.client.errors import TransportError
from danube.frame.produce import scan_frames_for_produce

pytestmark = pytest.mark.unit

FAST = RetryPolicy(base_s=0.001, cap_s=0.004)


def _counting_server(
    offsets: list[int], gate: asyncio.Event | None = None
) -> Callable[[httpx.Request], Awaitable[httpx.Response]]:
    """A produce handler giving consecutive offsets (waiting on ``gate`` first)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        if gate is not None:
            await gate.wait()
        count = len(scan_frames_for_produce(request.content, max_count=10_000))
        runs = [{"partition": "/default/t", "offset": offsets[0], "count": count}]
        offsets[0] += count
        return httpx.Response(200, json={"runs": runs})

    return handler


def _client(handler: Callable[[httpx.Request], Awaitable[httpx.Response]]) -> AsyncDanubeClient:
    async def topic_unknown_yet(request: httpx.Request) -> httpx.Response:
        # An idempotent producer (the default) first asks the topic's partitions; "not
        # there yet" sends to the topic itself, as these tests expect.
        if request.url.path.startswith("/v1/lookup/"):
            return httpx.Response(404, json={"error": {"code": "topic_not_found", "message": ""}})
        return await handler(request)

    transport = httpx.MockTransport(topic_unknown_yet)
    return AsyncDanubeClient("http://danube.test", transport=transport, retry=FAST)


async def test_send_many_resolves_one_future_with_every_result_in_order() -> None:
    async with (
        _client(_counting_server([0])) as client,
        client.producer("t", batch_max_messages=3) as p,
    ):
        single = await p.send("first")
        group = await p.send_many([f"m{i}" for i in range(7)])
        empty = await p.send_many([])
        results = await group
    assert (await single).offset == 0
    assert [r.offset for r in results] == list(range(1, 8))  # spread over three batches
    assert empty.result() == []
    assert p.pending == 0


async def test_each_message_gets_its_own_result_across_partial_and_concurrent_batches() -> None:
    # The server stores message "n" at offset 1000 + n and answers batches out of order
    # (the first waits for the later ones), so a result lands on the wrong future if the
    # queue's frames and their futures ever part (send() and send_many() mixed, more
    # queued than one batch takes, three batches in flight).
    seen: list[list[int]] = []
    release = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        frames = scan_frames_for_produce(request.content, max_count=10_000)
        numbers = [int(bytes(frames.payload(i))) for i in range(len(frames))]
        seen.append(numbers)
        if len(seen) == 1:
            await release.wait()
        elif len(seen) == 3:
            release.set()
        runs = [{"partition": "/default/t", "offset": 1000 + n, "count": 1} for n in numbers]
        return httpx.Response(200, json={"runs": runs})

    async with (
        _client(handler) as client,
        # Unsequenced: an idempotent producer would hold the later batches until the first
        # (its partition's opening batch) is answered (test_sdk_idempotent.py).
        client.producer("t", batch_max_messages=4, max_inflight_batches=3, idempotent=False) as p,
    ):
        singles = {n: await p.send(str(n)) for n in range(0, 3)}
        group = await p.send_many([str(n) for n in range(3, 8)])
        singles.update({n: await p.send(str(n)) for n in range(8, 13)})
        results = await group
    assert [r.offset for r in results] == [1003, 1004, 1005, 1006, 1007]
    assert {n: f.result().offset for n, f in singles.items()} == {n: 1000 + n for n in singles}
    assert [n for batch in seen for n in batch] == list(range(13))  # sent in order
    assert [len(batch) for batch in seen] == [4, 4, 4, 1]
    assert p.pending == 0


async def test_send_many_fails_with_its_batchs_error() -> None:
    async def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"error": {"code": "namespace_not_found", "message": ""}})

    async with _client(refuse) as client, client.producer("/nowhere/t") as p:
        group = await p.send_many(["a", "b"])
        with pytest.raises(NotFoundError):
            await group


async def test_pending_messages_stay_within_the_bound_and_senders_wait_for_room() -> None:
    gate = asyncio.Event()
    async with _client(_counting_server([0], gate)) as client:
        p = client.producer("t", max_pending_messages=4, batch_max_messages=2, linger_ms=0)
        futures = [await p.send(f"m{i}") for i in range(4)]
        fifth = asyncio.create_task(p.send("m4"))
        many = asyncio.create_task(p.send_many(["m5", "m6", "m7"]))
        await asyncio.sleep(0.05)
        assert not fifth.done()  # no room until a batch settles
        assert not many.done()
        assert p.pending == 4
        gate.set()
        group = await many
        assert [r.offset for r in await group] == [5, 6, 7]
        assert (await (await fifth)).offset == 4
        assert [f.result().offset for f in futures] == [0, 1, 2, 3]
        await p.close()


def _recording_server(
    seen: list[list[str]], gate: asyncio.Event, arrived: asyncio.Event
) -> Callable[[httpx.Request], Awaitable[httpx.Response]]:
    """A produce handler noting each batch's payloads as it comes (and setting
    ``arrived``), then waiting on ``gate`` before answering consecutive offsets."""
    offsets = [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        frames = scan_frames_for_produce(request.content, max_count=10_000)
        seen.append([bytes(frames.payload(i)).decode() for i in range(len(frames))])
        arrived.set()
        await gate.wait()
        runs = [{"partition": "/default/t", "offset": offsets[0], "count": len(frames)}]
        offsets[0] += len(frames)
        return httpx.Response(200, json={"runs": runs})

    return handler


async def test_an_idle_producer_sends_at_once_and_batches_form_behind_one_in_flight() -> None:
    # A 10 s linger: a lone send() on an idle pipe must not wait for it, while messages
    # sent with a batch in flight wait for company (here: until that batch comes back,
    # when the pipe is idle again and they go together).
    seen: list[list[str]] = []
    gate, arrived = asyncio.Event(), asyncio.Event()
    async with _client(_recording_server(seen, gate, arrived)) as client:
        p = client.producer("t", linger_ms=10_000, max_inflight_batches=2)
        async with asyncio.timeout(2):
            first = await p.send("a")
            await arrived.wait()
        assert seen == [["a"]]
        later = [await p.send("b"), await p.send("c")]
        await asyncio.sleep(0.05)
        assert seen == [["a"]]  # room for a second batch in flight, but it lingers
        gate.set()
        async with asyncio.timeout(2):  # well before the linger
            assert (await first).offset == 0
            assert [(await f).offset for f in later] == [1, 2]
        assert seen == [["a"], ["b", "c"]]
        await p.close()


async def test_flush_sends_a_lingering_batch_and_waits_for_what_was_queued_before_it() -> None:
    seen: list[list[str]] = []
    gate, arrived = asyncio.Event(), asyncio.Event()
    async with _client(_recording_server(seen, gate, arrived)) as client:
        # Unsequenced, for the reason above.
        p = client.producer("t", linger_ms=10_000, max_inflight_batches=2, idempotent=False)
        first = await p.send("a")  # goes at once and waits at the server
        async with asyncio.timeout(2):
            await arrived.wait()
        second = await p.send("b")  # lingers behind it: only a flush sends it
        await asyncio.sleep(0.02)
        assert seen == [["a"]]
        flushing = asyncio.create_task(p.flush())
        await asyncio.sleep(0.02)
        assert seen == [["a"], ["b"]]
        assert not flushing.done()
        gate.set()
        await flushing
        assert (first.result().offset, second.result().offset) == (0, 1)
        await p.close()


# --- the lean HTTP/1.1 client ------------------------------------------------------------


async def _serve(
    answers: list[bytes], seen: list[bytes], close_after_first: bool
) -> tuple[asyncio.Server, int]:
    """A server answering each request with the next of ``answers`` (closing the first
    connection after one answer when ``close_after_first``)."""
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                seen.append(head + await reader.readexactly(length))
                writer.write(answers.pop(0))
                await writer.drain()
                if first and close_after_first:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _json_answer(body: dict[str, object], chunked: bool = False) -> bytes:
    raw = orjson.dumps(body)
    if chunked:
        half = len(raw) // 2
        parts = [raw[:half], raw[half:]]
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in parts)
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(raw), raw)


async def test_lean_posts_keep_their_connection_and_read_both_answer_forms() -> None:
    seen: list[bytes] = []
    answers = [_json_answer({"n": 1}), _json_answer({"n": 2}, chunked=True), _json_answer({})]
    server, port = await _serve(answers, seen, close_after_first=False)
    async with server:
        http = HttpCore(f"http://127.0.0.1:{port}", timeout_s=2, retry=FAST, token="tok")
        first = await http.request("POST", "/p", content=b"abc", params={"a": 1}, lean=True)
        second = await http.request("POST", "/p", content=b"de", lean=True)
        await http.aclose()
    assert (first.body, second.body) == ({"n": 1}, {"n": 2})
    assert seen[0].startswith(b"POST /p?a=1 HTTP/1.1\r\n")
    assert b"authorization: Bearer tok\r\n" in seen[0]
    assert seen[0].endswith(b"\r\n\r\nabc")
    assert seen[1].endswith(b"\r\n\r\nde")


async def test_a_connection_the_server_closed_is_replaced_and_errors_map() -> None:
    seen: list[bytes] = []
    refused = orjson.dumps({"error": {"code": "topic_not_found", "message": "no"}})
    answers = [
        _json_answer({"n": 1}),
        b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%s" % (len(refused), refused),
    ]
    server, port = await _serve(answers, seen, close_after_first=True)
    async with server:
        http = HttpCore(f"http://127.0.0.1:{port}", timeout_s=2, retry=FAST)
        await http.request("POST", "/p", content=b"1", lean=True)
        await asyncio.sleep(0.05)  # the server has closed the kept-alive connection
        with pytest.raises(NotFoundError) as missing:
            await http.request("POST", "/p", content=b"2", lean=True)
        await http.aclose()
    assert missing.value.code == "topic_not_found"
    assert len(seen) == 2  # the second request went once, on a new connection
    dead = HttpCore(f"http://127.0.0.1:{port}", timeout_s=1, retry=FAST)
    with pytest.raises(TransportError):
        await dead.request("POST", "/p", content=b"3", lean=True)
    await dead.aclose()


async def test_an_answer_that_is_not_http_1_1_or_too_large_is_a_transport_error() -> None:
    seen: list[bytes] = []
    huge_head = b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (70 * 1024) + b"\r\n\r\n"
    answers = [b"SSH-2.0-OpenSSH_9.6\r\n\r\n", huge_head]
    for answer in answers:
        server, port = await _serve([answer], seen, close_after_first=True)
        async with server:
            http = HttpCore(f"http://127.0.0.1:{port}", timeout_s=2, retry=FAST)
            with pytest.raises(TransportError):
                await http.request("POST", "/p", content=b"x", lean=True)
            await http.aclose()
    assert len(seen) == 2  # each was asked once: a refused answer is not retried here
