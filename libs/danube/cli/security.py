"""`danube admin security`: roles, bindings and API keys over the HTTP API (ManageCluster),
and tokens signed here with the cluster's key file (no server needed), as Danube's
``danube-admin security`` does."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from danube.cli._common import Json, ServiceAddr, connect, err, out, print_json, run
from danube.client.permissions import PERMISSIONS, Scope

if TYPE_CHECKING:
    from danube.client.security import AsyncSecurity

app = typer.Typer(help="Roles, bindings, API keys and tokens.", no_args_is_help=True)
roles = typer.Typer(help="Named sets of permissions.", no_args_is_help=True)
bindings = typer.Typer(help="Roles granted to a principal at a scope.", no_args_is_help=True)
api_keys = typer.Typer(help="API keys, exchanged for short-lived tokens.", no_args_is_help=True)
tokens = typer.Typer(help="Sign tokens with the cluster's key (offline).", no_args_is_help=True)
app.add_typer(roles, name="roles")
app.add_typer(bindings, name="bindings")
app.add_typer(api_keys, name="api-keys")
app.add_typer(tokens, name="tokens")

SECURITY_TIMEOUT_S = 5.0
_TTL = re.compile(r"(\d+)([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}
Addr = ServiceAddr


def parse_ttl(value: str) -> int:
    """``90``, ``90s``, ``15m``, ``24h``, ``365d`` in seconds."""
    match = _TTL.fullmatch(value.strip())
    if match is None or int(match.group(1)) == 0:
        raise typer.BadParameter(f"a duration such as 3600, 15m, 24h or 30d, not {value!r}")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def _security(command: str, url: str, call: Callable[[AsyncSecurity], Awaitable[None]]) -> None:
    async def main() -> None:
        async with connect(url, timeout_s=SECURITY_TIMEOUT_S) as client:
            await call(client.security)

    run(f"admin security {command}", main())


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


# --- roles -------------------------------------------------------------------------------


@roles.command("create")
def roles_create(
    name: str,
    permissions: Annotated[
        str, typer.Option(help=f"Comma-separated, of: {', '.join(PERMISSIONS)}.")
    ],
    service_addr: Addr = "http://127.0.0.1:8080",
) -> None:
    """Create a role (or replace its permissions)."""
    wanted = _split(permissions)
    unknown = [p for p in wanted if p not in PERMISSIONS]
    if unknown or not wanted:
        raise typer.BadParameter(
            f"unknown permission(s) {', '.join(unknown)}; valid: {', '.join(PERMISSIONS)}",
            param_hint="--permissions",
        )

    async def call(security: AsyncSecurity) -> None:
        role = await security.create_role(name, wanted)
        err.print(f"role {role.name}: {', '.join(role.permissions)}")

    _security("roles create", service_addr, call)


@roles.command("list")
def roles_list(service_addr: Addr = "http://127.0.0.1:8080", json_out: Json = False) -> None:
    """Every role."""

    async def call(security: AsyncSecurity) -> None:
        found = await security.roles()
        if json_out:
            print_json([r.model_dump() for r in found])
            return
        table = Table("role", "permissions")
        for role in found:
            table.add_row(role.name, ", ".join(role.permissions))
        out.print(table)

    _security("roles list", service_addr, call)


@roles.command("delete")
def roles_delete(name: str, service_addr: Addr = "http://127.0.0.1:8080") -> None:
    """Delete a role no binding uses."""

    async def call(security: AsyncSecurity) -> None:
        await security.delete_role(name)
        err.print(f"role {name} deleted")

    _security("roles delete", service_addr, call)


# --- bindings ----------------------------------------------------------------------------


@bindings.command("create")
def bindings_create(
    binding_id: Annotated[str, typer.Argument(metavar="ID", help="The binding's name.")],
    principal: Annotated[str, typer.Option(help="Token subject or certificate subject.")],
    roles_: Annotated[str, typer.Option("--roles", help="Comma-separated role names.")],
    scope: Annotated[str, typer.Option(help="cluster, namespace or topic.")] = "cluster",
    resource: Annotated[
        str, typer.Option(help="The namespace, or /<ns>/<topic> (nothing for cluster).")
    ] = "",
    service_addr: Addr = "http://127.0.0.1:8080",
) -> None:
    """Grant roles to a principal at a scope (create or replace)."""
    if scope not in ("cluster", "namespace", "topic"):
        raise typer.BadParameter("cluster, namespace or topic", param_hint="--scope")
    at: Scope = scope  # type: ignore[assignment]

    async def call(security: AsyncSecurity) -> None:
        made = await security.create_binding(
            binding_id, principal=principal, roles=_split(roles_), scope=at, resource=resource
        )
        where = made.scope if made.scope == "cluster" else f"{made.scope} {made.resource}"
        err.print(f"binding {made.id}: {made.principal} has {', '.join(made.roles)} on {where}")

    _security("bindings create", service_addr, call)


@bindings.command("list")
def bindings_list(
    principal: Annotated[str | None, typer.Option(help="Only this principal's.")] = None,
    service_addr: Addr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Every binding (or a principal's)."""

    async def call(security: AsyncSecurity) -> None:
        found = await security.bindings(principal=principal)
        if json_out:
            print_json([b.model_dump() for b in found])
            return
        table = Table("id", "principal", "roles", "scope", "resource")
        for b in found:
            table.add_row(b.id, b.principal, ", ".join(b.roles), b.scope, b.resource)
        out.print(table)

    _security("bindings list", service_addr, call)


