"""Every background task has an owner (danube.tasks.TaskSet, or an asyncio.TaskGroup): no
bare ``asyncio.create_task`` / ``loop.create_task`` / ``asyncio.ensure_future`` and no
hand-written "cancel, then ``gather(return_exceptions=True)``" stop in libs/ or services/,
except at the sites allowed below, each with the reason it is allowed."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (ROOT / "libs", ROOT / "services")

# path -> (how many bare task starts, why they are allowed)
BARE_TASKS_ALLOWED: dict[str, tuple[int, str]] = {
    "libs/danube/tasks.py": (1, "TaskSet.spawn: the owner itself"),
    "libs/danube/aio.py": (
        4,
        "the shared helpers for short-lived futures awaited where they start: awaited_task, "
        "wait_any's event waits, until_stopped's work and stop",
    ),
    "libs/danube/bus/rpc.py": (
        1,
        "Responder: one handler task per request in its own bounded set: a semaphore slot "
        "each, given back by a done callback even for a task cancelled before it ran, every "
        "failure logged there; drain and unsubscribe stop them within deadlines. A TaskSet "
        "would add a second done callback to every request of the bus",
    ),
    "libs/danube/runtime/data_connection.py": (
        1,
        "a data door's connection: one task per run of requests, held in the connection's "
        "running slot (pipelined requests wait their turn in it), every failure logged in "
        "it, cut by the listener's close after its stop time. A TaskSet would add a done "
        "callback and a context copy to every produce sent one at a time",
    ),
    "libs/danube/wire/leader_watch.py": (
        3,
        "every produce's path: the request raced against leader probes (and a test's fake "
        "sleep), each awaited, or cancelled and awaited, before the call returns",
    ),
}

# path -> (how many gather(..., return_exceptions=True), why they are allowed)
GATHERS_ALLOWED: dict[str, tuple[int, str]] = {
    "services/danube/dispatcher/positions.py": (
        1,
        "resolves every partition's start position at once and reports each one's outcome: "
        "concurrent work, not a stop",
    ),
    "libs/danube/client/client.py": (
        1,
        "AsyncDanubeClient.close closes every producer and consumer it made at once; one that "
        "fails must not keep the others from closing, and the client's close raises none of "
        "their errors: concurrent closes, no task cancelled",
    ),
}


def _name(node: ast.expr) -> str:
    """The last identifier of a name or attribute chain ("" for anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_loop(node: ast.expr) -> bool:
    """``asyncio.get_running_loop()``, ``get_event_loop()``, or a name ending in "loop"."""
    if isinstance(node, ast.Call):
        return _name(node.func) in ("get_running_loop", "get_event_loop")
    return _name(node).lower().endswith("loop")


def _is_bare_task(call: ast.Call, from_asyncio: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Name):  # from asyncio import create_task
        return func.id in from_asyncio
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "ensure_future":
        return True
    if func.attr != "create_task":
        return False  # a TaskGroup's create_task is owned: only asyncio's and a loop's count
    return _name(func.value) == "asyncio" or _is_loop(func.value)


def _is_gather_of_outcomes(call: ast.Call) -> bool:
    return _name(call.func) == "gather" and any(
        k.arg == "return_exceptions" and isinstance(k.value, ast.Constant) and k.value.value
        for k in call.keywords
    )


def _sites(source: str) -> tuple[int, int]:
    """How many bare task starts and gathers of outcomes ``source`` holds."""
    tree = ast.parse(source)
    from_asyncio = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "asyncio"
        for alias in node.names
        if alias.name in ("create_task", "ensure_future")
    }
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return (
        sum(_is_bare_task(call, from_asyncio) for call in calls),
        sum(_is_gather_of_outcomes(call) for call in calls),
    )


def _counts() -> tuple[Counter[str], Counter[str]]:
    tasks: Counter[str] = Counter()
    gathers: Counter[str] = Counter()
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            tasks[relative], gathers[relative] = _sites(path.read_text())
    return +tasks, +gathers  # `+` drops the zeros


def _problems(found: Counter[str], allowed: dict[str, tuple[int, str]], what: str) -> list[str]:
    problems = []
    for path, count in sorted(found.items()):
        ceiling = allowed.get(path, (0, ""))[0]
        if count > ceiling:
            problems.append(f"{path}: {count} {what} (allowed: {ceiling})")
    for path, (ceiling, why) in sorted(allowed.items()):
        if found[path] < ceiling:  # the list says what is, no more
            problems.append(f"{path}: {found[path]} {what} now; lower its entry ({ceiling})")
        if not why.strip():
            problems.append(f"{path}: allowed without a reason")
    return problems


def test_no_bare_task_starts_beyond_the_allowed_sites() -> None:
    tasks, _ = _counts()
    assert sum(tasks.values()) >= 9  # the allowed sites were read
    assert _problems(tasks, BARE_TASKS_ALLOWED, "bare task starts") == [], (
        "start it in an owner (danube.tasks.TaskSet), or, awaited where it starts, "
        "through danube.aio (awaited_task, wait_any, until_stopped)"
    )


def test_no_hand_written_cancel_then_gather_stops() -> None:
    _, gathers = _counts()
    assert _problems(gathers, GATHERS_ALLOWED, "gather(return_exceptions=True)") == [], (
        "stop tasks through their owner (TaskSet.cancel / close, within a deadline)"
    )


def test_the_check_finds_every_form() -> None:
    """The check itself: each way of starting a bare task counts, an owner's does not."""
    source = """
import asyncio
from asyncio import create_task as start

async def f(loop, tg, tasks):
    asyncio.create_task(g())
    asyncio.ensure_future(g())
    asyncio.get_running_loop().create_task(g())
    loop.create_task(g())
    self._loop.create_task(g())
    start(g())
    tg.create_task(g())  # a TaskGroup's: owned
    tasks.spawn(g(), name="g")  # a TaskSet's: owned
    await asyncio.gather(a, b, return_exceptions=True)
    await asyncio.gather(a, b)
"""
    assert _sites(source) == (6, 1)
