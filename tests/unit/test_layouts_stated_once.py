"""The frame and record headers are stated once, in danube.frame (codec.py, record.py), and
every other file takes them from there: none restates their struct formats, the frame's crc
position or its header size (../shared/STYLE.md, "A layout stated once"); the few layouts
that only share a format are allowed by name, here, with the reason."""

from __future__ import annotations

import ast
import re
import struct
from pathlib import Path

import pytest

from danube.frame import (
    FRAME_COVERED,
    FRAME_CRC_AT,
    FRAME_HEADER,
    FRAME_HEADER_BYTES,
    RECORD_HEADER,
    SEQUENCED_RECORD_HEADER,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {"libs/danube/frame/codec.py", "libs/danube/frame/record.py"}
SCANNED = ("libs", "services", "spark_jobs", "deploy", "tests")

# (folder, name assigned) -> why a format that looks like a header is not one. Keyed by the
# folder, not the file, so that splitting a module does not trip the test; by the name, so
# that nothing else in that folder may restate a header.
ALLOWED_NAMES = {
    ("libs/danube/wire/ingest/", "_FETCH_REQUEST"): (
        "a fetch request (from_offset u64, max_bytes u32, max_count u32), not a frame header"
    ),
}
# Files that state the documented layouts on purpose, independently of danube.frame: a test
# that took them from there could not notice a change to them.
ALLOWED_FILES = {
    "tests/unit/test_frame.py": "pins the frame layout docs/formats.md describes",
    "tests/unit/test_record.py": "pins the record layout docs/formats.md describes",
    "tests/unit/test_layouts_stated_once.py": "this test (its samples below)",
}

_STRUCT_FORMAT = re.compile(r"[@=<>!]?[0-9xcbB?hHiIlLqQnNefdspP ]+")
_LAYOUT_NAME = re.compile(r"crc|frame|header", re.IGNORECASE)
_HEADER_NUMBERS = (FRAME_CRC_AT, FRAME_HEADER_BYTES)  # 12 and 16
# And the frame's length position (8), typed in as a name's value.
_POSITIONS = (struct.calcsize(FRAME_HEADER.format[:2]), *_HEADER_NUMBERS)
# What a file must hold for restatements() to find anything in it: the scan parses only those.
_MAYBE = re.compile(r"QII|crc|(?:frame|header)\w*\s*(?::[^=\n]*)?=[^\n]*\b(?:8|1[26])\b", re.I)


def _restates_format(text: str) -> bool:
    """A struct format that is, or begins with, the frame header; or holds the record's."""
    if not _STRUCT_FORMAT.fullmatch(text):
        return False
    body = text.lstrip("@=<>!")
    return body.startswith(FRAME_HEADER.format[1:]) or RECORD_HEADER.format[1:] in body


def _is_header_number(node: ast.AST, numbers: tuple[int, ...] = _HEADER_NUMBERS) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value in numbers


def _states_a_position(value: ast.expr) -> bool:
    """``8``, ``12`` or ``16`` as is, or ``16 + x`` (a frame's size typed in)."""
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        return _is_header_number(value.left) or _is_header_number(value.right)
    return _is_header_number(value, _POSITIONS)


def _name_of(target: ast.expr) -> str:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return ""


def restatements(source: str) -> list[tuple[int, str, str]]:
    """``(line, what, name assigned or "")`` of every place ``source`` restates a header: a
    header's struct format; a literal 12 or 16 given to a name about a crc, frame or header;
    a literal 12 or 16 anywhere in the arguments of a crc32c call (a crc over ``[:12]``)."""
    tree = ast.parse(source)
    found: list[tuple[int, str, str]] = []
    assigned: dict[int, str] = {}  # id of a node inside an assignment's value -> its name
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = ",".join(_name_of(t) for t in targets)
            for inner in ast.walk(node.value):
                assigned[id(inner)] = name
            if _states_a_position(node.value) and _LAYOUT_NAME.search(name):
                found.append((node.lineno, f"{name} = {ast.unparse(node.value)}", name))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _restates_format(node.value)
        ):
            found.append((node.lineno, f"format {node.value!r}", assigned.get(id(node), "")))
        elif (
            isinstance(node, ast.Call)
            and _name_of(node.func) in ("crc32c", "crc32")
            and any(_is_header_number(inner) for arg in node.args for inner in ast.walk(arg))
        ):
            found.append((node.lineno, "a literal header position in a crc", ""))
    return sorted(found)


