"""The schema registry routes of the HTTP API (docs/schemas.md): subjects, versions,
compatibility checks, modes, and the binding of topics to subjects.

Reached as ``client.schemas`` (:class:`AsyncSchemas`). Reads and idempotent writes
(``PUT``, and a registration: the same definition twice is the same version) are retried
on 429, 503 and transport failures; a ``DELETE`` is tried once.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from pydantic import ConfigDict, Field

from danube.client._answers import parse_answer as _parse
from danube.client._http import Answer, HttpCore
from danube.client.errors import InvalidArgumentError
from danube.client.messages import topic_name, topic_path

# Re-exported: the SDK's callers (danube.client.sync) name a binding's policy from here.
from danube.meta.records import SchemaTypeName
from danube.meta.records import ValidationPolicy as ValidationPolicy
from danube.names import InvalidNameError, TopicName, validate_subject
from danube.wire.api import schemas as api

SchemaType = SchemaTypeName  # the SDK's name of a schema's type

# The answers are danube.wire.api's, as in danube.client.subscriptions: each model here
# subclasses the one the server answers with and states only what a client tolerates beyond
# it (a field an older server may leave out, ``str`` for a value a newer server may add).


class Registered(api.RegisteredOut):
    """A registration's answer: ``is_new_version`` False when the subject had the
    definition already (same fingerprint)."""


class SchemaVersion(api.SchemaVersionOut):
    """One version of a subject; ``definition`` is the schema text as registered."""

    model_config = ConfigDict(populate_by_name=True)

    schema_type: str  # type: ignore[assignment]  # a newer server's types too
    description: str = ""
    created_by: str = ""
    tags: list[str] = Field(default_factory=list)
    compatibility_mode: str  # type: ignore[assignment]  # a newer server's modes too


class Compatibility(api.CompatibilityOut):
    """Whether a definition could be registered; each error names the version, the
    direction, the failed rule and where."""

    mode: str  # type: ignore[assignment]  # a newer server's modes too
    errors: list[str] = Field(default_factory=list)


class TopicSchema(api.TopicSchemaOut):
    """A topic's binding to a subject, with its validation policy."""


class _Versions(api.SchemaVersionList):
    subject: str = ""
    versions: list[SchemaVersion]


class _Subjects(api.SubjectList):
    """Every subject's name."""


class _Mode(api.ModeOut):
    subject: str = ""
    mode: str  # type: ignore[assignment]  # a newer server's modes too


def _subject(subject: str) -> str:
    try:
        return quote(validate_subject(subject), safe="")
    except InvalidNameError as exc:
        raise InvalidArgumentError(exc.message, code=exc.code) from exc


def _topic(topic: str | TopicName) -> str:
    return topic_path(topic_name(topic))


def _text(definition: str | bytes) -> str:
    return definition.decode("utf-8") if isinstance(definition, bytes) else definition


