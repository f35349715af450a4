"""Danube's permissions and the scopes a role is bound at (docs/security.md), as the SDK and
the CLI name them: a module of constants only, so `danube --help` can list them without
loading the SDK."""

from __future__ import annotations

from typing import Literal

Scope = Literal["cluster", "namespace", "topic"]
PERMISSIONS = (
    "Lookup",
    "Produce",
    "Consume",
    "ManageNamespace",
    "ManageTopic",
    "ManageSchema",
    "ManageBroker",
    "ManageCluster",
)
