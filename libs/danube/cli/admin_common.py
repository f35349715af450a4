"""What the `danube admin` commands share: the admin request runner, the options and
arguments several groups take, and the time format."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from danube.cli._common import connect, run

if TYPE_CHECKING:
    from danube.client.admin import AsyncAdmin

# The server's bound (danube.meta.records.REPLICAS_MAX); it answers 400 past it anyway.
REPLICAS_MAX = 7
ReplicationFactor = Annotated[
    int | None,
    typer.Option(
        "--replication-factor",
        "-r",
        min=1,
        max=REPLICAS_MAX,
        help="Copies of each partition (default: the namespace's, else the cluster's).",
    ),
]
MinInsync = Annotated[
    int | None,
    typer.Option(
        "--min-insync-replicas",
        min=1,
        max=REPLICAS_MAX,
        help="Copies durable before a produce is acknowledged (leader included).",
    ),
]

# Each admin request, retries included (an unreachable server fails within this).
ADMIN_TIMEOUT_S = 5.0

TopicArg = Annotated[str, typer.Argument(help="/<namespace>/<topic>, or <topic> in default.")]


def _admin(command: str, url: str, call: Callable[[AsyncAdmin], Awaitable[None]]) -> None:
    async def main() -> None:
        async with connect(url, timeout_s=ADMIN_TIMEOUT_S) as client:
            await call(client.admin)

    run(f"admin {command}", main())


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
