"""Errors of ``danube.schemas``: a definition that does not parse, a mode or type unknown.

::

    DanubeError
    └── SchemaError              "schema_error"
        └── InvalidSchemaError   "invalid_schema": schema_type, location, reason

``location`` points into the definition: a JSON path (``$.fields[2].type`` for Avro,
``$.properties.age.type`` for JSON Schema), ``line:col`` for text that is not JSON, or
protoc's ``file:line:col`` for a ``.proto``.
"""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind


class SchemaError(DanubeError):
    """Root of the schema errors."""

    code = "schema_error"
    kind = ErrorKind.INVALID


class InvalidSchemaError(SchemaError):
    """A definition that does not parse, or breaks its type's rules."""

    code = "invalid_schema"

    def __init__(self, *, schema_type: str, location: str, reason: str) -> None:
        super().__init__(f"invalid {schema_type} schema at {location}: {reason}")
        self.schema_type = schema_type
        self.location = location
        self.reason = reason
