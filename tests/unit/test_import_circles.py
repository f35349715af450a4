"""No import circles among the project's modules (libs and services): a child never imports
its parent back. Every ``import`` counts, also one inside a function (it runs later, but it is
still a circle of knowledge), except under ``if TYPE_CHECKING:`` (types only, never run)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "libs", ROOT / "services")


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for source in SOURCES:
        for path in source.rglob("*.py"):
            parts = path.relative_to(source).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _typing_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for sub in ast.walk(node))
    return skipped


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (a name imported from a module counts as the
    module; ``from package import submodule`` as the submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped = _typing_only(tree)
    targets: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*kept, base] if base else kept)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.append(sub if sub in modules else base)
    found = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name and target.startswith("danube"):
            found.add(target)
    return found


def test_the_import_graph_has_no_circle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 200  # the whole project was read
    assert sum(map(len, graph.values())) > 800
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def test_a_circle_is_found(tmp_path: Path) -> None:
    """The check itself: two modules importing each other make a circle."""
    (tmp_path / "danube").mkdir()
    (tmp_path / "danube" / "a.py").write_text("from danube import b\n")
    (tmp_path / "danube" / "b.py").write_text("import danube.a\n")
    modules = {"danube.a": tmp_path / "danube/a.py", "danube.b": tmp_path / "danube/b.py"}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph == {"danube.a": {"danube.b"}, "danube.b": {"danube.a"}}
    with pytest.raises(CycleError):
        TopologicalSorter(graph).prepare()
