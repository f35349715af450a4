"""Test modules have names of their own: tests/ has no packages (rootdir conftest, no
``__init__``), so pytest imports each test module by its basename, and a second
``test_x.py`` in another folder fails the whole run at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
