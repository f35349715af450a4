"""`danube admin topics|subscriptions|partitions`: a topic, its subscriptions and its
partitions through the HTTP API's admin routes (danube.cli.admin assembles the groups)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.table import Table

from danube.cli._common import Json, ServiceAddr, err, out, parse_position, print_json
from danube.cli.admin_common import MinInsync, ReplicationFactor, TopicArg, _admin, _when
from danube.cli.layout import rows_view
from danube.cli.policies import PolicyOption, parse_policies, policies_text
from danube.cli.producers_table import producers_table

if TYPE_CHECKING:
    from danube.client.admin import AsyncAdmin, TopicDescription
    from danube.client.subscriptions import Subscription

topics = typer.Typer(
    help="List, create, describe, delete and look up topics.", no_args_is_help=True
)
subscriptions = typer.Typer(
    help="List, delete, seek and skip subscriptions; their failure policy.", no_args_is_help=True
)
partitions = typer.Typer(
    help="Reassign a partition's replicas (live), move a leaderless one, skip damage.",
    no_args_is_help=True,
)


class Dispatch(StrEnum):
    reliable = "reliable"
    non_reliable = "non_reliable"


class Durability(StrEnum):
    fsync = "fsync"
    interval = "interval"


# --- topics ------------------------------------------------------------------------------


@topics.command("list")
def topics_list(
    namespace: Annotated[str, typer.Argument(help="The namespace.")] = "default",
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """The topics of a namespace."""

    async def call(admin: AsyncAdmin) -> None:
        names = await admin.topics(namespace)
        if json_out:
            print_json(names)
        else:
            for name in names:
                out.print(f"/{namespace}/{name}")

    _admin("topics list", service_addr, call)


@topics.command("create")
def topics_create(
    topic: TopicArg,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=0, max=1024)] = 0,
    dispatch: Annotated[Dispatch, typer.Option(help="WAL + cloud, or in memory.")] = (
        Dispatch.reliable
    ),
    durability: Annotated[Durability, typer.Option(help="Ack after fsync, or after write.")] = (
        Durability.fsync
    ),
    replication_factor: ReplicationFactor = None,
    min_insync_replicas: MinInsync = None,
    policy: PolicyOption = None,
    json_out: Json = False,
) -> None:
    """Create a topic (idempotent; 409 if it exists with another config); ``--policy``
    sets its own policies (the rest come from its namespace)."""
    policies = parse_policies(policy)

    async def call(admin: AsyncAdmin) -> None:
        created = await admin.create_topic(
            topic,
            partitions=partitions,
            dispatch="reliable" if dispatch is Dispatch.reliable else "non_reliable",
            durability="fsync" if durability is Durability.fsync else "interval",
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
            policies=policies,
        )
        if json_out:
            print_json(created.model_dump())
            return
        verb = "created" if created.created else "exists"
        config = created.config
        out.print(
            f"{verb}: {created.name}, {config.partitions} partitions, {config.dispatch}, "
            f"{config.durability}"
        )

    _admin("topics create", service_addr, call)


_PARTITION_COLUMNS = (
    "partition",
    "leader",
    "epoch",
    "replicas",
    "in sync",
    "wal start",
    "high watermark",
    "uploaded through",
    "follower lag",
)


def _describe_table(console: Console, found: TopicDescription) -> RenderableType:
    rows = []
    for partition in found.partitions:
        owner, offsets = partition.owner, partition.offsets
        lag = ", ".join(f"{n}:{_opt(f.lag)}" for n, f in sorted(offsets.followers.items()))
        rows.append(
            (
                partition.name,
                owner.node_id if owner else "(none)",
                str(owner.epoch) if owner else "",
                ", ".join(offsets.replicas) or "-",
                ", ".join(offsets.isr) or "-",
                *(
                    _opt(v)
                    for v in (offsets.wal_start, offsets.next_offset, offsets.uploaded_through)
                ),
                lag or "-",
            )
        )
        damaged = offsets.upload_damaged
        if damaged is not None:
            err.print(
                f"{partition.name}: uploads stopped at {damaged.from_offset}: WAL offsets "
                f"{damaged.from_offset}..{damaged.to_offset - 1} are damaged ({damaged.file})"
            )
    return rows_view(console, _PARTITION_COLUMNS, rows)


def _opt(value: Any) -> str:
    return "-" if value is None else str(value)


@topics.command("describe")
def topics_describe(
    topic: TopicArg, service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """Config, partitions with owners and offsets, subscriptions, producers."""

    async def call(admin: AsyncAdmin) -> None:
        found = await admin.describe_topic(topic)
        if json_out:
            print_json(found.model_dump())
            return
        config = found.config
        out.print(
            f"{found.name}: {config.partitions} partitions, {config.dispatch}, "
            f"{config.durability}, created {_when(config.created_ms)}"
        )
        out.print(
            f"policies: {policies_text(config.policies)}; in effect: "
            f"{policies_text(config.effective_policies)}"
        )
        out.print(_describe_table(out, found))
        if found.subscriptions:
            out.print(_subscriptions_table(out, found.subscriptions))
        if found.producers:
            out.print(producers_table(out, found.producers))

    _admin("topics describe", service_addr, call)


@topics.command("update")
def topics_update(
    topic: TopicArg,
    policy: PolicyOption = None,
    partitions: Annotated[
        int | None,
        typer.Option("--partitions", help="Grow the topic to N partitions (never fewer)."),
    ] = None,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Change a topic in place: ``--partitions N`` grows it (keys move: docs/client.md),
    ``--policy KEY=VALUE`` sets a policy (``KEY=none`` unsets one, so its namespace's
    applies)."""
    policies = parse_policies(policy)
    if policies is None and partitions is None:
        raise typer.BadParameter("give --partitions N or at least one --policy KEY=VALUE")

    async def call(admin: AsyncAdmin) -> None:
        updated = await admin.update_topic(topic, partitions=partitions, policies=policies)
        if json_out:
            print_json(updated.model_dump())
            return
        out.print(
            f"{updated.name}: {updated.config.partitions} partitions; policies: "
            f"{policies_text(updated.config.policies)}; in effect: "
            f"{policies_text(updated.config.effective_policies)}"
        )

    _admin("topics update", service_addr, call)