class AsyncSchemas:
    """The schema registry through one server."""

    def __init__(self, http: HttpCore) -> None:
        self._http = http

    async def _call(self, method: str, path: str, body: Any = None) -> Answer:
        if method == "DELETE":
            return await self._http.request(method, path, body=body)
        return await self._http.request_retrying(
            method, path, body=body, timeout_s=self._http.timeout_s
        )

    async def subjects(self) -> list[str]:
        """Every subject."""
        return _parse(_Subjects, (await self._call("GET", "/v1/schemas")).body, "subjects").subjects

    async def register(
        self,
        subject: str,
        schema_type: SchemaType,
        definition: str | bytes,
        *,
        description: str = "",
        created_by: str = "",
        tags: list[str] | None = None,
    ) -> Registered:
        """Register a version of ``subject``; BadRequestError ``invalid_schema`` (saying
        where), ConflictError ``incompatible_schema`` (listing the failed rules)."""
        body = {
            "schema_type": schema_type,
            "schema": _text(definition),
            "description": description,
            "created_by": created_by,
            "tags": tags or [],
        }
        answer = await self._call("POST", f"/v1/schemas/{_subject(subject)}/versions", body)
        return _parse(Registered, answer.body, "register")

    async def get(self, schema_id: int, version: int | None = None) -> SchemaVersion:
        """A version by schema id (the latest live one when ``version`` is None)."""
        query = "" if version is None else f"?version={int(version)}"
        answer = await self._call("GET", f"/v1/schemas/ids/{int(schema_id)}{query}")
        return _parse(SchemaVersion, answer.body, "get schema")

    async def latest(self, subject: str) -> SchemaVersion:
        """The subject's newest live version."""
        answer = await self._call("GET", f"/v1/schemas/{_subject(subject)}/versions/latest")
        return _parse(SchemaVersion, answer.body, "latest schema")

    async def version(self, subject: str, version: int, *, deleted: bool = False) -> SchemaVersion:
        """One version of the subject (a deleted one only with ``deleted``)."""
        query = "?deleted=true" if deleted else ""
        path = f"/v1/schemas/{_subject(subject)}/versions/{int(version)}{query}"
        return _parse(SchemaVersion, (await self._call("GET", path)).body, "schema version")

    async def versions(self, subject: str) -> list[SchemaVersion]:
        """The subject's live versions, oldest first."""
        answer = await self._call("GET", f"/v1/schemas/{_subject(subject)}/versions")
        return _parse(_Versions, answer.body, "schema versions").versions

    async def check(
        self,
        subject: str,
        schema_type: SchemaType,
        definition: str | bytes,
        *,
        mode: str | None = None,
    ) -> Compatibility:
        """Whether ``definition`` could be registered now (with ``mode``, or the subject's)."""
        body: dict[str, Any] = {"schema_type": schema_type, "schema": _text(definition)}
        if mode is not None:
            body["mode"] = mode
        path = f"/v1/schemas/{_subject(subject)}/compatibility"
        return _parse(Compatibility, (await self._call("POST", path, body)).body, "check")

    async def delete_version(self, subject: str, version: int) -> None:
        """Soft-delete a version (it stays readable by id and version)."""
        await self._call("DELETE", f"/v1/schemas/{_subject(subject)}/versions/{int(version)}")

    async def mode(self, subject: str) -> str:
        """The subject's compatibility mode."""
        answer = await self._call("GET", f"/v1/schemas/{_subject(subject)}/mode")
        return _parse(_Mode, answer.body, "mode").mode

    async def set_mode(self, subject: str, mode: str) -> str:
        """Set the subject's compatibility mode."""
        answer = await self._call("PUT", f"/v1/schemas/{_subject(subject)}/mode", {"mode": mode})
        return _parse(_Mode, answer.body, "set mode").mode

    async def topic_schema(self, topic: str | TopicName) -> TopicSchema:
        """The topic's binding; NotFoundError ``topic_schema_not_found``."""
        answer = await self._call("GET", f"/v1/topics/{_topic(topic)}/schema")
        return _parse(TopicSchema, answer.body, "topic schema")

    async def bind_topic(
        self,
        topic: str | TopicName,
        subject: str,
        *,
        validation_policy: ValidationPolicy = "none",
        payload_validation: bool = False,
    ) -> TopicSchema:
        """Bind the topic to a subject with a validation policy."""
        body = {
            "subject": subject,
            "validation_policy": validation_policy,
            "payload_validation": payload_validation,
        }
        answer = await self._call("PUT", f"/v1/topics/{_topic(topic)}/schema", body)
        return _parse(TopicSchema, answer.body, "bind topic")

    async def update_topic_policy(
        self,
        topic: str | TopicName,
        *,
        validation_policy: ValidationPolicy,
        payload_validation: bool,
    ) -> TopicSchema:
        """Change a bound topic's validation policy."""
        body = {"validation_policy": validation_policy, "payload_validation": payload_validation}
        # PATCH sets fields to given values: the same call twice is the same state.
        answer = await self._http.request_retrying(
            "PATCH", f"/v1/topics/{_topic(topic)}/schema", body=body, timeout_s=self._http.timeout_s
        )
        return _parse(TopicSchema, answer.body, "update topic policy")

    async def unbind_topic(self, topic: str | TopicName) -> None:
        """Remove the topic's binding."""
        await self._call("DELETE", f"/v1/topics/{_topic(topic)}/schema")
