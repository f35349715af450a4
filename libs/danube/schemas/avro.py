"""Avro: parsing with fastavro, the fingerprint, and the schema-resolution rules.

A schema is parsed by :func:`fastavro.parse_schema`; when that fails, :func:`_locate`
parses the record fields one by one to say which field is wrong (``$.fields[1]`` or deeper).

Compatibility is Avro's schema resolution (the "Schema Resolution" section of the Avro
specification), decided on the parsed schemas rather than by trying to decode data:
:func:`can_read` answers whether a reader with schema ``reader`` reads every datum written
with ``writer``. The rules, each with the name a failure reports:

- ``type_mismatch``: the two are of different types, with these promotions allowed:
  int→long, float, double; long→float, double; float→double; string↔bytes.
- ``name_mismatch``: records, enums and fixed are matched by unqualified name (or a
  reader alias).
- ``fixed_size_mismatch``: fixed types of different sizes.
- ``enum_symbol_missing``: a symbol of the writer's enum the reader lacks (and the reader
  has no enum ``default``).
- ``reader_field_missing_default``: a reader field the writer lacks (by name or reader
  alias) and that has no default. A writer field the reader lacks is skipped: fine.
- ``union_branch_unreadable``: a writer union branch that no reader branch reads (when the
  writer is a union every branch must be readable; when only the reader is, the writer's
  type must match one of its branches).
- arrays and maps: their items and values by the same rules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import orjson
from fastavro import parse_schema
from fastavro.schema import UnknownType, to_parsing_canonical_form

from danube.schemas.errors import InvalidSchemaError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# writer type -> reader types it resolves to besides itself (Avro specification).
PROMOTIONS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}
_NAMED = frozenset({"record", "error", "enum", "fixed"})


def parse(definition: str) -> tuple[Any, bytes]:
    """The parsed schema and its canonical form (what the fingerprint hashes): the parsing
    canonical form, then the field defaults and aliases, which it drops but resolution uses."""
    try:
        raw = orjson.loads(definition)
    except orjson.JSONDecodeError as exc:
        raise InvalidSchemaError(
            schema_type="avro", location=_json_pos(exc), reason=str(exc)
        ) from exc
    try:
        parsed = parse_schema(raw)
        canonical = to_parsing_canonical_form(raw)
    except Exception as exc:  # fastavro raises many kinds (SchemaParseException, KeyError...)
        location = _locate(raw, "$", {}) or "$"
        raise InvalidSchemaError(
            schema_type="avro", location=location, reason=_reason(exc)
        ) from exc
    extras = sorted(_extras(raw, "$"))
    return parsed, canonical.encode() + b"\n" + orjson.dumps(extras)


def fingerprint(canonical: bytes) -> str:
    """sha256 of the canonical form, in hex."""
    return hashlib.sha256(canonical).hexdigest()


def _json_pos(exc: orjson.JSONDecodeError) -> str:
    return f"line {exc.lineno} column {exc.colno}"


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, UnknownType):
        return f"unknown type {exc.name!r}"
    return text if not isinstance(exc, KeyError) else f"missing key {text}"


def _locate(schema: Any, path: str, named: dict[str, Any]) -> str | None:
    """The deepest record field (by JSON path) that does not parse on its own, given the
    named types defined before it; None when every field does (the fault is the record's)."""
    if isinstance(schema, list):
        for i, branch in enumerate(schema):
            if not _parses(branch, named):
                return _locate(branch, f"{path}[{i}]", named) or f"{path}[{i}]"
        return None
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if kind in ("record", "error") and isinstance(schema.get("fields"), list):
        for i, field in enumerate(schema["fields"]):
            here = f"{path}.fields[{i}]"
            if not isinstance(field, dict):
                return here
            probe = {"type": "record", "name": "__danube_probe", "fields": [field]}
            if not _parses(probe, named):
                if "type" in field and not _parses(field["type"], named):
                    return _locate(field["type"], here + ".type", named) or here + ".type"
                return here
            parse_schema(probe, named_schemas=named)  # defines the field's named types
            named.pop("__danube_probe", None)
        return None
    if kind == "array":
        return _locate(schema.get("items"), path + ".items", named)
    if kind == "map":
        return _locate(schema.get("values"), path + ".values", named)
    return None


def _parses(schema: Any, named: dict[str, Any]) -> bool:
    try:
        parse_schema(schema, named_schemas=dict(named))
    except Exception:
        return False
    return True


def _extras(schema: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(path, json)`` of each field default and alias list."""
    if isinstance(schema, list):
        for i, branch in enumerate(schema):
            yield from _extras(branch, f"{path}[{i}]")
    elif isinstance(schema, dict):
        if isinstance(schema.get("aliases"), list):
            yield path + ".aliases", orjson.dumps(sorted(map(str, schema["aliases"]))).decode()
        if "default" in schema and schema.get("type") == "enum":
            yield path + ".default", orjson.dumps(schema["default"]).decode()
        for i, field in enumerate(schema.get("fields") or []):
            here = f"{path}.fields[{i}]"
            if "default" in field:
                yield here + ".default", orjson.dumps(field["default"]).decode()
            if isinstance(field.get("aliases"), list):
                yield here + ".aliases", orjson.dumps(sorted(map(str, field["aliases"]))).decode()
            yield from _extras(field.get("type"), here + ".type")
        for key in ("items", "values"):
            if key in schema:
                yield from _extras(schema[key], f"{path}.{key}")


# --- schema resolution -------------------------------------------------------------------


def _names(schema: Any, found: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every named type of a parsed schema by full name (fastavro qualifies them)."""
    if isinstance(schema, list):
        for branch in schema:
            _names(branch, found)
    elif isinstance(schema, dict):
        if schema.get("type") in _NAMED and "name" in schema:
            found.setdefault(schema["name"], schema)
        for field in schema.get("fields") or []:
            _names(field.get("type"), found)
        for key in ("items", "values"):
            if key in schema:
                _names(schema[key], found)
    return found


class _Resolver:
    """Compares a reader schema with a writer schema, collecting the failed rules."""

    def __init__(self, reader: Any, writer: Any) -> None:
        self._reader_names = _names(reader, {})
        self._writer_names = _names(writer, {})
        self._seen: set[tuple[str, str]] = set()  # named pairs under way (recursive types)
        self.errors: list[str] = []

    def _deref(self, schema: Any, names: dict[str, dict[str, Any]]) -> Any:
        if isinstance(schema, str) and schema not in PRIMITIVES:
            return names.get(schema, schema)
        if isinstance(schema, dict) and schema.get("type") in PRIMITIVES and len(schema) <= 2:
            return schema["type"]  # {"type": "int"} (a logicalType is an annotation only)
        return schema

    def reads(self, reader: Any, writer: Any, path: str, *, report: bool = True) -> bool:
        r = self._deref(reader, self._reader_names)
        w = self._deref(writer, self._writer_names)
        if isinstance(w, list):
            ok = True
            for i, branch in enumerate(w):
                if not self._reads_one(r, branch, f"{path}[{i}]", report=False):
                    ok = False
                    if report:  # again, to say why
                        self._reads_one(r, branch, f"{path}[{i}]", report=True)
            return ok
        return self._reads_one(r, w, path, report=report)

    def _reads_one(self, r: Any, w: Any, path: str, *, report: bool) -> bool:
        r = self._deref(r, self._reader_names)
        w = self._deref(w, self._writer_names)
        if isinstance(r, list):
            for branch in r:
                if self._matches(self._deref(branch, self._reader_names), w):
                    return self.reads(branch, w, path, report=report)
            if report:
                self._fail(
                    "union_branch_unreadable",
                    path,
                    f"writer type {_kind(w)} matches no branch of the reader's union",
                )
            return False
        if not self._matches(r, w):
            if report and _kind(r) == _kind(w) and _kind(r) in _NAMED:
                self._fail("name_mismatch", path, f"reader {r['name']}, writer {w['name']}")
            elif report:
                self._fail(
                    "type_mismatch", path, f"reader {_kind(r)} cannot read writer {_kind(w)}"
                )
            return False
        if isinstance(r, str):
            return True  # primitives (with promotions)
        kind = r["type"]
        if kind not in _NAMED:
            return self._contents(r, w, path, report=report)
        pair = (r["name"], w["name"])
        if pair in self._seen:
            return True  # a recursive type: the pair is being compared further up
        self._seen.add(pair)
        try:
            return self._contents(r, w, path, report=report)
        finally:
            self._seen.discard(pair)

    def _contents(self, r: dict[str, Any], w: dict[str, Any], path: str, *, report: bool) -> bool:
        kind = r["type"]
        if kind in ("record", "error"):
            return self._record(r, w, path, report=report)
        if kind == "enum":
            return self._enum(r, w, path, report=report)
        if kind == "fixed":
            if r["size"] != w["size"]:
                if report:
                    self._fail(
                        "fixed_size_mismatch", path, f"reader size {r['size']}, writer {w['size']}"
                    )
                return False
            return True
        if kind == "array":
            return self.reads(r["items"], w["items"], path + ".items", report=report)
        if kind == "map":
            return self.reads(r["values"], w["values"], path + ".values", report=report)
        return True

    def _matches(self, r: Any, w: Any) -> bool:
        """Whether ``r`` and ``w`` are of types resolution pairs (not yet their contents)."""
        rk, wk = _kind(r), _kind(w)
        if isinstance(r, list) or isinstance(w, list):
            return False
        if rk in PRIMITIVES or wk in PRIMITIVES:
            return rk == wk or rk in PROMOTIONS.get(wk, frozenset())
        if rk != wk and {rk, wk} != {"record", "error"}:
            return False
        if rk in _NAMED:
            aliases = {_short(a) for a in r.get("aliases") or []}
            return _short(r["name"]) == _short(w["name"]) or _short(w["name"]) in aliases
        return True

    def _record(self, r: dict[str, Any], w: dict[str, Any], path: str, *, report: bool) -> bool:
        writer_fields = {f["name"]: f for f in w.get("fields") or []}
        ok = True
        for i, field in enumerate(r.get("fields") or []):
            here = f"{path}.{field['name']}"
            names = [field["name"], *(field.get("aliases") or [])]
            found = next((writer_fields[n] for n in names if n in writer_fields), None)
            if found is None:
                if "default" not in field:
                    ok = False
                    if report:
                        self._fail(
                            "reader_field_missing_default",
                            here,
                            f"field {field['name']!r} (reader fields[{i}]) is not written and "
                            "has no default",
                        )
                continue
            ok = self.reads(field["type"], found["type"], here, report=report) and ok
        return ok

    def _enum(self, r: dict[str, Any], w: dict[str, Any], path: str, *, report: bool) -> bool:
        if "default" in r:
            return True
        missing = [s for s in w.get("symbols") or [] if s not in set(r.get("symbols") or [])]
        if missing and report:
            self._fail(
                "enum_symbol_missing",
                path,
                f"writer symbols {missing} are not reader symbols (and no enum default)",
            )
        return not missing

    def _fail(self, rule: str, path: str, message: str) -> None:
        self.errors.append(f"{rule} at {path}: {message}")


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema.get("type"))
    return repr(schema)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def can_read(reader: Any, writer: Any) -> list[str]:
    """The failed resolution rules (empty: a reader with ``reader`` reads all data written
    with ``writer``), each ``"<rule> at <path>: <what>"``."""
    resolver = _Resolver(reader, writer)
    resolver.reads(reader, writer, "$")
    return resolver.errors
