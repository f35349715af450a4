"""`danube bench produce|consume|e2e`: throughput and latency of a running mesh through the
SDK, with a progress bar (stderr) and a table or ``--json`` (stdout) at the end."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from danube.bench.run import (
    BenchSpec,
    Kind,
    Meter,
    Transport,
    bench_consume,
    bench_e2e,
    bench_produce,
)
from danube.cli._common import Json, ServiceAddr, client_tls, connect, err, out, print_json, run
from danube.client.errors import ClientError
from danube.tasks import TaskSet

if TYPE_CHECKING:
    from danube.client.client import AsyncDanubeClient
    from danube.client.consumer import Mode

    Runner = Callable[[AsyncDanubeClient, BenchSpec, Meter], Awaitable[dict[str, Any]]]

app = typer.Typer(help="Measure throughput and latency of a running mesh.", no_args_is_help=True)

_RUNNERS: dict[Kind, Runner] = {
    "produce": bench_produce,
    "consume": bench_consume,
    "e2e": bench_e2e,
}
PROGRESS_INTERVAL_S = 0.2

BenchTopic = Annotated[
    str | None,
    typer.Option(
        "--topic", "-t", help="Topic to use (default: a fresh /default/bench-<id>, deleted after)."
    ),
]
Size = Annotated[int, typer.Option("--size", min=1, max=512 * 1024, help="Payload bytes.")]
BatchSize = Annotated[
    int, typer.Option("--batch-size", min=1, max=10_000, help="Messages per produce request.")
]
Linger = Annotated[float, typer.Option("--linger-ms", min=0, help="Producer batching linger.")]
Inflight = Annotated[
    int, typer.Option("--inflight", min=1, max=64, help="Batches in flight per producer.")
]
Producers = Annotated[int, typer.Option("--producers", min=1, max=64, help="Producers.")]
Duration = Annotated[float, typer.Option("--duration", "-d", min=0.1, help="Seconds to run.")]
Count = Annotated[
    int | None, typer.Option("--count", "-n", min=1, help="Messages (instead of --duration).")
]
Rate = Annotated[float, typer.Option("--rate", min=0, help="Messages/s in all (0: max).")]
Warmup = Annotated[
    float,
    typer.Option(
        "--warmup",
        min=0,
        max=3600,
        help="Seconds at the start whose messages' latencies are reported apart "
        "(warmup_latency_ms): the first lookups and connections.",
    ),
]
Partitions = Annotated[
    int, typer.Option("--partitions", "-p", min=0, max=1024, help="Partitions of a new topic.")
]
ConsumeMode = Annotated[str, typer.Option("--mode", help="Consumer: stream or poll.")]
# The producers' body; any command that produces may take it (produce today).
TransportOption = Annotated[
    str, typer.Option("--transport", help="Produce body: binary (the default) or json.")
]
# How a consumer gets its messages (consume, e2e).
ConsumeTransport = Annotated[
    str,
    typer.Option(
        "--transport", help="Consumer: binary (delivery batches of frames) or json messages."
    ),
]
Idempotent = Annotated[
    bool,
    typer.Option(
        "--idempotent/--no-idempotent",
        help="Idempotent producers (the default; binary transport only): sequenced records "
        "the partition leader deduplicates.",
    ),
]
Direct = Annotated[
    bool,
    typer.Option(
        "--direct/--proxy",
        help="Post to each partition's leader (the default; idempotent producers) or "
        "everything through the service address (the proxy path).",
    ),
]
ConsumeDirect = Annotated[
    bool,
    typer.Option(
        "--consume-direct/--consume-proxy",
        help="Consumer: poll, stream and ack on the subscription owner's consume door (the "
        "default) or through the service address (the proxy path).",
    ),
]
Queue = Annotated[
    int, typer.Option("--queue", min=1, max=10_000, help="Consumer receive queue (credits).")
]


def _spec(kind: Kind, topic: str | None, **fields: Any) -> tuple[BenchSpec, bool]:
    mode = fields.pop("mode", "stream")
    if mode not in ("stream", "poll"):
        raise typer.BadParameter(f"stream or poll, not {mode!r}", param_hint="--mode")
    chosen: Mode = "stream" if mode == "stream" else "poll"
    for key in ("transport", "consume_transport"):  # produce's body; consume's delivery
        transport = fields.get(key, "binary")
        if transport not in ("binary", "json"):
            raise typer.BadParameter(f"binary or json, not {transport!r}", param_hint="--transport")
        if key in fields:
            fields[key] = _transport(transport)
    own = topic is None
    name = topic or f"/default/bench-{uuid.uuid4().hex[:8]}"
    if fields.get("count") is not None:
        fields["duration_s"] = None
    return BenchSpec(kind=kind, topic=name, mode=chosen, **fields), own


def _transport(value: str) -> Transport:
    return "json" if value == "json" else "binary"


@app.command("produce")
def produce(
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    topic: BenchTopic = None,
    size: Size = 1024,
    batch_size: BatchSize = 1000,
    linger_ms: Linger = 5.0,
    inflight: Inflight = 1,
    producers: Producers = 1,
    duration: Duration = 10.0,
    count: Count = None,
    rate: Rate = 0.0,
    warmup: Warmup = 0.0,
    partitions: Partitions = 0,
    transport: TransportOption = "binary",
    send_many: Annotated[
        bool,
        typer.Option(
            "--send-many",
            help="Queue --batch-size messages per send_many() call (one future each) "
            "instead of one send() per message.",
        ),
    ] = False,
    sync: Annotated[
        bool,
        typer.Option(
            "--sync",
            help="Wait for each message to be stored before sending the next (a closed loop, "
            "as a synchronous publish): latency without a queue in front of it.",
        ),
    ] = False,
    idempotent: Idempotent = True,
    direct: Direct = True,
    json_out: Json = False,
) -> None:
    """Produce as fast as the mesh takes it: msgs/s, MB/s, send→stored latency, client
    CPU."""
    if sync and send_many:
        raise typer.BadParameter("--sync sends one message at a time", param_hint="--send-many")
    spec, own = _spec(
        "produce",
        topic,
        size_bytes=size,
        batch_max_messages=batch_size,
        linger_ms=linger_ms,
        inflight=inflight,
        producers=producers,
        duration_s=duration,
        count=count,
        rate=rate,
        warmup_s=warmup,
        transport=transport,
        send_many=send_many,
        sync=sync,
        idempotent=idempotent,
        direct=direct,
    )
    run("bench produce", _bench(service_addr, spec, own, partitions, json_out))


@app.command("consume")
def consume(
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    topic: BenchTopic = None,
    size: Size = 1024,
    batch_size: BatchSize = 1000,
    count: Annotated[
        int, typer.Option("--count", "-n", min=1, help="Messages to fill, then consume.")
    ] = 50_000,
    partitions: Partitions = 0,
    mode: ConsumeMode = "stream",
    consume_direct: ConsumeDirect = True,
    queue: Queue = 1000,
    transport: ConsumeTransport = "binary",
    json_out: Json = False,
) -> None:
    """Fill a topic (untimed), then consume it from the start: msgs/s, MB/s."""
    spec, own = _spec(
        "consume",
        topic,
        size_bytes=size,
        batch_max_messages=batch_size,
        count=count,
        mode=mode,
        consume_direct=consume_direct,
        receiver_queue_size=queue,
        consume_transport=transport,
    )
    run("bench consume", _bench(service_addr, spec, own, partitions, json_out))


@app.command("e2e")
def e2e(
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    topic: BenchTopic = None,
    size: Size = 1024,
    batch_size: BatchSize = 1000,
    linger_ms: Linger = 5.0,
    inflight: Inflight = 1,
    producers: Producers = 1,
    duration: Duration = 10.0,
    count: Count = None,
    rate: Rate = 0.0,
    warmup: Warmup = 0.0,
    partitions: Partitions = 0,
    mode: ConsumeMode = "stream",
    consume_direct: ConsumeDirect = True,
    queue: Queue = 1000,
    transport: ConsumeTransport = "binary",
    json_out: Json = False,
) -> None:
    """Produce and consume at once: msgs/s, MB/s, send→delivered latency."""
    spec, own = _spec(
        "e2e",
        topic,
        size_bytes=size,
        batch_max_messages=batch_size,
        linger_ms=linger_ms,
        inflight=inflight,
        producers=producers,
        duration_s=duration,
        count=count,
        rate=rate,
        warmup_s=warmup,
        mode=mode,
        consume_direct=consume_direct,
        receiver_queue_size=queue,
        consume_transport=transport,
    )
    run("bench e2e", _bench(service_addr, spec, own, partitions, json_out))


@app.command("grpc")
def grpc(
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    grpc_addr: Annotated[
        str, typer.Option("--grpc-addr", help="Danube's gRPC API (discovery.grpc_port).")
    ] = "http://127.0.0.1:6650",
    size: Size = 1024,
    count: Annotated[
        int, typer.Option("--count", "-n", min=1, help="Messages per protocol.")
    ] = 5000,
    producers: Producers = 1,
    json_out: Json = False,
) -> None:
    """gRPC against HTTP, one message per call: produce msgs/s and latency, consume msgs/s."""

    from danube.bench import grpc_compare  # grpc only for this command: the CLI starts lean

    async def go() -> int:
        result = await grpc_compare.compare(
            service_addr,
            grpc_addr,
            size=size,
            count=count,
            producers=producers,
            tls=client_tls(),  # `danube --ca-file/--cert-file/--key-file`, both APIs
        )
        if json_out:
            print_json(result)
        else:
            out.print(_protocols_table(result))
        return 0

    run("bench grpc", go())


def _protocols_table(result: dict[str, Any]) -> Table:
    title = (
        f"danube bench grpc — {result['messages']} msgs of {result['message_size_bytes']} B, "
        f"{result['producers']} producer(s), one message per call"
    )
    table = Table("measure", "gRPC", "HTTP", title=title)
    grpc_, http = result["grpc"], result["http"]
    table.add_row(
        "produce msgs/s",
        f"{grpc_['produce_msgs_per_s']:,.0f}",
        f"{http['produce_msgs_per_s']:,.0f}",
    )
    for q in ("p50", "p99"):
        table.add_row(
            f"produce {q} (ms)",
            f"{grpc_['produce_latency_ms'][q]:.2f}",
            f"{http['produce_latency_ms'][q]:.2f}",
        )
    table.add_row(
        "consume msgs/s",
        f"{grpc_['consume_msgs_per_s']:,.0f}",
        f"{http['consume_msgs_per_s']:,.0f}",
    )
    return table


async def _bench(url: str, spec: BenchSpec, own: bool, partitions: int, json_out: bool) -> int:
    meter = Meter(total=spec.count, duration_s=spec.duration_s)
    async with connect(url) as client:
        if own or partitions:
            await client.admin.create_topic(spec.topic, partitions=partitions)
        # The heap this process built to start (typer, rich, httpx, pydantic, ...) will not
        # be freed: out of the cyclic GC's way, so that the full collections that the
        # producer's futures, alive for a batch's round trip, set off do not walk it each
        # time (measured: ~1 s of a 3 s produce run of 200 000 messages went to them).
        gc.freeze()
        try:
            async with _progress(spec.kind, meter):
                result = await _RUNNERS[spec.kind](client, spec, meter)
        finally:
            if own:
                with contextlib.suppress(ClientError):
                    await client.admin.delete_topic(spec.topic)
    if json_out:
        print_json(result)
    else:
        out.print(_table(result))
    return 1 if result["errors"] or result.get("missing") else 0


@contextlib.asynccontextmanager
async def _progress(kind: Kind, meter: Meter) -> AsyncIterator[None]:
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    task = progress.add_task(kind, total=1.0, status="")

    async def tick() -> None:
        while True:
            elapsed = max(1e-9, asyncio.get_running_loop().time() - start)
            done = meter.consumed if kind != "produce" else meter.produced
            status = f"{meter.phase}: {done} msgs, {done / elapsed:,.0f}/s, {meter.errors} errors"
            progress.update(task, completed=meter.done_fraction(kind), status=status)
            await asyncio.sleep(PROGRESS_INTERVAL_S)

    start = asyncio.get_running_loop().time()
    ticker = TaskSet("bench progress")
    with progress:
        # "log": a progress bar that breaks is logged; the run it shows goes on.
        ticker.spawn(tick(), name="ticker", on_failure="log")
        try:
            yield
        finally:
            await ticker.close()


def _table(result: dict[str, Any]) -> Table:
    table = Table("measure", "value", title=f"danube bench {result['bench']} — {result['topic']}")
    names = (
        "transport",
        "messages",
        "produced",
        "consumed",
        "duplicates",
        "missing",
        "errors",
        "duration_s",
    )
    for name in names:
        if name in result:
            table.add_row(name, str(result[name]))
    table.add_row("msgs/s", f"{result['msgs_per_s']:,.0f}")
    table.add_row("MB/s", f"{result['mb_per_s']:.2f}")
    if "client_cpu_s" in result:
        table.add_row(
            "client CPU",
            f"{result['client_cpu_s']:.2f} s, {result['client_cpu_per_wall']:.2f} of wall, "
            f"{result['client_cpu_us_per_msg']:.1f} µs/msg",
        )
    for name in ("latency_ms", "produce_latency_ms"):
        summary = result.get(name)
        if summary:
            shown = ", ".join(f"{q} {summary[q]:.2f}" for q in ("p50", "p99", "p999", "max"))
            table.add_row(name.replace("_ms", " (ms)"), shown)
    if result.get("last_error"):
        table.add_row("last error", str(result["last_error"]))
    return table
