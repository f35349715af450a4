"""`danube produce`: send a message (or a file) to a topic, once or ``-c`` times, as
Danube's danube-cli does."""

from __future__ import annotations

import time
from collections import deque
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from danube.cli._common import ServiceAddr, Topic, connect, err, out, parse_attributes, run

if TYPE_CHECKING:
    from danube.client.messages import SendResult

COUNT_MAX = 10_000_000
WINDOW = 10_000


class AccessMode(StrEnum):
    shared = "shared"
    exclusive = "exclusive"


class CompressionChoice(StrEnum):
    zstd = "zstd"
    lz4 = "lz4"
    none = "none"


_COMPRESSIONS: dict[CompressionChoice, Literal["zstd", "lz4"] | None] = {
    CompressionChoice.zstd: "zstd",
    CompressionChoice.lz4: "lz4",
    CompressionChoice.none: None,
}


# The produce command's options.
MessageOption = Annotated[str | None, typer.Option("--message", "-m", help="The message text.")]
FileOption = Annotated[
    Path | None,
    typer.Option("--file", "-f", help="Send this file's bytes as the payload.", dir_okay=False),
]
AttributesOption = Annotated[
    list[str] | None,
    typer.Option("--attributes", "-a", help="name:value (repeat, or a:1,b:2)."),
]
CountOption = Annotated[
    int, typer.Option("--count", "-c", min=1, max=COUNT_MAX, help="Send it this many times.")
]
IntervalMsOption = Annotated[
    int,
    typer.Option("--interval", "-i", min=0, help="Milliseconds between sends (0: batched, fast)."),
]
PartitionsOption = Annotated[
    int | None,
    typer.Option("--partitions", "-p", min=0, max=1024, help="Create the topic with N partitions."),
]
ReliableOption = Annotated[
    bool,
    typer.Option(
        "--reliable/--non-reliable",
        help="Dispatch mode of a topic this command creates (WAL + cloud, or in memory).",
    ),
]
KeyOption = Annotated[
    str | None, typer.Option("--key", help="Routing key: one key, one partition, in order.")
]
ProducerNameOption = Annotated[
    str | None,
    typer.Option(
        "--producer-name",
        "-n",
        help="Stored with every message. Idempotent: names one producer, a new run of it "
        "fences a running one (default: a name of its own, danube-client-<hex>).",
    ),
]
TimeoutSOption = Annotated[
    float,
    typer.Option("--timeout", min=0.1, max=3600, help="Retry a batch for at most this (s)."),
]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the summary.")]
AccessModeOption = Annotated[
    AccessMode | None,
    typer.Option(
        "--access-mode",
        help="Hold a producer session while producing; exclusive: refused while another "
        "producer is connected, and fences every other producer until it ends.",
    ),
]
IdempotentOption = Annotated[
    bool,
    typer.Option(
        "--idempotent/--no-idempotent",
        help="Sequenced records, stored once however often a batch is retried.",
    ),
]
CompressionOption = Annotated[
    CompressionChoice,
    typer.Option(
        "--compression",
        help="Store each payload compressed (when that makes it smaller); consumers get "
        "it decompressed.",
    ),
]
DeliverAfterMsOption = Annotated[
    int | None,
    typer.Option(
        "--deliver-after-ms",
        min=0,
        help="Deliver to shared and key-shared subscriptions this many ms after publish.",
    ),
]
DeliverAtMsOption = Annotated[
    int | None,
    typer.Option(
        "--deliver-at-ms",
        min=0,
        help="Deliver to shared and key-shared subscriptions at this Unix time, ms.",
    ),
]


