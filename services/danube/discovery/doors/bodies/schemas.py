"""The request bodies of the schema registry's HTTP routes (docs/http-api.md,
docs/schemas.md); the answers are :mod:`danube.wire.api.schemas`'s. Requests refuse unknown
fields and take JSON types as they are, like every request body."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from danube.config.model import CompatibilityModeName
from danube.meta.records import SCHEMA_TAGS_MAX, SchemaTypeName, ValidationPolicy
from danube.schemas import DEFINITION_BYTES_MAX

# Characters; the byte size of the UTF-8 definition is checked too (413 schema_too_large).
SCHEMA_CHARS_MAX = DEFINITION_BYTES_MAX


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SchemaIn(_Request):
    """``POST /v1/schemas/{subject}/versions``: a definition to register."""

    schema_type: SchemaTypeName
    # The definition as text: JSON for avro and json_schema, .proto text for protobuf.
    schema_: Annotated[str, Field(alias="schema", max_length=SCHEMA_CHARS_MAX)]
    description: Annotated[str, Field(max_length=4096)] = ""
    created_by: Annotated[str, Field(max_length=256)] = ""
    tags: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=128)]], Field(max_length=SCHEMA_TAGS_MAX)
    ] = Field(default_factory=list)


class CompatibilityIn(_Request):
    """``POST /v1/schemas/{subject}/compatibility``: a definition to check (with ``mode``,
    or the subject's)."""

    schema_type: SchemaTypeName
    schema_: Annotated[str, Field(alias="schema", max_length=SCHEMA_CHARS_MAX)]
    mode: CompatibilityModeName | None = None


class ModeIn(_Request):
    """``PUT /v1/schemas/{subject}/mode``."""

    mode: CompatibilityModeName


class TopicSchemaIn(_Request):
    """``PUT /v1/topics/{ns}/{topic}/schema``: bind the topic to a subject."""

    subject: Annotated[str, Field(min_length=1, max_length=255)]
    validation_policy: ValidationPolicy = "none"
    payload_validation: bool = False


class TopicPolicyIn(_Request):
    """``PATCH /v1/topics/{ns}/{topic}/schema``: change a bound topic's policy."""

    validation_policy: ValidationPolicy
    payload_validation: bool
