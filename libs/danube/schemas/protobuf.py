"""Protobuf: compiling ``.proto`` text with protoc (grpcio-tools), the fingerprint, the wire
compatibility rules, and the message class payloads are parsed with.

A definition is the text of one ``.proto`` file (proto2 or proto3; it may import Google's
well-known types). protoc runs in a child process in a temporary directory and writes a
FileDescriptorSet (imports included); its ``file:line:col`` error is passed on as is, the
file being ``schema.proto``.

The **root message** (the one a topic's payloads are) is the first message of the file, or
the one a line ``// @danube.message: <name>`` names (full name, or name within the package).

Rules (:func:`wire_compatible`), each failure named with the message and field number:

- ``message_removed``: a message of the old version is missing from the new one;
- ``root_message_changed``: the root message is another one;
- ``field_wire_type_changed``: a field number whose encoding class differs — varint (int32,
  int64, uint32, uint64, bool, enum), zigzag (sint32, sint64), 32-bit (fixed32, sfixed32,
  float), 64-bit (fixed64, sfixed64, double), length-delimited (string, bytes), an embedded
  message (by type name), group;
- ``field_cardinality_changed``: a field number that is repeated in one version only;
- ``required_field_changed``: a proto2 ``required`` field added, removed, or made optional;
- ``reserved_number_reused``: a field number the old version reserved is used by the new.

Field names are not compared (the binary encoding does not carry them). The rules are
symmetric, so backward, forward and full check the same pairs of versions.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from danube.schemas.errors import InvalidSchemaError

PROTO_FILE = "schema.proto"
# protoc on a ~256 KiB file takes well under a second; this bounds a pathological one.
PROTOC_TIMEOUT_S = 20.0
_ROOT_DIRECTIVE = re.compile(r"^\s*//\s*@danube\.message:\s*([A-Za-z0-9_.]+)\s*$", re.M)
_FDP = descriptor_pb2.FieldDescriptorProto
_WIRE_CLASS: dict[int, str] = {
    **dict.fromkeys(
        (_FDP.TYPE_INT32, _FDP.TYPE_INT64, _FDP.TYPE_UINT32, _FDP.TYPE_UINT64), "varint"
    ),
    _FDP.TYPE_BOOL: "varint",
    _FDP.TYPE_ENUM: "varint",
    _FDP.TYPE_SINT32: "zigzag",
    _FDP.TYPE_SINT64: "zigzag",
    _FDP.TYPE_FIXED32: "32-bit",
    _FDP.TYPE_SFIXED32: "32-bit",
    _FDP.TYPE_FLOAT: "32-bit",
    _FDP.TYPE_FIXED64: "64-bit",
    _FDP.TYPE_SFIXED64: "64-bit",
    _FDP.TYPE_DOUBLE: "64-bit",
    _FDP.TYPE_STRING: "length-delimited",
    _FDP.TYPE_BYTES: "length-delimited",
    _FDP.TYPE_GROUP: "group",
}


class Compiled:
    """A compiled definition: its descriptor set and root message's full name."""

    def __init__(self, descriptors: descriptor_pb2.FileDescriptorSet, root: str) -> None:
        self.descriptors = descriptors
        self.root = root

    @property
    def main(self) -> descriptor_pb2.FileDescriptorProto:
        """The definition's own file (imports come before it in the set)."""
        return self.descriptors.file[-1]


def _protoc_include() -> str:
    return str(files("grpc_tools") / "_proto")


def compile_proto(definition: str) -> Compiled:
    """Compile the text with protoc; :class:`InvalidSchemaError` with protoc's location."""
    with tempfile.TemporaryDirectory(prefix="danube-proto-") as tmp:
        source = Path(tmp) / PROTO_FILE
        source.write_text(definition, encoding="utf-8")
        out = Path(tmp) / "set.pb"
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={tmp}",
            f"--proto_path={_protoc_include()}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            PROTO_FILE,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, timeout=PROTOC_TIMEOUT_S, check=False, cwd=tmp
            )
        except subprocess.TimeoutExpired as exc:
            raise InvalidSchemaError(
                schema_type="protobuf", location=PROTO_FILE, reason="protoc took too long"
            ) from exc
        if done.returncode != 0:
            stderr = done.stderr.decode("utf-8", errors="replace")
            raise _protoc_error(stderr.replace(str(Path(tmp)) + "/", ""))
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return Compiled(descriptors, _root(definition, descriptors.file[-1]))


def _protoc_error(stderr: str) -> InvalidSchemaError:
    first = next((line for line in stderr.splitlines() if line.strip()), "protoc failed")
    match = re.match(r"^(\S+?:\d+:\d+):\s*(.*)$", first)
    if match is None:
        return InvalidSchemaError(schema_type="protobuf", location=PROTO_FILE, reason=first)
    return InvalidSchemaError(schema_type="protobuf", location=match[1], reason=match[2])