def _allowed(relative: str, name: str) -> bool:
    return relative in ALLOWED_FILES or any(
        relative.startswith(folder) and name == allowed for folder, allowed in ALLOWED_NAMES
    )


def test_the_headers_are_what_docs_formats_md_describes() -> None:
    assert (FRAME_HEADER.format, FRAME_HEADER.size) == ("<QII", 16)
    assert (FRAME_COVERED.size, FRAME_CRC_AT) == (12, 12)
    assert (RECORD_HEADER.format, RECORD_HEADER.size) == ("<BBQIIHHHI", 28)
    assert SEQUENCED_RECORD_HEADER.size == 40


@pytest.mark.parametrize(
    "line",
    [
        'HEADER = struct.Struct("<QII")',
        "offset, length, crc = struct.unpack_from('<QII', data, pos)",
        'HEADS = struct.Struct("<QIIBBQIIHHHI")',
        'RECORD = struct.Struct("=BBQIIHHHIIQ")',
        "_CRC_AT = 12",
        "FRAME_HEADER_SIZE: int = 16",
        "_FRAME_LENGTH_AT = 8",
        "FRAME_BYTES = 16 + PAYLOAD_BYTES",
        "FRAME_BYTES = PAYLOAD_BYTES + 16",
        "crc = crc32c(view[pos + 16 : end], crc32c(view[pos : pos + 12]))",
    ],
)
def test_a_restated_header_is_found(line: str) -> None:
    assert restatements(line) != []
    assert _MAYBE.search(line)  # and the file holding it is parsed


@pytest.mark.parametrize(
    "line",
    [
        "HEADER = FRAME_HEADER",
        'FETCH = struct.Struct("<QQIIB")',
        'ENTRY = struct.Struct("<qQIII")',
        "name = uuid.uuid4().hex[:12]",
        "crc = crc32c(view[pos : pos + FRAME_CRC_AT])",
        '"""The frame header is "<QII": docs/formats.md."""',
        "retries = 12",
        "MAX_FRAME_BYTES = 8 * 1024",
        "HEADER_AT = FRAME_HEADER_BYTES + 8",
    ],
)
def test_what_only_looks_like_a_header_is_not_found(line: str) -> None:
    assert restatements(line) == []


def test_an_allowed_layout_is_allowed_by_folder_and_name_alone() -> None:
    line = 'X = struct.Struct("<QII")'
    for name, allowed in (("_FETCH_REQUEST", True), ("_FRAME", False)):
        (found,) = restatements(line.replace("X", name))
        assert _allowed("libs/danube/wire/ingest/fetch.py", found[2]) is allowed
    (found,) = restatements(line.replace("X", "_FETCH_REQUEST"))
    assert not _allowed("libs/danube/wire/delivery.py", found[2])


def test_no_file_restates_a_header() -> None:
    sources = [
        path
        for top in SCANNED
        for path in (ROOT / top).rglob("*.py")
        if str(path.relative_to(ROOT)) not in OWNERS
    ]
    assert len(sources) > 300
    restated = [
        f"{relative}:{line}: {what}"
        for path in sources
        for relative in [str(path.relative_to(ROOT))]
        for text in [path.read_text()]
        if _MAYBE.search(text)
        for line, what, name in restatements(text)
        if not _allowed(relative, name)
    ]
    assert restated == []


def test_the_owners_state_the_headers() -> None:
    # The owners are where the formats are found: what the scan looks for is what they hold.
    for owner in OWNERS:
        assert restatements((ROOT / owner).read_text()) != []
