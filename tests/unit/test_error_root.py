"""Every exception the mesh raises on purpose is a DanubeError (code, message, retriable):
callers catch one root, and the code reaches logs and metrics."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# The root itself; private classes (a leading underscore) are control flow inside one
# module, never raised to a caller.
ROOT_CLASS = "DanubeError"


def _exception_classes_outside_the_root() -> list[str]:
    found = []
    for folder in ("libs", "services"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or node.name == ROOT_CLASS:
                    continue
                if node.name.startswith("_"):
                    continue
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases & {"Exception", "BaseException"}:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return found


def test_every_exception_class_is_under_danube_error() -> None:
    assert _exception_classes_outside_the_root() == []
