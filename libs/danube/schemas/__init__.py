"""Schemas: the types a topic's payloads may have, parsing, fingerprints, compatibility
checks and payload validators. Pure logic, no I/O (protobuf definitions are compiled by
protoc in a child process). docs/schemas.md tells what each check checks.

- :func:`parse_schema` → :class:`ParsedSchema` (canonical form, fingerprint), or
  :class:`InvalidSchemaError` pointing into the definition;
- :func:`check_compatibility` under a :data:`CompatibilityMode`;
- :func:`compile_validator` → ``check(payload) -> None | "<path>: <error>"``.
"""

from danube.schemas.compat import (
    COMPATIBILITY_MODES,
    CompatibilityMode,
    check_compatibility,
    compatibility_mode_of,
)
from danube.schemas.errors import InvalidSchemaError, SchemaError
from danube.schemas.types import (
    DEFINITION_BYTES_MAX,
    SCHEMA_TYPES,
    ParsedSchema,
    SchemaType,
    parse_schema,
    schema_type_of,
)
from danube.schemas.validate import Validator, compile_validator

__all__ = [
    "COMPATIBILITY_MODES",
    "DEFINITION_BYTES_MAX",
    "SCHEMA_TYPES",
    "CompatibilityMode",
    "InvalidSchemaError",
    "ParsedSchema",
    "SchemaError",
    "SchemaType",
    "Validator",
    "check_compatibility",
    "compatibility_mode_of",
    "compile_validator",
    "parse_schema",
    "schema_type_of",
]
