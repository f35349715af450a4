"""docs/grpc-api.md's "Services" table against the gRPC server: it names every method the
server registers (danube.discovery.doors.grpc.server.method_handlers) and no other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from danube.discovery.doors.grpc.server import method_handlers

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs/grpc-api.md"


class _Anything:
    """Stands for the API objects: the handlers are built, never called."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def served_methods() -> set[str]:
    """``Service.Method`` of every registered handler, the proto package left out."""
    handlers = method_handlers(_Anything(), _Anything(), 1.0)  # type: ignore[arg-type]
    # grpc's generic handler keeps its methods by full path: "/<package>.<Service>/<Method>".
    paths = {path for handler in handlers for path in handler._method_handlers}
    return {path.removeprefix("/").split(".", 1)[1].replace("/", ".") for path in paths}


def documented_methods(text: str) -> set[str]:
    """The methods of the first column of the "Services" table."""
    section = text.split("\n## Services\n", 1)[1].split("\n#", 1)[0]
    methods: set[str] = set()
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("| ") and len(cells) > 2:
            methods |= set(re.findall(r"`([A-Z]\w*\.[A-Z]\w*)`", cells[1]))
    return methods


def test_the_services_table_is_what_the_server_registers() -> None:
    served = served_methods()
    documented = documented_methods(DOC.read_text())
    missing, stale = sorted(served - documented), sorted(documented - served)
    assert not missing, f"served, missing from docs/grpc-api.md's Services table: {missing}"
    assert not stale, f"in docs/grpc-api.md's Services table, not served: {stale}"


def test_the_registry_and_every_danube_service_are_served() -> None:
    services = {method.split(".")[0] for method in served_methods()}
    assert services == {
        "Discovery",
        "ProducerService",
        "ConsumerService",
        "HealthCheck",
        "SchemaRegistry",
    }


def test_the_table_parser_reads_only_the_first_column() -> None:
    text = "x\n## Services\n\n| method | what |\n|---|---|\n"
    text += "| `A.B` / `A.C` | like `X.Y` |\n\n## Next\n"
    assert documented_methods(text) == {"A.B", "A.C"}
