"""The registry of things a node serves under its lease (danube.runtime.owned): adds, stale
removals, the count it reports, and fencing of everything when the lease is lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from danube.runtime.owned import Owned

pytestmark = pytest.mark.unit


class FakeLease:
    def __init__(self) -> None:
        self.callbacks: list[Callable[[Any], None]] = []

    def on_lost(self, callback: Callable[[Any], None]) -> None:
        self.callbacks.append(callback)

    def lose(self) -> None:
        for callback in self.callbacks:
            callback(self)


class Thing:
    def __init__(self) -> None:
        self.fenced: list[str] = []


def _registry(lease: FakeLease, counts: list[int]) -> Owned[str, Thing]:
    return Owned(
        lease,  # type: ignore[arg-type]
        fence=lambda thing, reason: thing.fenced.append(reason),
        on_count=counts.append,
    )


def test_add_pop_and_the_count() -> None:
    counts: list[int] = []
    owned = _registry(FakeLease(), counts)
    a, b = Thing(), Thing()
    owned.add("a", a)
    owned.add("b", b)
    with pytest.raises(ValueError, match="served already"):
        owned.add("a", Thing())
    assert owned.served() == ["a", "b"]
    assert owned.get("a") is a
    assert "b" in owned
    assert owned.pop("a") is a
    assert owned.pop("a") is None
    assert counts == [1, 2, 1]  # a pop of nothing reports nothing
    assert len(owned) == 1


def test_discard_leaves_a_newer_thing_alone() -> None:
    owned = _registry(FakeLease(), [])
    old, new = Thing(), Thing()
    owned.add("k", old)
    owned.pop("k")
    owned.add("k", new)
    assert not owned.discard("k", old)
    assert owned.get("k") is new
    assert owned.discard("k", new)
    assert "k" not in owned


def test_a_lost_lease_fences_everything_served() -> None:
    lease = FakeLease()
    owned = _registry(lease, [])
    things = [Thing() for _ in range(3)]
    for index, thing in enumerate(things):
        owned.add(str(index), thing)
    gone = owned.pop("1")
    lease.lose()
    assert [thing.fenced for thing in things] == [["node lease lost"], [], ["node lease lost"]]
    assert gone is things[1]
