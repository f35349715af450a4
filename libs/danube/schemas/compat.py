"""Compatibility modes, and the check of a new definition against earlier versions.

========================= ===========================================================
mode                      the new version must...
========================= ===========================================================
``none``                  (nothing is checked)
``backward``              read data written with the latest version (new reader, old
                          writer): consumers upgrade first
``forward``               be readable by the latest version (old reader, new writer):
                          producers upgrade first
``full``                  both, with the latest version
``*_transitive``          the same, with every earlier version, not only the latest
========================= ===========================================================

What "read" means is each type's: Avro's schema resolution (:mod:`danube.schemas.avro`),
the JSON Schema subset of :mod:`danube.schemas.json_schema`, the protobuf wire rules of
:mod:`danube.schemas.protobuf` (which do not depend on the direction). bytes, string and
number have no structure: any two versions of one of them are compatible. A version of
another type than the one it is checked against fails with ``type_changed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

from danube.config.model import CompatibilityModeName
from danube.schemas import avro, json_schema, protobuf
from danube.schemas.errors import SchemaError
from danube.schemas.types import ParsedSchema

CompatibilityMode = CompatibilityModeName

COMPATIBILITY_MODES: tuple[CompatibilityMode, ...] = get_args(CompatibilityMode)


def compatibility_mode_of(value: str) -> CompatibilityMode:
    """``value`` as a :data:`CompatibilityMode` (any case); :class:`SchemaError`
    (``invalid_mode``)."""
    for known in COMPATIBILITY_MODES:
        if value.lower() == known:
            return known
    raise SchemaError(
        f"compatibility mode {value!r} is not one of {list(COMPATIBILITY_MODES)}",
        code="invalid_mode",
    )


def reads(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """The failed rules for a reader of ``reader`` reading data of ``writer`` (same type)."""
    if reader.schema_type == "avro":
        return avro.can_read(reader.model, writer.model)
    if reader.schema_type == "json_schema":
        return json_schema.accepts_all(reader.model, writer.model)
    return []


def check_compatibility(
    new: ParsedSchema, previous: Sequence[tuple[int, ParsedSchema]], mode: str
) -> tuple[bool, list[str]]:
    """Whether ``new`` may follow ``previous`` (``(version, schema)``, oldest first) under
    ``mode``; the errors each say the version, the direction, the rule and where."""
    checked = compatibility_mode_of(mode)
    if checked == "none" or not previous:
        return True, []
    against = previous if checked.endswith("_transitive") else previous[-1:]
    base = checked.removesuffix("_transitive")
    errors: list[str] = []
    for version, old in against:
        if old.schema_type != new.schema_type:
            errors.append(
                f"version {version}: type_changed at $: {old.schema_type} -> {new.schema_type}"
            )
            continue
        if new.schema_type == "protobuf":
            for error in protobuf.wire_compatible(old.model, new.model):
                errors.append(f"version {version}: {error}")
            continue
        if base in ("backward", "full"):
            errors += [f"version {version} (backward): {e}" for e in reads(new, old)]
        if base in ("forward", "full"):
            errors += [f"version {version} (forward): {e}" for e in reads(old, new)]
    return not errors, errors
