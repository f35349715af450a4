"""`danube`: the command that runs, feeds and inspects the mesh.

Starting fast (docs/cli.md, "Start time"): the command modules import only typer and the
SDK's light modules at start, the rest (rich too) where it is used; and :func:`main` builds
only the group a command line names (`danube admin ...` never loads `bench` or `backfill`).
`app` is the whole command tree, built on first use, for tests and for the docs' checks."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from danube.cli._common import CaFile, CertFile, KeyFile, TokenOption, set_token, use_client_tls
from danube.cli.consume import consume
from danube.cli.produce import produce


def _root(
    ca_file: CaFile = None,
    cert_file: CertFile = None,
    key_file: KeyFile = None,
    token: TokenOption = None,
) -> None:
    """Danube mesh: a pub/sub broker as services over a NATS bus."""
    # The client commands connect with these (danube.cli._common.connect).
    use_client_tls(ca_file, cert_file, key_file)
    set_token(token)


def up(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML config file (default: $DANUBE_CONFIG)."),
    ] = None,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where etcd, the WALs and fs objects live.")
    ] = Path("danube-data"),
    scale: Annotated[
        list[str] | None,
        typer.Option("--scale", help="SERVICE=COUNT, e.g. --scale ingest=2 (repeatable)."),
    ] = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="Credentials for every service (made under DATA_DIR/secure), NATS subject "
            "permissions per service, etcd authentication (docs/security.md).",
        ),
    ] = False,
) -> None:
    """Run the whole mesh on this machine until Ctrl-C."""
    # Imported here: the supervisor, the settings and the mesh plan are for this command only.
    from danube.cli import up as up_command

    raise typer.Exit(
        up_command.run(config=config, data_dir=data_dir, scale=scale or [], secure=secure)
    )


# Each group's typer, wired once (its modules imported on first use).
@functools.cache
def _admin() -> typer.Typer:
    from danube.cli import admin, elastic, schemas, secure_setup, security

    # `danube admin partitions reassign|...` and `danube admin nodes drain|...` (cli/elastic.py).
    elastic.register(admin.partitions)
    admin.app.add_typer(elastic.nodes, name="nodes")
    # `danube admin topics schema get|set` (kept in cli/schemas.py, next to the registry's).
    admin.topics.add_typer(schemas.topic_schema, name="schema")
    # `danube admin security roles|bindings|api-keys|tokens` (cli/security.py).
    admin.app.add_typer(security.app, name="security")
    # `danube admin security init|etcd-setup`: a secured deployment's files (cli/secure_setup.py).
    security.app.command("init")(secure_setup.init)
    security.app.command("etcd-setup")(secure_setup.etcd_setup)
    return admin.app


def _schemas() -> typer.Typer:
    from danube.cli import schemas

    return schemas.app


def _bench() -> typer.Typer:
    # A package of its own beside the CLI (danube.bench): only this loads it.
    from danube.bench import app

    return app.app


def _backfill() -> typer.Typer:
    from danube.cli import backfill

    return backfill.app


_GROUPS: dict[str, Callable[[], typer.Typer]] = {
    "admin": _admin,
    "schemas": _schemas,
    "bench": _bench,
    "backfill": _backfill,
}
# What `danube --help` lists for a group it does not load: each module's own help
# (tests/unit/test_cli_start.py checks that the two root helps are the same).
_GROUP_HELP = {
    "admin": "Cluster, namespaces, topics and partitions.",
    "schemas": "The schema registry: register, get, list, check, delete, modes.",
    "bench": "Measure throughput and latency of a running mesh.",
    "backfill": "Backfills with Spark over the cloud tier: to Parquet, or into a topic.",
}
# The root's options that take a value: the word after one is not a command's name.
_ROOT_VALUE_OPTIONS = frozenset({"--ca-file", "--cert-file", "--key-file", "--token"})


def build_app(groups: Sequence[str] = tuple(_GROUPS)) -> typer.Typer:
    """The `danube` command with its own commands and the ``groups`` named; the other
    groups are listed by name and help only."""
    root = typer.Typer(
        name="danube",
        help="Danube mesh: a pub/sub broker as services over a NATS bus.",
        no_args_is_help=True,
        add_completion=False,
    )
    root.callback()(_root)
    root.command()(up)
    root.command()(produce)
    root.command()(consume)
    for name, load in _GROUPS.items():
        listed = typer.Typer(help=_GROUP_HELP[name], no_args_is_help=True)
        root.add_typer(load() if name in groups else listed, name=name)
    return root


def groups_of(args: Sequence[str]) -> tuple[str, ...]:
    """The groups a command line needs: the one it names, none for anything else
    (`up`, `produce`, `consume`, the root's `--help`, a typo: only their names are needed)."""
    words = iter(args)
    for word in words:
        if word in _ROOT_VALUE_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            return (word,) if word in _GROUPS else ()
    return ()


@functools.cache
def _whole_app() -> typer.Typer:
    return build_app()


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        return _whole_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point."""
    build_app(groups_of(sys.argv[1:]))()
