"""The frame and record headers are stated once, in danube.frame (codec.py, record.py), and
every other module takes them from there: no source file restates their struct formats or the
frame's crc position (../shared/STYLE.md, "A layout stated once"). Another layout that
happens to share a format says so on its line ("not a frame header")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from danube.frame import (
    FRAME_COVERED,
    FRAME_CRC_AT,
    FRAME_HEADER,
    RECORD_HEADER,
    SEQUENCED_RECORD_HEADER,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {
    ROOT / "libs/danube/frame/codec.py",
    ROOT / "libs/danube/frame/record.py",
}
# A frame header ("<QII"), a record header ("<BBQIIHHHI..."), or the crc position typed in.
RESTATED = re.compile(r"""Struct\(\s*["']<QII["']|["']<BBQIIHHHI|_CRC_AT\s*=\s*12\b""")


def test_the_headers_are_what_docs_formats_md_describes() -> None:
    assert (FRAME_HEADER.format, FRAME_HEADER.size) == ("<QII", 16)
    assert (FRAME_COVERED.size, FRAME_CRC_AT) == (12, 12)
    assert (RECORD_HEADER.format, RECORD_HEADER.size) == ("<BBQIIHHHI", 28)
    assert SEQUENCED_RECORD_HEADER.size == 40


def test_no_module_restates_a_header() -> None:
    sources = [
        path
        for top in ("libs", "services", "spark_jobs")
        for path in (ROOT / top).rglob("*.py")
        if path not in OWNERS
    ]
    assert len(sources) > 100
    restated = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if RESTATED.search(line) and "not a frame header" not in line
    ]
    assert restated == []
