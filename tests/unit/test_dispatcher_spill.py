"""The delay index's file spill (danube.dispatcher.spill): what is appended is taken back
whole, and clearing twice (a subscription that fails, then stops) is no error."""

from __future__ import annotations

from pathlib import Path

import pytest

from danube.dispatcher.spill import FileSpill

pytestmark = pytest.mark.unit


def test_appends_come_back_whole_and_a_second_clear_is_nothing(tmp_path: Path) -> None:
    spill = FileSpill(tmp_path / "spill")
    spill.append(7, b"ab")
    spill.append(7, b"cd")
    spill.append(9, b"x")
    assert spill.take(7) == b"abcd"
    spill.clear()
    spill.clear()  # failed, then stopped: was RuntimeError (the thread was shut down)
    spill.drain()
    assert not (tmp_path / "spill").exists()