@bindings.command("delete")
def bindings_delete(
    binding_id: Annotated[str, typer.Argument(metavar="ID")],
    service_addr: Addr = "http://127.0.0.1:8080",
) -> None:
    """Delete a binding: its grants end at once."""

    async def call(security: AsyncSecurity) -> None:
        await security.delete_binding(binding_id)
        err.print(f"binding {binding_id} deleted")

    _security("bindings delete", service_addr, call)


# --- API keys ----------------------------------------------------------------------------


@api_keys.command("create")
def api_keys_create(
    principal: Annotated[str, typer.Option(help="Whom the key stands for.")],
    description: Annotated[str, typer.Option(help="What it is for.")] = "",
    expires: Annotated[
        str | None, typer.Option(help="Lifetime (30d, 24h...); none: until revoked.")
    ] = None,
    service_addr: Addr = "http://127.0.0.1:8080",
    json_out: Json = False,
) -> None:
    """Make an API key; it is printed once (only its hash is stored)."""
    expires_s = None if expires is None else parse_ttl(expires)

    async def call(security: AsyncSecurity) -> None:
        made = await security.create_api_key(
            principal, description=description, expires_s=expires_s
        )
        if json_out:
            print_json(made.model_dump())
            return
        out.print(made.api_key)
        err.print(f"API key {made.id} for {made.principal}: shown this once, keep it safe")

    _security("api-keys create", service_addr, call)


@api_keys.command("list")
def api_keys_list(service_addr: Addr = "http://127.0.0.1:8080", json_out: Json = False) -> None:
    """Every API key (never the key itself)."""

    async def call(security: AsyncSecurity) -> None:
        found = await security.api_keys()
        if json_out:
            print_json([k.model_dump() for k in found])
            return
        table = Table("id", "principal", "expires_ms", "description")
        for key in found:
            table.add_row(key.id, key.principal, str(key.expires_ms or "-"), key.description)
        out.print(table)

    _security("api-keys list", service_addr, call)


@api_keys.command("revoke")
def api_keys_revoke(key_id: str, service_addr: Addr = "http://127.0.0.1:8080") -> None:
    """Revoke an API key."""

    async def call(security: AsyncSecurity) -> None:
        await security.revoke_api_key(key_id)
        err.print(f"API key {key_id} revoked")

    _security("api-keys revoke", service_addr, call)


# --- tokens ------------------------------------------------------------------------------


@tokens.command("create")
def tokens_create(
    principal: Annotated[str, typer.Option(help="The token's subject (sub).")],
    keys_dir: Annotated[
        Path,
        typer.Option(
            envvar="DANUBE_SECURITY__KEYS_DIR",
            help="The cluster's key directory (security.keys_dir).",
        ),
    ],
    ttl: Annotated[str, typer.Option(help="Lifetime: 3600, 15m, 24h, 30d.")] = "24h",
    kid: Annotated[str | None, typer.Option(help="Key id to sign with (default: newest).")] = None,
    issuer: Annotated[
        str, typer.Option(envvar="DANUBE_SECURITY__ISSUER", help="security.issuer")
    ] = "danube",
    audience: Annotated[
        str, typer.Option(envvar="DANUBE_SECURITY__AUDIENCE", help="security.audience")
    ] = "danube",
) -> None:
    """Sign a token locally with the cluster's private key; prints the token."""
    from danube.security import issue_token, load_keys

    try:
        keys = load_keys(keys_dir, signing_kid=kid)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--keys-dir") from None
    if keys.signing is None:
        raise typer.BadParameter(f"no private key in {keys_dir}", param_hint="--keys-dir")
    token = issue_token(keys.signing, principal, parse_ttl(ttl), issuer=issuer, audience=audience)
    out.print(token)


@tokens.command("exchange")
def tokens_exchange(
    api_key: Annotated[str, typer.Option(envvar="DANUBE_API_KEY", help="The API key.")],
    ttl: Annotated[str | None, typer.Option(help="Lifetime asked for (capped).")] = None,
    service_addr: Addr = "http://127.0.0.1:8080",
) -> None:
    """Exchange an API key for a short-lived token (POST /v1/auth/token); prints it."""
    ttl_s = None if ttl is None else parse_ttl(ttl)

    async def call(security: AsyncSecurity) -> None:
        token = await security.token(api_key, ttl_s=ttl_s)
        out.print(token.token)

    _security("tokens exchange", service_addr, call)
