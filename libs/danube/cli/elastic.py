"""`danube admin partitions reassign|cancel-reassign|reassignments` and `danube admin nodes
drain|undrain|drain-status`: moving replicas while partitions serve, and draining ingest
nodes (docs/operations.md, "Draining a node"). Wired under `danube admin` by cli/main.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from danube.cli._common import Json, ServiceAddr, out, print_json
from danube.cli.admin_common import _admin

if TYPE_CHECKING:
    from danube.client.admin import AsyncAdmin
    from danube.client.elastic import DrainStatus, ReplicaAssignment

nodes = typer.Typer(help="Drain and undrain ingest nodes and dispatchers.", no_args_is_help=True)

TopicArg = Annotated[
    str, typer.Argument(help="/<namespace>/<topic> (or /<namespace>/<topic>-part-<N>).")
]
PartitionOpt = Annotated[
    int | None,
    typer.Option("--partition", "-p", min=0, help="The partition N of a partitioned topic."),
]
NodeArg = Annotated[str, typer.Argument(help="An ingest node's id.")]


def _partition(topic: str, partition: int | None) -> str:
    return topic if partition is None else f"{topic}-part-{partition}"


def _show(found: ReplicaAssignment, json_out: bool) -> None:
    if json_out:
        print_json(found.model_dump())
        return
    if not (found.adding or found.removing):
        out.print(f"{found.partition}: replicas {', '.join(found.target)}")
        return
    out.print(
        f"{found.partition}: reassigning {', '.join(found.original)} -> "
        f"{', '.join(found.target)} (adding {', '.join(found.adding) or 'none'}, removing "
        f"{', '.join(found.removing) or 'none'})" + ("" if found.changed else "; already so")
    )


def reassign(
    topic: TopicArg,
    replicas: Annotated[
        str,
        typer.Option("--replicas", help="The nodes to keep it, preferred leader first: a,b,c."),
    ],
    partition: PartitionOpt = None,
    catchup_bytes_s: Annotated[
        int | None,
        typer.Option(
            "--catchup-bytes-s", min=1024, help="Cap on what the leader sends new replicas."
        ),
    ] = None,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Move a partition's replicas to other ingest nodes while it serves: the new ones
    catch up, join the ISR, take leadership; the old ones drop their copies."""
    nodes_wanted = [n.strip() for n in replicas.split(",") if n.strip()]

    async def call(admin: AsyncAdmin) -> None:
        found = await admin.reassign_partition(
            _partition(topic, partition), nodes_wanted, catchup_bytes_s=catchup_bytes_s
        )
        _show(found, json_out)

    _admin("partitions reassign", service_addr, call)


def cancel_reassign(
    topic: TopicArg,
    partition: PartitionOpt = None,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Cancel a partition's reassignment under way: back to its original replicas."""

    async def call(admin: AsyncAdmin) -> None:
        _show(await admin.cancel_reassignment(_partition(topic, partition)), json_out)

    _admin("partitions cancel-reassign", service_addr, call)


def reassignments(
    service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """Every reassignment under way: per new replica, in the ISR yet and its lag."""

    async def call(admin: AsyncAdmin) -> None:
        found = await admin.reassignments()
        if json_out:
            print_json(found.model_dump())
            return
        table = Table("partition", "from", "to", "leader", "new replica", "in ISR", "lag")
        for entry in found.reassignments:
            rows = entry.progress or []
            first = [entry.partition, ",".join(entry.original), ",".join(entry.target)]
            if not rows:
                table.add_row(*first, entry.leader or "none", "", "", "")
            for i, progress in enumerate(rows):
                table.add_row(
                    *(first if i == 0 else ["", "", ""]),
                    (entry.leader or "none") if i == 0 else "",
                    progress.node_id,
                    "yes" if progress.in_isr else "no",
                    "?" if progress.lag is None else str(progress.lag),
                )
        out.print(table)
        out.print(
            f"{len(found.reassignments)} under way"
            + (" (more not listed)" if found.truncated else "")
        )

    _admin("partitions reassignments", service_addr, call)


def register(partitions: typer.Typer) -> None:
    """Add the reassignment commands to `danube admin partitions`."""
    partitions.command("reassign")(reassign)
    partitions.command("cancel-reassign")(cancel_reassign)
    partitions.command("reassignments")(reassignments)


def _show_drain(node_id: str, json_out: bool, found: DrainStatus) -> None:
    if json_out:
        print_json(found.model_dump())
        return
    held = f"{len(found.replicas)} replicas, {len(found.subscriptions)} subscriptions"
    if not found.drained:
        out.print(f"{node_id}: not drained; holds {held}")
        return
    state = "done" if found.done else "draining"
    out.print(
        f"{node_id} ({', '.join(found.kinds)}): {state}; still holds {held}, "
        f"{len(found.leaving)} replicas leaving now"
    )
    for partition in found.replicas:
        out.print(f"  {partition}" + (" (leaving)" if partition in found.leaving else ""))
    for subscription in found.subscriptions:
        out.print(f"  {subscription} (subscription)")


@nodes.command("drain")
def drain(
    node: NodeArg, service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """Move every replica off an ingest node and place nothing new on it (then it may be
    stopped: docs/operations.md)."""

    async def call(admin: AsyncAdmin) -> None:
        _show_drain(node, json_out, await admin.drain_node(node))

    _admin("nodes drain", service_addr, call)


@nodes.command("undrain")
def undrain(node: NodeArg, service_addr: ServiceAddr = "http://127.0.0.1:8080") -> None:
    """Lift a node's drain: it takes replicas again."""

    async def call(admin: AsyncAdmin) -> None:
        await admin.undrain_node(node)
        out.print(f"{node}: undrained")

    _admin("nodes undrain", service_addr, call)


@nodes.command("drain-status")
def drain_status(
    node: NodeArg, service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """Where a node's drain stands: the replicas it still holds, those leaving now."""

    async def call(admin: AsyncAdmin) -> None:
        _show_drain(node, json_out, await admin.drain_status(node))

    _admin("nodes drain-status", service_addr, call)
