"""Services talk over the bus, never through each other's code: a service package imports the
libs (danube.bus, danube.meta, danube.wire, ...) and itself only. The contracts between
services (subjects, bodies, clients, status codes) live in danube.wire."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SERVICES_ROOT = Path(__file__).resolve().parents[2] / "services" / "danube"
SERVICES = sorted(p.name for p in SERVICES_ROOT.iterdir() if (p / "__init__.py").exists())


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from danube import ingest` names a package through its parent.
            if node.module == "danube":
                found.extend((node.lineno, f"danube.{alias.name}") for alias in node.names)
    return found


def _foreign_imports(service: str) -> list[str]:
    others = {f"danube.{name}" for name in SERVICES if name != service}
    problems = []
    for path in sorted((SERVICES_ROOT / service).rglob("*.py")):
        for line, module in _imported_modules(path):
            if any(module == o or module.startswith(f"{o}.") for o in others):
                problems.append(f"{path.relative_to(SERVICES_ROOT)}:{line} imports {module}")
    return problems


def test_the_services_are_found() -> None:
    assert {"discovery", "ingest", "dispatcher", "uploader", "retention", "cloud_reader"} <= set(
        SERVICES
    )


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    assert _foreign_imports(service) == []


def test_the_libs_import_no_service() -> None:
    libs = SERVICES_ROOT.parents[1] / "libs" / "danube"
    services = {f"danube.{name}" for name in SERVICES}
    problems = [
        f"{path.relative_to(libs)}:{line} imports {module}"
        for path in sorted(libs.rglob("*.py"))
        for line, module in _imported_modules(path)
        if any(module == s or module.startswith(f"{s}.") for s in services)
    ]
    assert problems == []


def test_the_check_sees_a_foreign_import(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("from danube import ingest\nfrom danube.wire.dispatcher.client import X\n")
    assert [m for _, m in _imported_modules(source)] == [
        "danube",
        "danube.ingest",
        "danube.wire.dispatcher.client",
    ]


def _imports_of(modules: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(SERVICES_ROOT)}:{line} imports {module}"
        for path in modules
        for line, module in _imported_modules(path)
        if module in forbidden or module.startswith(tuple(f"{f}." for f in forbidden))
    ]


def test_discoverys_doors_are_siblings_over_admission_and_the_core() -> None:
    """The gRPC door imports nothing of the HTTP door; the core no door; admission (the
    libs' danube.admission) no door and nothing of discovery (DESIGN §10: every door, an
    ingest node's too, calls admission the same way)."""
    discovery = SERVICES_ROOT / "discovery"
    grpc_door = sorted((discovery / "doors" / "grpc").rglob("*.py"))
    assert len(grpc_door) >= 3  # the door was found (its protocol: libs' danube.grpc_door)
    assert _imports_of(grpc_door, ("danube.discovery.doors.http",)) == []
    # The gRPC protocol every door shares (discovery's, an ingest node's) imports no service.
    shared = sorted((SERVICES_ROOT.parents[1] / "libs" / "danube" / "grpc_door").rglob("*.py"))
    assert len(shared) > 5  # the package was found
    services = ("danube.discovery", "danube.ingest", "danube.dispatcher")
    assert _imports_of(shared, services) == []
    doors = ("danube.discovery.doors", "fastapi", "starlette", "grpc")
    assert _imports_of([discovery / "core.py"], doors) == []
    admission = SERVICES_ROOT.parents[1] / "libs" / "danube" / "admission"
    assert len(list(admission.glob("*.py"))) > 5  # the package was found
    assert [
        f"{path.name}:{line} imports {module}"
        for path in sorted(admission.rglob("*.py"))
        for line, module in _imported_modules(path)
        if module.startswith(("danube.discovery", *doors))
    ] == []


# Discovery's domain (DESIGN §10, STYLE "doors over a core"): what the doors call, in
# packages of their own beside the doors. It answers in records (danube.meta.records) and
# domain values, never in a door's bodies (danube.discovery.doors.bodies).
DOMAIN = ("catalog", "controller", "produce", "schemas", "security")
DOORS = ("danube.discovery.doors", "fastapi", "starlette", "grpc")


def test_discovery_is_doors_over_a_core_over_the_domain() -> None:
    discovery = SERVICES_ROOT / "discovery"
    top = sorted(p.name for p in discovery.iterdir() if p.suffix == ".py" or p.is_dir())
    # Wiring, the core, errors and metrics at the top; everything else in a package.
    assert [name for name in top if name.endswith(".py")] == [
        "__init__.py",
        "__main__.py",
        "app.py",
        "core.py",
        "errors.py",
        "metrics.py",
    ]
    paths = [discovery / "core.py"]
    for package in DOMAIN:
        found = sorted((discovery / package).rglob("*.py"))
        assert len(found) > 1, package
        paths += found
    assert _imports_of(paths, DOORS) == []
