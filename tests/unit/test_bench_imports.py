"""The bench (danube.bench) stays beside the product: no module of libs, services or the Spark
jobs imports it, except ``danube.cli.main``, which loads its app inside the function that
builds the `bench` group (on first use, never to start)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "libs", ROOT / "services", ROOT / "spark_jobs")
BENCH = ROOT / "libs" / "danube" / "bench"
# The one door into the bench: `danube bench ...` registers the group lazily.
LAZY_IMPORTERS = {"libs/danube/cli/main.py"}


def _bench_imports(source: str) -> list[tuple[int, bool]]:
    """Each import of danube.bench in ``source``: its line, and whether it runs at import
    time (at module level, outside every function)."""
    tree = ast.parse(source)
    in_function = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for sub in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom):
            # The project imports absolutely (none of libs, services, spark_jobs is relative).
            base = (node.module or "") if node.level == 0 else ""
            # `from danube import bench` names the package through its parent.
            names = [base, *(f"{base}.{name}" for name in names)] if base == "danube" else [base]
        if any(name == "danube.bench" or name.startswith("danube.bench.") for name in names):
            found.append((node.lineno, id(node) not in in_function))
    return found


def _importers() -> dict[str, list[tuple[int, bool]]]:
    return {
        path.relative_to(ROOT).as_posix(): found
        for source in SOURCES
        for path in sorted(source.rglob("*.py"))
        if not path.is_relative_to(BENCH) and (found := _bench_imports(path.read_text()))
    }


def test_the_bench_package_is_found() -> None:
    assert {p.name for p in BENCH.glob("*.py")} >= {"__init__.py", "app.py", "run.py"}


def test_only_the_cli_entry_imports_the_bench_and_only_on_first_use() -> None:
    importers = _importers()
    assert set(importers) == LAZY_IMPORTERS, "the product imports danube.bench"
    eager = {path: [line for line, top in found if top] for path, found in importers.items()}
    assert all(lines == [] for lines in eager.values()), f"imported at start: {eager}"


def test_the_check_sees_every_form() -> None:
    source = """
import danube.bench.run
from danube.bench.app import app
from danube import bench, client
from danube.benchmarks import x  # another name: not the bench

def build():
    from danube.bench import app
"""
    assert _bench_imports(source) == [(2, True), (3, True), (4, True), (8, False)]
