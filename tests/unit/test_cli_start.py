"""What keeps `danube` quick to start (docs/cli.md, "Start time"; timed by `make bench`, not
here): the modules a command line loads, the groups `main` builds for it, and that the root's
help is the same whether the groups are loaded or only listed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from danube.cli.main import build_app, groups_of

pytestmark = pytest.mark.unit

# Loaded by a command that needs them, never to start: each costs tens of milliseconds.
HEAVY = (
    "pydantic",
    "httpx",
    "grpc",
    "jwt",
    "cryptography",
    "yaml",
    "danube.config",
    "danube.meta",
    "danube.client.admin",
    "danube.client.client",
    "danube.runtime",
    "danube.spark",
    "pyspark",
    # The bench's package, loaded only when a command line names `bench`.
    "danube.bench",
    # Loaded by typer for a help page, or by a command once it prints or runs its loop.
    "rich",
    "asyncio",
    "uvloop",
)


def _loaded_after(argv: list[str]) -> list[str]:
    """The heavy modules a fresh interpreter holds once `main` built the app for ``argv``
    (the app built and converted to click, nothing run)."""
    script = f"""
import json, sys
import typer.main
from danube.cli.main import build_app, groups_of
typer.main.get_command(build_app(groups_of({argv!r})))
heavy = {HEAVY!r}
print(json.dumps(sorted(m for m in sys.modules if m.startswith(heavy))))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["produce", "-t", "/default/t", "-m", "hi"], ["consume", "-t", "t", "-m", "s"]],
)
def test_the_common_command_lines_load_nothing_heavy(argv: list[str]) -> None:
    assert _loaded_after(argv) == []


def test_a_group_is_built_only_when_named() -> None:
    assert groups_of(["--help"]) == ()
    assert groups_of([]) == ()
    assert groups_of(["produce", "-t", "admin"]) == ()
    assert groups_of(["admin", "topics", "list"]) == ("admin",)
    assert groups_of(["--token", "bench", "bench", "e2e"]) == ("bench",)  # the option's value
    assert groups_of(["--ca-file=x.pem", "schemas", "list"]) == ("schemas",)
    assert groups_of(["admn"]) == ()  # a typo: click names the groups it has


def _help(app: typer.Typer, args: list[str], exit_code: int = 0) -> str:
    result = CliRunner().invoke(app, args, env={"COLUMNS": "100"})
    assert result.exit_code == exit_code, result.output
    return result.output


def test_the_root_help_is_the_same_with_the_groups_only_listed() -> None:
    whole = build_app()
    assert _help(build_app(()), ["--help"]) == _help(whole, ["--help"])
    assert _help(build_app(()), [], 2) == _help(whole, [], 2)  # no command: the help, exit 2


def test_a_named_group_is_the_whole_group() -> None:
    text = _help(build_app(("admin",)), ["admin", "--help"])
    for command in ("cluster", "namespaces", "topics", "subscriptions", "partitions", "nodes"):
        assert command in text
    assert "drain" in _help(build_app(("admin",)), ["admin", "nodes", "--help"])
    # `bench`: its own package (danube.bench), the same four commands.
    text = _help(build_app(("bench",)), ["bench", "--help"])
    for command in ("produce", "consume", "e2e", "grpc"):
        assert command in text
