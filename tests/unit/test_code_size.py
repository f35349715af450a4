"""The size limits of ../shared/STYLE.md hold for the product's code (libs, services, the Spark
jobs): no module over 500 lines, no function over 70 (from its ``def`` line to its last)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "libs", ROOT / "services", ROOT / "spark_jobs")
MODULE_LINES_MAX = 500
FUNCTION_LINES_MAX = 70


def _sources() -> list[Path]:
    return sorted(path for source in SOURCES for path in source.rglob("*.py"))


def _long_functions(tree: ast.Module) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > FUNCTION_LINES_MAX:
                found.append((node.name, lines))
    return found


def test_no_module_is_over_the_limit() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in _sources()
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES_MAX
    }
    assert long == {}, f"split these along a seam (at most {MODULE_LINES_MAX} lines): {long}"


def test_no_function_is_over_the_limit() -> None:
    long = {
        f"{path.relative_to(ROOT)}:{name}": lines
        for path in _sources()
        for name, lines in _long_functions(ast.parse(path.read_text()))
    }
    assert long == {}, f"shorten these (at most {FUNCTION_LINES_MAX} lines): {long}"


def test_the_checks_see_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES_MAX))
    tree = ast.parse(f"def long():\n{body}\n\ndef short():\n    pass\n")
    assert _long_functions(tree) == [("long", FUNCTION_LINES_MAX + 1)]