@topics.command("producers")
def topics_producers(
    topic: TopicArg, service_addr: ServiceAddr = "http://127.0.0.1:6650", json_out: Json = False
) -> None:
    """The open producer sessions of a topic: id, name, access mode."""

    async def call(admin: AsyncAdmin) -> None:
        found = await admin.producers(topic)
        if json_out:
            print_json([producer.model_dump() for producer in found])
        else:
            out.print(producers_table(out, found))

    _admin("topics producers", service_addr, call)


@topics.command("delete")
def topics_delete(topic: TopicArg, service_addr: ServiceAddr = "http://127.0.0.1:8080") -> None:
    """Delete a topic, its WAL and its subscriptions."""

    async def call(admin: AsyncAdmin) -> None:
        await admin.delete_topic(topic)
        err.print(f"deleted topic {topic}")

    _admin("topics delete", service_addr, call)


@topics.command("lookup")
def topics_lookup(
    topic: TopicArg, service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """The partitions of a topic, who owns each and its data door (where producers post)."""

    async def call(admin: AsyncAdmin) -> None:
        found = await admin.lookup(topic)
        if json_out:
            print_json(found.model_dump())
            return
        table = Table("partition", "owner", "epoch", "data door")
        for partition in found.partitions:
            owner = partition.owner
            table.add_row(
                partition.name,
                owner.node_id if owner else "(none)",
                str(owner.epoch) if owner else "",
                partition.url or "",
            )
        out.print(f"{found.name} ({found.dispatch})")
        out.print(table)

    _admin("topics lookup", service_addr, call)


# --- subscriptions -----------------------------------------------------------------------


def _subscriptions_table(console: Console, found: list[Subscription]) -> RenderableType:
    rows = []
    for sub in found:
        consumers = ", ".join(f"{c.name} ({c.unacked})" for c in sub.consumers)
        owner = sub.owner.node_id if sub.owner else "(none)"
        rows.append((sub.name, sub.type, owner, str(sub.backlog), consumers or "-"))
    headers = ("subscription", "type", "served by", "backlog", "consumers (unacked)")
    return rows_view(console, headers, rows)


@subscriptions.command("list")
def subscriptions_list(
    topic: TopicArg, service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """The subscriptions of a topic: type, backlog, consumers (--json: cursors too)."""

    async def call(admin: AsyncAdmin) -> None:
        found = await admin.subscriptions(topic)
        if json_out:
            print_json([sub.model_dump() for sub in found])
        else:
            out.print(_subscriptions_table(out, found))

    _admin("subscriptions list", service_addr, call)


@subscriptions.command("delete")
def subscriptions_delete(
    topic: TopicArg,
    subscription: Annotated[str, typer.Argument(help="The subscription.")],
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
) -> None:
    """Delete a subscription (its consumers are detached, its cursors removed)."""

    async def call(admin: AsyncAdmin) -> None:
        await admin.delete_subscription(topic, subscription)
        err.print(f"deleted subscription {subscription} of {topic}")

    _admin("subscriptions delete", service_addr, call)


@subscriptions.command("seek")
def subscriptions_seek(
    topic: TopicArg,
    subscription: Annotated[str, typer.Argument(help="The subscription.")],
    to: Annotated[str, typer.Option("--to", help="earliest, latest, an offset or ts:<unix ms>.")],
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Move a subscription's cursor in every partition (unacked messages are dropped)."""
    position = parse_position(to, "--to")

    async def call(admin: AsyncAdmin) -> None:
        moved = await admin.seek(topic, subscription, position)
        if json_out:
            print_json([p.model_dump() for p in moved])
            return
        for partition in moved:
            out.print(f"{partition.name} {partition.offset}")

    _admin("subscriptions seek", service_addr, call)


@subscriptions.command("skip")
def subscriptions_skip(
    topic: TopicArg,
    subscription: Annotated[str, typer.Argument(help="The subscription.")],
    partition: Annotated[
        int | None,
        typer.Option("--partition", help="The partition's index (omit it when unpartitioned)."),
    ] = None,
    to: Annotated[
        int | None,
        typer.Option(
            "--to",
            help="The offset to go on from; omitted: past the damaged range (or the poison "
            "message blocking the partition at its cursor).",
        ),
    ] = None,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Skip offsets of one partition on purpose (a range no copy holds intact): they are
    never delivered to this subscription."""

    async def call(admin: AsyncAdmin) -> None:
        done = await admin.skip(topic, subscription, partition=partition, to_offset=to)
        if json_out:
            print_json(done.model_dump())
            return
        out.print(
            f"{done.partition}: skipped {done.skipped} offsets "
            f"({done.from_offset}..{done.to_offset - 1}); delivery goes on at {done.to_offset}"
        )

    _admin("subscriptions skip", service_addr, call)


@partitions.command("skip-upload")
def partitions_skip_upload(
    partition: Annotated[str, typer.Argument(help="/<namespace>/<topic>[-part-<N>].")],
    to: Annotated[
        int | None,
        typer.Option("--to", help="The offset uploads go on from; omitted: past the damage."),
    ] = None,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Let a partition's uploads go on past the damaged WAL range they stopped at (shown by
    topics describe); that range is never uploaded."""

    async def call(admin: AsyncAdmin) -> None:
        done = await admin.skip_upload(partition, to_offset=to)
        if json_out:
            print_json(done.model_dump())
            return
        out.print(
            f"{done.partition}: uploads skip {done.skipped} offsets "
            f"({done.from_offset}..{done.to_offset - 1}) and go on at {done.to_offset}"
        )

    _admin("partitions skip-upload", service_addr, call)


@partitions.command("move")
def partitions_move(
    partition: Annotated[
        str, typer.Argument(help="/<namespace>/<topic> or /<namespace>/<topic>-part-<N>.")
    ],
    to: Annotated[
        list[str], typer.Option("--to", help="An ingest node to keep it (repeat for more).")
    ],
    unclean: Annotated[
        bool,
        typer.Option("--unclean", help="Give up what only the old replicas held (they are gone)."),
    ] = False,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Give a partition with no leader left a new replica set (docs/replication.md)."""

    async def call(admin: AsyncAdmin) -> None:
        moved = await admin.move_partition(partition, to, unclean=unclean)
        if json_out:
            print_json(moved.model_dump())
            return
        old = ", ".join(moved.previous_replicas) or "nowhere"
        out.print(f"moved {moved.partition} from {old} to {', '.join(moved.replicas)}")
        if moved.continues_at is not None:
            out.print(
                f"gave up: the offsets from {moved.given_up_from} on that only "
                f"{old} held; the log continues at {moved.continues_at}"
            )

    _admin("partitions move", service_addr, call)
