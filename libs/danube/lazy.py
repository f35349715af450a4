"""A package's public names loaded on first use (PEP 562): the package states where each
name lives, and importing the package loads none of those modules until a name is read.
Standard library only: packages at every floor use it."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


class LazyNames:
    """The names of package ``package`` (its ``globals()``: ``namespace``) that live in
    other modules, by ``homes`` (name -> module); the package's ``__getattr__`` calls
    :meth:`load`, its ``__dir__`` :meth:`names`."""

    def __init__(self, package: str, namespace: dict[str, Any], homes: Mapping[str, str]) -> None:
        self.package = package
        self.namespace = namespace
        self.homes = homes

    def load(self, name: str) -> Any:
        """Import ``name`` from its module; kept in the package, so the next lookup is a
        plain module attribute."""
        home = self.homes.get(name)
        if home is None:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        self.namespace[name] = value
        return value

    def names(self) -> list[str]:
        return sorted([*self.namespace, *self.homes])
