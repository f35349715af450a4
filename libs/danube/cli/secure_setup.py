"""`danube admin security init` and `etcd-setup`: what a secured deployment (docker compose,
Kubernetes, any other machine) runs once before the mesh starts. The same functions
`danube up --secure` uses (danube.up.secure), so every way of running the mesh
secured gets the same files and the same etcd users."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from danube.cli._common import EXIT_ERROR, EXIT_USAGE, err
from danube.cli.security import parse_ttl

if TYPE_CHECKING:
    # The settings, etcd and PKI modules load when one of these commands runs (about
    # 0.2 s), not for every `danube` command: see danube.cli.main.
    from danube.config import DanubeSettings

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar="DANUBE_CONFIG",
        help="The mesh's YAML config (bus.subject_prefix, security.issuer/audience, "
        "wal_cloud.metadata); DANUBE_* variables apply on top.",
    ),
]
DirOption = Annotated[
    Path, typer.Option("--dir", help="Where the files are (made 0700; secrets 0600).")
]


def _settings(config: Path | None) -> DanubeSettings:
    from danube.config import ConfigError, load_settings

    try:
        return load_settings(config)
    except ConfigError as exc:
        err.print(f"danube admin security: {exc}")
        raise typer.Exit(EXIT_USAGE) from None


def init(
    dir: DirOption,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="A name or address the server certificate covers, besides loopback's "
            "(repeatable): e.g. the compose service `discovery`, a Service's DNS names.",
        ),
    ] = None,
    token_ttl: Annotated[str, typer.Option(help="Lifetime of admin.token.")] = "7d",
    signing_kid: Annotated[
        str | None,
        typer.Option(
            help="Id of the signing key when DIR/keys has none: it is made as "
            "keys/<id>.pem (default: k<UTC time>-<hex>). A fixed id lets a manifest name "
            "the file (deploy/kubernetes/overlays/dev)."
        ),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Lay out what a secured mesh needs in DIR, keeping what is there: NATS passwords per
    service kind and nats.conf, etcd root and mesh passwords, a CA with a server and an
    admin client certificate, a token signing key, and a fresh admin token."""
    from danube.config import ConfigError
    from danube.security.pki import PkiError
    from danube.up.secure import ensure_secure_files

    settings = _settings(config)
    ttl_s = parse_ttl(token_ttl)
    try:
        files = ensure_secure_files(
            dir,
            hosts=host or [],
            subject_prefix=settings.bus.subject_prefix,
            issuer=settings.security.issuer,
            audience=settings.security.audience,
            admin_token_ttl_s=ttl_s,
            signing_kid=signing_kid,
        )
    except (OSError, ValueError, ConfigError, PkiError) as exc:
        err.print(f"danube admin security init: {exc}")
        raise typer.Exit(EXIT_ERROR) from None
    err.print(f"secured mesh files in {files.credentials.dir}")
    err.print(f"  nats-server config: {files.nats_config}")
    err.print(f"  CA: {files.pki.ca.cert}; server certificate: {files.pki.server.cert}")
    err.print(
        f"  signing keys: {files.keys_dir} (their public halves: {files.verify_keys_dir}); "
        f"admin token: {files.admin_token_file}"
    )


def etcd_setup(
    dir: DirOption,
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="etcd's HOST:PORT, or several members comma-separated "
            "(default: wal_cloud.metadata.etcd_endpoints)."
        ),
    ] = None,
    prefix: Annotated[
        str | None,
        typer.Option(help="The mesh's key prefix (default: wal_cloud.metadata.prefix)."),
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Deadline of each etcd call.")] = 10.0,
    config: ConfigOption = None,
) -> None:
    """Turn etcd's authentication on with the passwords in DIR (made by `init`; only
    etcd-root.password and etcd-mesh.password are read): users root and danube-mesh
    (read-write on the prefix only). Idempotent: run again, it logs in as
    root and takes over changed passwords."""
    import asyncio

    from danube.config import ConfigError
    from danube.meta.errors import MetaError
    from danube.up.secure import ETCD_MESH_USER, MeshCredentials, enable_etcd_auth

    metadata = _settings(config).wal_cloud.metadata
    target = endpoint or ",".join(metadata.etcd_endpoints)
    key_prefix = prefix or metadata.prefix
    credentials = MeshCredentials(dir)
    missing = [str(path) for path in credentials.etcd_files() if not path.is_file()]
    if missing:
        err.print(f"danube admin security etcd-setup: run `init` first; missing {missing[0]}")
        raise typer.Exit(EXIT_USAGE)
    call = enable_etcd_auth(target, credentials, prefix=key_prefix, timeout_s=timeout_s)
    try:
        asyncio.run(call)
    except (MetaError, ConfigError) as exc:
        err.print(f"danube admin security etcd-setup: {target}: {exc}")
        raise typer.Exit(EXIT_ERROR) from None
    err.print(f"etcd {target}: auth on; user {ETCD_MESH_USER} may read and write {key_prefix}")
