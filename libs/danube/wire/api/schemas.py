"""The answers of the schema registry's HTTP routes (docs/http-api.md, docs/schemas.md):
registrations, versions, compatibility checks, modes and a topic's binding."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from danube.config.model import CompatibilityModeName
from danube.meta.records import SchemaTypeName, ValidationPolicy


class _Response(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class RegisteredOut(_Response):
    schema_id: int
    version: int
    is_new_version: bool
    fingerprint: str


class SchemaVersionOut(_Response):
    """One version of a subject; ``schema`` is the definition as registered."""

    subject: str
    schema_id: int
    version: int
    schema_type: SchemaTypeName
    definition: str = Field(alias="schema", serialization_alias="schema")
    fingerprint: str
    description: str
    created_by: str
    created_ms: int
    tags: list[str]
    compatibility_mode: CompatibilityModeName
    deleted: bool = False


class SchemaVersionList(_Response):
    subject: str
    versions: Sequence[SchemaVersionOut]


class SubjectList(_Response):
    subjects: list[str]


class CompatibilityOut(_Response):
    """Whether the definition could be registered; each error names the version compared
    with, the direction, the failed rule and where."""

    compatible: bool
    mode: CompatibilityModeName
    errors: list[str]


class ModeOut(_Response):
    subject: str
    mode: CompatibilityModeName


class TopicSchemaOut(_Response):
    topic: str
    subject: str
    schema_id: int
    validation_policy: ValidationPolicy
    payload_validation: bool
    updated_ms: int