def _root(definition: str, main: descriptor_pb2.FileDescriptorProto) -> str:
    names = [name for name, _ in _messages(main)]
    if not names:
        raise InvalidSchemaError(
            schema_type="protobuf", location=PROTO_FILE, reason="the file defines no message"
        )
    wanted = _ROOT_DIRECTIVE.search(definition)
    if wanted is None:
        return names[0]
    prefix = f"{main.package}." if main.package else ""
    for candidate in (wanted[1], prefix + wanted[1]):
        if candidate in names:
            return candidate
    raise InvalidSchemaError(
        schema_type="protobuf",
        location=PROTO_FILE,
        reason=f"@danube.message names {wanted[1]!r}, which the file does not define",
    )


def _messages(
    file: descriptor_pb2.FileDescriptorProto,
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """Every message of the file, nested ones included, by full name (file order)."""

    def walk(prefix: str, messages: Any) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
        for message in messages:
            name = f"{prefix}{message.name}"
            yield name, message
            yield from walk(name + ".", message.nested_type)

    yield from walk(f"{file.package}." if file.package else "", file.message_type)


def canonical(compiled: Compiled) -> bytes:
    """The root message's name and the descriptor set's deterministic bytes."""
    body: bytes = compiled.descriptors.SerializeToString(deterministic=True)
    return compiled.root.encode() + b"\n" + body


def fingerprint(canonical_form: bytes) -> str:
    """sha256 of the canonical form, in hex."""
    return hashlib.sha256(canonical_form).hexdigest()


# --- compatibility -------------------------------------------------------------------


def _wire(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type == _FDP.TYPE_MESSAGE:
        return f"message {field.type_name.lstrip('.')}"
    return _WIRE_CLASS.get(field.type, f"type {field.type}")


def _reserved(message: descriptor_pb2.DescriptorProto, number: int) -> bool:
    return any(r.start <= number < r.end for r in message.reserved_range)


def wire_compatible(old: Compiled, new: Compiled) -> list[str]:
    """The failed rules between two versions (empty: each reads the other's data)."""
    errors: list[str] = []
    if old.root != new.root:
        errors.append(f"root_message_changed at {new.root}: it was {old.root}")
    new_messages = dict(_messages(new.main))
    for name, before in _messages(old.main):
        after = new_messages.get(name)
        if after is None:
            errors.append(f"message_removed at {name}: the new version does not define it")
            continue
        _compare_fields(name, before, after, errors)
    return errors


def _compare_fields(
    name: str,
    before: descriptor_pb2.DescriptorProto,
    after: descriptor_pb2.DescriptorProto,
    errors: list[str],
) -> None:
    old_fields = {f.number: f for f in before.field}
    new_fields = {f.number: f for f in after.field}
    for number in sorted(old_fields.keys() | new_fields.keys()):
        was, now = old_fields.get(number), new_fields.get(number)
        where = f"{name}.{(now or was).name} (field {number})"  # type: ignore[union-attr]
        if was is None or now is None:
            present = was or now
            assert present is not None
            if present.label == _FDP.LABEL_REQUIRED:
                change = "added" if was is None else "removed"
                errors.append(f"required_field_changed at {where}: a required field {change}")
            if was is None and _reserved(before, number):
                # Reserving a removed number is the right practice; using a reserved one is not.
                errors.append(f"reserved_number_reused at {where}: reserved in the old version")
            continue
        if _wire(was) != _wire(now):
            errors.append(f"field_wire_type_changed at {where}: {_wire(was)} -> {_wire(now)}")
        if (was.label == _FDP.LABEL_REPEATED) != (now.label == _FDP.LABEL_REPEATED):
            errors.append(f"field_cardinality_changed at {where}: repeated in one version only")
        if (was.label == _FDP.LABEL_REQUIRED) != (now.label == _FDP.LABEL_REQUIRED):
            errors.append(f"required_field_changed at {where}: required in one version only")


# --- payloads ------------------------------------------------------------------------


def message_class(compiled: Compiled) -> type[Message]:
    """The root message's class, from a pool of its own (no clash between schemas)."""
    pool = descriptor_pool.DescriptorPool()
    for file in compiled.descriptors.file:
        pool.Add(file)
    cls: type[Message] = message_factory.GetMessageClass(pool.FindMessageTypeByName(compiled.root))
    return cls


def payload_checker(compiled: Compiled) -> Callable[[bytes], str | None]:
    """A check that parses a payload as the root message (required fields present)."""
    cls = message_class(compiled)

    def check(payload: bytes) -> str | None:
        message = cls()
        try:
            message.ParseFromString(payload)
        except DecodeError as exc:
            return f"{compiled.root}: not a valid encoding ({exc})"
        if not message.IsInitialized():
            missing = ", ".join(message.FindInitializationErrors())
            return f"{compiled.root}: missing required fields: {missing}"
        return None

    return check
