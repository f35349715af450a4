"""`danube`: the command that runs, feeds and inspects the mesh."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from danube.cli import admin, backfill, bench, elastic, schemas, secure_setup, security
from danube.cli import up as up_command
from danube.cli._common import CaFile, CertFile, KeyFile, TokenOption, set_token, use_client_tls
from danube.cli.consume import consume
from danube.cli.produce import produce

app = typer.Typer(
    name="danube",
    help="Danube mesh: a pub/sub broker as services over a NATS bus.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
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


@app.command()
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
    raise typer.Exit(
        up_command.run(config=config, data_dir=data_dir, scale=scale or [], secure=secure)
    )


app.command()(produce)
app.command()(consume)
app.add_typer(admin.app, name="admin")
# `danube admin partitions reassign|...` and `danube admin nodes drain|...` (cli/elastic.py).
elastic.register(admin.partitions)
admin.app.add_typer(elastic.nodes, name="nodes")
app.add_typer(schemas.app, name="schemas")
# `danube admin topics schema get|set` (kept in cli/schemas.py, next to the registry's).
admin.topics.add_typer(schemas.topic_schema, name="schema")
# `danube admin security roles|bindings|api-keys|tokens` (cli/security.py).
admin.app.add_typer(security.app, name="security")
# `danube admin security init|etcd-setup`: a secured deployment's files (cli/secure_setup.py).
security.app.command("init")(secure_setup.init)
security.app.command("etcd-setup")(secure_setup.etcd_setup)
app.add_typer(bench.app, name="bench")
app.add_typer(backfill.app, name="backfill")


def main() -> None:
    """Console-script entry point."""
    app()
