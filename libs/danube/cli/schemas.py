"""`danube schemas ...` (the schema registry) and `danube admin topics schema get|set` (a
topic's binding), through the HTTP API (docs/schemas.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from danube.cli._common import Json, ServiceAddr, connect, err, out, print_json, run

if TYPE_CHECKING:
    from danube.client.schemas import AsyncSchemas, SchemaVersion

# Each request, retries included (an unreachable server fails within this).
SCHEMAS_TIMEOUT_S = 10.0
DEFAULT_ADDR = "http://127.0.0.1:8080"

app = typer.Typer(
    help="The schema registry: register, get, list, check, delete, modes.", no_args_is_help=True
)
topic_schema = typer.Typer(
    help="A topic's schema subject and validation policy.", no_args_is_help=True
)


class SchemaType(StrEnum):
    bytes = "bytes"
    string = "string"
    number = "number"
    json_schema = "json_schema"
    avro = "avro"
    protobuf = "protobuf"


class Mode(StrEnum):
    none = "none"
    backward = "backward"
    forward = "forward"
    full = "full"
    backward_transitive = "backward_transitive"
    forward_transitive = "forward_transitive"
    full_transitive = "full_transitive"


class Policy(StrEnum):
    none = "none"
    warn = "warn"
    enforce = "enforce"


SubjectArg = Annotated[str, typer.Argument(help="The subject (letters, digits, '.', '_', '-').")]
TypeOpt = Annotated[SchemaType, typer.Option("--type", "-T", help="The schema type.")]
FileOpt = Annotated[
    Path | None, typer.Option("--file", "-f", help="Read the definition from this file.")
]
SchemaOpt = Annotated[str | None, typer.Option("--schema", help="The definition itself.")]


def _call(command: str, url: str, call: Callable[[AsyncSchemas], Awaitable[int | None]]) -> None:
    async def main() -> int | None:
        async with connect(url, timeout_s=SCHEMAS_TIMEOUT_S) as client:
            return await call(client.schemas)

    run(command, main())


def _definition(file: Path | None, schema: str | None, schema_type: SchemaType) -> str:
    if file is not None and schema is not None:
        raise typer.BadParameter("give --file or --schema, not both")
    if file is not None:
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise typer.BadParameter(f"cannot read {file}: {exc}", param_hint="--file") from exc
    if schema is not None:
        return schema
    if schema_type in (SchemaType.bytes, SchemaType.string, SchemaType.number):
        return ""
    raise typer.BadParameter("give the definition with --file or --schema")


def _show(found: SchemaVersion, json_out: bool) -> None:
    if json_out:
        print_json(found.model_dump(by_alias=True))
        return
    deleted = " (deleted)" if found.deleted else ""
    out.print(
        f"{found.subject} version {found.version}{deleted}: id {found.schema_id}, "
        f"{found.schema_type}, mode {found.compatibility_mode}, fingerprint {found.fingerprint}"
    )
    if found.description:
        out.print(f"description: {found.description}")
    out.print(found.definition, markup=False)


@app.command("register")
def register(
    subject: SubjectArg,
    schema_type: TypeOpt,
    file: FileOpt = None,
    schema: SchemaOpt = None,
    description: Annotated[str, typer.Option(help="What the schema is for.")] = "",
    created_by: Annotated[str, typer.Option(help="Who registers it.")] = "",
    tag: Annotated[list[str] | None, typer.Option("--tag", help="A tag (repeatable).")] = None,
    service_addr: ServiceAddr = DEFAULT_ADDR,
    json_out: Json = False,
) -> None:
    """Register a version of SUBJECT (the same definition again answers its version)."""
    definition = _definition(file, schema, schema_type)

    async def call(schemas: AsyncSchemas) -> None:
        done = await schemas.register(
            subject,
            schema_type.value,
            definition,
            description=description,
            created_by=created_by,
            tags=tag or [],
        )
        if json_out:
            print_json(done.model_dump())
            return
        what = "registered" if done.is_new_version else "already registered as"
        out.print(f"{subject}: {what} version {done.version} (schema id {done.schema_id})")

    _call("schemas register", service_addr, call)


@app.command("get")
def get(
    subject: Annotated[str | None, typer.Argument(help="The subject (or use --id).")] = None,
    version: Annotated[int | None, typer.Option("--version", "-v", min=1)] = None,
    schema_id: Annotated[int | None, typer.Option("--id", min=1, help="A schema id.")] = None,
    service_addr: ServiceAddr = DEFAULT_ADDR,
    json_out: Json = False,
) -> None:
    """A version of SUBJECT (the latest by default), or of the subject of --id."""
    if (subject is None) == (schema_id is None):
        raise typer.BadParameter("give a SUBJECT or --id")

    async def call(schemas: AsyncSchemas) -> None:
        if schema_id is not None:
            found = await schemas.get(schema_id, version)
        elif version is not None:
            found = await schemas.version(subject or "", version)
        else:
            found = await schemas.latest(subject or "")
        _show(found, json_out)

    _call("schemas get", service_addr, call)


@app.command("versions")
def versions(
    subject: SubjectArg, service_addr: ServiceAddr = DEFAULT_ADDR, json_out: Json = False
) -> None:
    """The live versions of SUBJECT."""

    async def call(schemas: AsyncSchemas) -> None:
        found = await schemas.versions(subject)
        if json_out:
            print_json([v.model_dump(by_alias=True) for v in found])
            return
        table = Table("version", "id", "type", "fingerprint", "created by", "description")
        for v in found:
            table.add_row(
                str(v.version),
                str(v.schema_id),
                v.schema_type,
                v.fingerprint[:16],
                v.created_by,
                v.description,
            )
        out.print(table)

    _call("schemas versions", service_addr, call)


@app.command("list")
def list_subjects(service_addr: ServiceAddr = DEFAULT_ADDR, json_out: Json = False) -> None:
    """Every subject."""

    async def call(schemas: AsyncSchemas) -> None:
        found = await schemas.subjects()
        if json_out:
            print_json(found)
        else:
            for name in found:
                out.print(name)

    _call("schemas list", service_addr, call)


@app.command("check")
def check(
    subject: SubjectArg,
    schema_type: TypeOpt,
    file: FileOpt = None,
    schema: SchemaOpt = None,
    mode: Annotated[Mode | None, typer.Option(help="Check with this mode.")] = None,
    service_addr: ServiceAddr = DEFAULT_ADDR,
    json_out: Json = False,
) -> None:
    """Whether a definition could be registered under SUBJECT (exit 1 when not)."""
    definition = _definition(file, schema, schema_type)

    async def call(schemas: AsyncSchemas) -> int:
        found = await schemas.check(
            subject,
            schema_type.value,
            definition,
            mode=None if mode is None else mode.value,
        )
        if json_out:
            print_json(found.model_dump())
        elif found.compatible:
            out.print(f"{subject}: compatible ({found.mode})")
        else:
            out.print(f"{subject}: incompatible ({found.mode})")
            for error in found.errors:
                out.print(f"  {error}", markup=False)
        return 0 if found.compatible else 1

    _call("schemas check", service_addr, call)


@app.command("delete")
def delete(
    subject: SubjectArg,
    version: Annotated[int, typer.Option("--version", "-v", min=1, help="The version.")],
    service_addr: ServiceAddr = DEFAULT_ADDR,
) -> None:
    """Soft-delete a version of SUBJECT (still readable by id and version)."""

    async def call(schemas: AsyncSchemas) -> None:
        await schemas.delete_version(subject, version)
        err.print(f"{subject}: version {version} deleted")

    _call("schemas delete", service_addr, call)


@app.command("mode")
def mode(
    subject: SubjectArg,
    set_to: Annotated[Mode | None, typer.Option("--set", help="Set the mode.")] = None,
    service_addr: ServiceAddr = DEFAULT_ADDR,
) -> None:
    """Show (or --set) the compatibility mode of SUBJECT."""

    async def call(schemas: AsyncSchemas) -> None:
        if set_to is None:
            out.print(await schemas.mode(subject))
        else:
            out.print(await schemas.set_mode(subject, set_to.value))

    _call("schemas mode", service_addr, call)


# --- danube admin topics schema ----------------------------------------------------------

TopicArg = Annotated[str, typer.Argument(help="/<namespace>/<topic>, or <topic> in default.")]


@topic_schema.command("get")
def topic_schema_get(
    topic: TopicArg, service_addr: ServiceAddr = DEFAULT_ADDR, json_out: Json = False
) -> None:
    """The subject TOPIC is bound to, and its validation policy."""

    async def call(schemas: AsyncSchemas) -> None:
        found = await schemas.topic_schema(topic)
        if json_out:
            print_json(found.model_dump())
            return
        out.print(
            f"{found.topic}: subject {found.subject} (schema id {found.schema_id}), "
            f"policy {found.validation_policy}, payload validation "
            f"{'on' if found.payload_validation else 'off'}"
        )

    _call("admin topics schema get", service_addr, call)


@topic_schema.command("set")
def topic_schema_set(
    topic: TopicArg,
    subject: Annotated[str, typer.Option("--subject", help="The subject to bind to.")],
    policy: Annotated[Policy, typer.Option("--policy", help="none, warn or enforce.")] = (
        Policy.none
    ),
    validate: Annotated[
        bool, typer.Option("--validate/--no-validate", help="Check payloads on produce.")
    ] = False,
    service_addr: ServiceAddr = DEFAULT_ADDR,
    json_out: Json = False,
) -> None:
    """Bind TOPIC to a subject with a validation policy."""

    async def call(schemas: AsyncSchemas) -> None:
        found = await schemas.bind_topic(
            topic,
            subject,
            validation_policy=policy.value,
            payload_validation=validate,
        )
        if json_out:
            print_json(found.model_dump())
        else:
            out.print(
                f"{found.topic}: bound to {found.subject} (schema id {found.schema_id}), "
                f"policy {found.validation_policy}"
            )

    _call("admin topics schema set", service_addr, call)
