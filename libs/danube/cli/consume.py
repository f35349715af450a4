"""`danube consume`: attach to a subscription, print each message and ack it, until ``-c``
messages came (or Ctrl-C), as Danube's danube-cli does."""

from __future__ import annotations

import base64
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from danube.cli import failure_policy as fp
from danube.cli._common import (
    Json,
    ServiceAddr,
    Topic,
    connect,
    err,
    escape,
    out,
    parse_position,
    print_json,
    run,
)

if TYPE_CHECKING:
    from danube.client.consumer import Start
    from danube.client.messages import ReceivedMessage


class SubType(StrEnum):
    exclusive = "exclusive"
    shared = "shared"
    failover = "failover"
    key_shared = "key-shared"


class Mode(StrEnum):
    stream = "stream"
    poll = "poll"


# The consume command's options.
SubscriptionOption = Annotated[
    str, typer.Option("--subscription", "-m", help="Subscription name (created if new).")
]
ConsumerNameOption = Annotated[
    str, typer.Option("--consumer", "-n", help="This consumer's name (logs, stats).")
]
SubTypeOption = Annotated[
    SubType, typer.Option("--sub-type", help="Subscription type of a new subscription.")
]
KeyFiltersOption = Annotated[
    list[str] | None,
    typer.Option(
        "--key-filter",
        help="key-shared only: take only keys matching this glob (user-*, eu-?); repeatable.",
    ),
]
StartOption = Annotated[
    str,
    typer.Option(
        "--start",
        help="Where a new subscription starts: earliest, latest, an offset or ts:<unix ms>.",
    ),
]
CountOption = Annotated[
    int | None, typer.Option("--count", "-c", min=1, help="Stop after this many messages.")
]
ModeOption = Annotated[
    Mode, typer.Option("--mode", help="WebSocket stream with credits, or long-poll.")
]
TimeoutSOption = Annotated[
    float,
    typer.Option("--timeout", min=0.1, max=3600, help="Retry the attach for at most this (s)."),
]
NoAckOption = Annotated[
    bool, typer.Option("--no-ack", help="Do not ack (the messages come again).")
]
SaveDirOption = Annotated[
    Path | None,
    typer.Option(
        "--save-dir",
        help="Write each payload to DIR/<partition>-<offset>.bin and print its size and "
        "path instead of the payload (large messages: files sent with produce --file).",
        file_okay=False,
    ),
]


def consume(
    topic: Topic,
    subscription: SubscriptionOption,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    consumer_name: ConsumerNameOption = "danube-cli",
    sub_type: SubTypeOption = SubType.exclusive,
    key_filters: KeyFiltersOption = None,
    start: StartOption = "latest",
    count: CountOption = None,
    mode: ModeOption = Mode.stream,
    json_out: Json = False,
    timeout_s: TimeoutSOption = 10.0,
    no_ack: NoAckOption = False,
    save_dir: SaveDirOption = None,
    max_redeliveries: fp.MaxRedeliveries = None,
    ack_timeout_ms: fp.AckTimeoutMs = None,
    backoff: fp.BackoffOpt = None,
    backoff_base_ms: fp.BackoffBaseMs = None,
    backoff_max_ms: fp.BackoffMaxMs = None,
    poison: fp.PoisonOpt = None,
    dead_letter_topic: fp.DeadLetterTopic = None,
) -> None:
    """Consume messages from a subscription; prints and acks each one. The failure policy
    options are those of a new subscription (as ``admin subscriptions failure-policy set``);
    naming another policy than an existing subscription's is refused."""
    if key_filters and sub_type is not SubType.key_shared:
        raise typer.BadParameter(
            "--key-filter needs --sub-type key-shared", param_hint="--key-filter"
        )
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
    policy = fp.build_policy(
        max_redeliveries,
        ack_timeout_ms,
        backoff,
        backoff_base_ms,
        backoff_max_ms,
        poison,
        dead_letter_topic,
    )
    run(
        "consume",
        _consume(
            service_addr,
            topic,
            subscription,
            name=consumer_name,
            sub_type=sub_type.value.replace("-", "_"),
            key_filters=tuple(key_filters or ()),
            start=parse_position(start, "--start"),
            count=count,
            mode=mode.value,
            json_out=json_out,
            timeout_s=timeout_s,
            ack=not no_ack,
            policy=None if policy is None else policy.body(),
            save_dir=save_dir,
        ),
    )


async def _consume(
    url: str,
    topic: str,
    subscription: str,
    *,
    name: str,
    sub_type: str,
    key_filters: tuple[str, ...],
    start: Start,
    count: int | None,
    mode: str,
    json_out: bool,
    timeout_s: float,
    ack: bool,
    policy: dict[str, Any] | None = None,
    save_dir: Path | None = None,
) -> None:
    received = 0
    async with (
        connect(url) as client,
        client.consumer(
            topic,
            subscription,
            name=name,
            type=sub_type,
            key_filters=key_filters,
            start=start,
            mode=mode,
            attach_timeout_s=timeout_s,
            failure_policy=policy,
        ) as consumer,
    ):
        err.print(
            f"consuming {consumer.topic} as {subscription} ({sub_type}, {mode}); Ctrl-C stops"
        )
        async for message in consumer:
            _show(message, json_out, None if save_dir is None else _save(message, save_dir))
            if ack:
                message.ack()
            received += 1
            if count is not None and received >= count:
                break
    err.print(f"received {received} message(s)")


def _save(message: ReceivedMessage, save_dir: Path) -> Path:
    """Write the payload to its own file (named by partition and offset); its path."""
    name = message.partition.strip("/").replace("/", "-")
    path = save_dir / f"{name}-{message.offset}.bin"
    path.write_bytes(message.payload)
    return path


def _show(message: ReceivedMessage, json_out: bool, saved: Path | None = None) -> None:
    if saved is not None:
        payload, encoding = str(saved), "file"
    else:
        try:
            payload, encoding = message.payload.decode("utf-8"), "utf8"
        except UnicodeDecodeError:
            payload, encoding = base64.b64encode(message.payload).decode("ascii"), "base64"
    chunks = getattr(message, "chunks", ())
    if json_out:
        print_json(
            {
                "partition": message.partition,
                "offset": message.offset,
                "payload": payload,
                "encoding": encoding,
                "bytes": len(message.payload),
                "chunks": len(chunks),
                "key": message.key,
                "attributes": dict(message.attributes),
                "publish_time_ms": message.publish_time_ms,
                "producer": message.producer,
                "redelivery_count": message.redelivery_count,
            }
        )
        return
    extras = []
    if message.key is not None:
        extras.append(f"key={message.key}")
    extras += [f"{k}={v}" for k, v in message.attributes.items()]
    if message.redelivery_count:
        extras.append(f"redelivered={message.redelivery_count}")
    if chunks:
        extras.append(f"chunks={len(chunks)}")
    shown = (
        payload if encoding == "utf8" else f"<{len(message.payload)} bytes, {encoding}> {payload}"
    )
    head = f"[{message.partition}@{message.offset}]"
    out.print(escape(" ".join([head, *extras, shown])))
