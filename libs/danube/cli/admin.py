"""`danube admin`: the cluster, namespaces and topics through the HTTP API's admin routes.

The cluster and namespace commands are here; the topic, subscription and partition groups
are danube.cli.admin_topics, and what they share is danube.cli.admin_common."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from danube.cli import failure_policy
from danube.cli._common import Json, ServiceAddr, err, out, print_json
from danube.cli.admin_common import MinInsync, ReplicationFactor, _admin, _when

# `partitions` and `topics` are also extended by danube.cli.main (elastic, schemas).
from danube.cli.admin_topics import partitions as partitions
from danube.cli.admin_topics import subscriptions
from danube.cli.admin_topics import topics as topics
from danube.cli.policies import PolicyOption, parse_policies, policies_text

if TYPE_CHECKING:
    from danube.client.admin import AsyncAdmin, Namespace

app = typer.Typer(help="Cluster, namespaces, topics and partitions.", no_args_is_help=True)
namespaces = typer.Typer(help="List, show, create and delete namespaces.", no_args_is_help=True)
app.add_typer(namespaces, name="namespaces")
app.add_typer(topics, name="topics")
app.add_typer(subscriptions, name="subscriptions")
subscriptions.add_typer(failure_policy.app, name="failure-policy")
app.add_typer(partitions, name="partitions")


@app.command()
def cluster(service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False) -> None:
    """Registered nodes by service kind, and the controller's leader."""

    async def call(admin: AsyncAdmin) -> None:
        found = await admin.cluster()
        if json_out:
            print_json(found.model_dump())
            return
        table = Table("service", "node", "address", "started")
        for kind, nodes in sorted(found.nodes.items()):
            for node in nodes:
                name = f"{node.node_id} (drained)" if node.drained else node.node_id
                table.add_row(kind, name, node.address or "", _when(node.started_ms))
        out.print(table)
        out.print(f"controller leader: {found.controller.leader or '(none)'}")

    _admin("cluster", service_addr, call)


# --- namespaces --------------------------------------------------------------------------


def _show_namespace(found: Namespace, json_out: bool) -> None:
    if json_out:
        print_json(found.model_dump())
        return
    retention = found.retention
    out.print(
        f"{found.name}: max_topics {found.max_topics}, retention "
        f"{retention.time_minutes or '-'} min / {retention.size_mb or '-'} MB, "
        f"replication {found.replication_factor or 'default'} "
        f"(min in sync {found.min_insync_replicas or 'default'}), "
        f"created {_when(found.created_ms)}; policies: {policies_text(found.policies)}"
    )


@namespaces.command("list")
def namespaces_list(
    service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """Every namespace."""

    async def call(admin: AsyncAdmin) -> None:
        names = await admin.namespaces()
        if json_out:
            print_json(names)
        else:
            for name in names:
                out.print(name)

    _admin("namespaces list", service_addr, call)


@namespaces.command("get")
def namespaces_get(
    namespace: str, service_addr: ServiceAddr = "http://127.0.0.1:8080", json_out: Json = False
) -> None:
    """One namespace's policy."""

    async def call(admin: AsyncAdmin) -> None:
        _show_namespace(await admin.namespace(namespace), json_out)

    _admin("namespaces get", service_addr, call)


MaxTopics = Annotated[int | None, typer.Option(min=0, help="Topics it may hold.")]
RetentionMinutes = Annotated[int | None, typer.Option(min=1)]
RetentionMb = Annotated[int | None, typer.Option(min=1)]


def _policy(
    max_topics: int | None,
    retention_minutes: int | None,
    retention_mb: int | None,
    replication_factor: int | None,
    min_insync_replicas: int | None,
    policy: list[str] | None = None,
) -> dict[str, Any]:
    """The namespace policy fields given on the command line (the rest are left out)."""
    given: dict[str, Any] = {
        "max_topics": max_topics,
        "replication_factor": replication_factor,
        "min_insync_replicas": min_insync_replicas,
        "policies": parse_policies(policy),
    }
    if retention_minutes is not None or retention_mb is not None:
        from danube.client import Retention

        given["retention"] = Retention(time_minutes=retention_minutes, size_mb=retention_mb)
    return {key: value for key, value in given.items() if value is not None}


@namespaces.command("create")
def namespaces_create(
    namespace: str,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    max_topics: MaxTopics = None,
    retention_minutes: RetentionMinutes = None,
    retention_mb: RetentionMb = None,
    replication_factor: ReplicationFactor = None,
    min_insync_replicas: MinInsync = None,
    policy: PolicyOption = None,
    json_out: Json = False,
) -> None:
    """Create a namespace (idempotent; 409 if it exists with another policy); the
    replication options and policies are the defaults of its topics."""
    given = _policy(
        max_topics,
        retention_minutes,
        retention_mb,
        replication_factor,
        min_insync_replicas,
        policy,
    )

    async def call(admin: AsyncAdmin) -> None:
        _show_namespace(await admin.create_namespace(namespace, **given), json_out)

    _admin("namespaces create", service_addr, call)


@namespaces.command("update")
def namespaces_update(
    namespace: str,
    service_addr: ServiceAddr = "http://127.0.0.1:8080",
    max_topics: MaxTopics = None,
    retention_minutes: RetentionMinutes = None,
    retention_mb: RetentionMb = None,
    replication_factor: ReplicationFactor = None,
    min_insync_replicas: MinInsync = None,
    policy: PolicyOption = None,
    json_out: Json = False,
) -> None:
    """Change a namespace's policy (only the options given; ``--policy KEY=none`` unsets
    one); its topics that set none of their own follow it."""
    changes = _policy(
        max_topics,
        retention_minutes,
        retention_mb,
        replication_factor,
        min_insync_replicas,
        policy,
    )

    async def call(admin: AsyncAdmin) -> None:
        _show_namespace(await admin.update_namespace(namespace, **changes), json_out)

    _admin("namespaces update", service_addr, call)


@namespaces.command("delete")
def namespaces_delete(namespace: str, service_addr: ServiceAddr = "http://127.0.0.1:8080") -> None:
    """Delete an empty namespace."""

    async def call(admin: AsyncAdmin) -> None:
        await admin.delete_namespace(namespace)
        err.print(f"deleted namespace {namespace}")

    _admin("namespaces delete", service_addr, call)