def produce(
    topic: Topic,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    message: MessageOption = None,
    file: FileOption = None,
    attributes: AttributesOption = None,
    count: CountOption = 1,
    interval_ms: IntervalMsOption = 0,
    partitions: PartitionsOption = None,
    reliable: ReliableOption = True,
    key: KeyOption = None,
    producer_name: ProducerNameOption = None,
    timeout_s: TimeoutSOption = 10.0,
    quiet: QuietOption = False,
    access_mode: AccessModeOption = None,
    idempotent: IdempotentOption = True,
    compression: CompressionOption = CompressionChoice.none,
    deliver_after_ms: DeliverAfterMsOption = None,
    deliver_at_ms: DeliverAtMsOption = None,
) -> None:
    """Produce messages to a topic; prints `<partition> <offset>` per message."""
    if (message is None) == (file is None):
        raise typer.BadParameter("give exactly one of --message and --file")
    payload: bytes | str = message if message is not None else _read(file)
    attrs = parse_attributes(attributes)
    if deliver_after_ms is not None or deliver_at_ms is not None:
        attrs.update(_delay(deliver_at_ms, deliver_after_ms))
    run(
        "produce",
        _produce(
            service_addr,
            topic,
            payload,
            attrs,
            count=count,
            interval_s=interval_ms / 1000,
            partitions=partitions,
            dispatch="reliable" if reliable else "non_reliable",
            key=key,
            # Idempotent and unnamed: the SDK gives the producer a name of its own.
            name=producer_name or ("danube-client" if idempotent else "danube-cli"),
            timeout_s=timeout_s,
            quiet=quiet,
            create=partitions is not None or not reliable,
            access_mode=None if access_mode is None else access_mode.value,
            idempotent=idempotent,
            compression=_COMPRESSIONS[compression],
        ),
    )


def _delay(deliver_at_ms: int | None, deliver_after_ms: int | None) -> dict[str, str]:
    from danube.wire.delay import DelayError, delay_attributes

    try:
        return delay_attributes(
            deliver_at_ms=deliver_at_ms,
            deliver_after_ms=deliver_after_ms,
            now_ms=int(time.time() * 1000),
        )
    except DelayError as exc:
        raise typer.BadParameter(str(exc), param_hint="--deliver-after-ms") from exc


def _read(file: Path | None) -> bytes:
    assert file is not None
    try:
        return file.read_bytes()
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {file}: {exc.strerror}", param_hint="-f") from exc


async def _produce(
    url: str,
    topic: str,
    payload: bytes | str,
    attributes: dict[str, str],
    *,
    count: int,
    interval_s: float,
    partitions: int | None,
    dispatch: Literal["reliable", "non_reliable"],
    key: str | None,
    name: str,
    timeout_s: float,
    quiet: bool,
    create: bool,
    access_mode: Literal["shared", "exclusive"] | None = None,
    idempotent: bool = True,
    compression: Literal["zstd", "lz4"] | None = None,
) -> None:
    import asyncio  # here, not at the module's top: `danube --help` needs none of it

    async with connect(url) as client:
        if create:
            created = await client.admin.create_topic(
                topic,
                partitions=partitions or 0,
                dispatch=dispatch,
            )
            if created.created:
                err.print(
                    f"created {created.name}: {created.config.partitions} partitions, "
                    f"{created.config.dispatch}"
                )
        producer = client.producer(
            topic,
            name=name,
            dispatch=dispatch,
            linger_ms=0 if interval_s else 5,
            send_timeout_s=timeout_s,
            access_mode=access_mode,
            idempotent=idempotent,
            # A payload over the message size (a large --file) goes as chunks, up to the
            # SDK's 100 MiB (docs/client.md, "Large messages").
            chunking=True,
            compression=compression,
        )
        started = time.monotonic()
        async with producer:  # opens the session (if any) now, closes it at the end
            if producer.producer_id is not None:
                err.print(f"producer session {producer.producer_id} ({access_mode})")
            if interval_s:
                for index in range(count):
                    if index:
                        await asyncio.sleep(interval_s)
                    stored = await producer.send_and_wait(payload, key=key, attributes=attributes)
                    _show(stored, quiet)
            else:
                # Results print in send order; at most WINDOW futures are held at once.
                waiting: deque[asyncio.Future[SendResult]] = deque()
                for _ in range(count):
                    waiting.append(await producer.send(payload, key=key, attributes=attributes))
                    if len(waiting) >= WINDOW:
                        _show(await waiting.popleft(), quiet)
                while waiting:
                    _show(await waiting.popleft(), quiet)
        elapsed = time.monotonic() - started
    err.print(f"produced {count} message(s) to {producer.topic} in {elapsed:.2f} s")


def _show(result: SendResult, quiet: bool) -> None:
    if not quiet:
        out.print(f"{result.partition} {result.offset}")
