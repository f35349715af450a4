"""Network fault schedules and how a run is judged: pure data and arithmetic, no servers.

A schedule is a list of timed steps applied to hosts named by role (``leader``: the leader of
the partition the run watches, as it is when the faults start; ``followers``: the other
replicas; ``etcd`` / ``nats``: every member of that dependency; ``etcd-one`` / ``nats-one``:
one member), ending healed. The runner (tests/e2e/chaosrun.py) resolves the roles and drives
tests/netlab.py. ``python -m tests.chaos RESULTS.jsonl`` prints the results table of a
``make chaos`` run.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

Op = Literal["cut", "loss", "delay", "heal"]
ROLES = frozenset({"leader", "followers", "etcd", "nats", "etcd-one", "nats-one", "hub"})
HOLD_S = 6.0  # how long a cut lasts: three 2 s leases, well past a failover
FLAPS = 6  # cut/heal cycles of the flapping link, one second each way


@dataclass(frozen=True)
class Step:
    """At ``at_s`` after the faults start: cut ``host`` from ``peers`` (all its traffic when
    empty), drop ``value`` % of it (loss), add ``value`` ms each way (delay), or heal it."""

    at_s: float
    op: Op
    host: str
    peers: tuple[str, ...] = ()
    value: int = 0


@dataclass(frozen=True)
class Schedule:
    """A named list of steps; the load goes on ``settle_s`` after the last one."""

    name: str
    steps: tuple[Step, ...]
    settle_s: float = 4.0
    about: str = ""

    @property
    def duration_s(self) -> float:
        return max(step.at_s for step in self.steps) + self.settle_s

    @property
    def needs_delay(self) -> bool:
        """Whether the hosts' traffic must pass a delay relay (tests/netdelay.py)."""
        return any(step.op == "delay" for step in self.steps)

    def validate(self) -> Schedule:
        """Steps in time order, known roles, sane values, and every faulted host healed."""
        times = [step.at_s for step in self.steps]
        if not self.steps or times != sorted(times) or times[0] < 0:
            raise ValueError(f"{self.name}: steps must be non-empty and in time order")
        open_faults: set[str] = set()
        for step in self.steps:
            unknown = {step.host, *step.peers} - ROLES
            if unknown:
                raise ValueError(f"{self.name}: unknown roles {sorted(unknown)}")
            if step.op == "loss" and not 0 < step.value < 100:
                raise ValueError(f"{self.name}: loss must be 1..99 %, got {step.value}")
            if step.op == "delay" and not 0 < step.value <= 5000:
                raise ValueError(f"{self.name}: delay must be 1..5000 ms, got {step.value}")
            if step.op == "heal":
                open_faults.discard(step.host)
            else:
                open_faults.add(step.host)
        if open_faults:
            raise ValueError(f"{self.name}: never healed: {sorted(open_faults)}")
        return self


def _held(name: str, host: str, peers: tuple[str, ...], about: str) -> Schedule:
    """Cut ``host`` from ``peers`` for HOLD_S, then heal."""
    steps = (Step(0.0, "cut", host, peers), Step(HOLD_S, "heal", host))
    return Schedule(name, steps, about=about).validate()


def _flap() -> Schedule:
    steps: list[Step] = []
    for i in range(FLAPS):
        steps += [Step(2.0 * i, "cut", "leader", ("nats",)), Step(2.0 * i + 1, "heal", "leader")]
    about = "the leader's link to NATS cut and healed every second"
    return Schedule("flap_leader_nats", tuple(steps), about=about).validate()


def _degrade() -> Schedule:
    steps = (
        Step(0.0, "delay", "leader", value=150),
        Step(0.0, "loss", "leader", value=7),
        Step(10.0, "heal", "leader"),
    )
    about = "150 ms each way and 7 % packet loss on all the leader's links for 10 s"
    return Schedule("degrade_leader", steps, about=about).validate()


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        _held("leader_followers", "leader", ("followers",), "the leader cut from its followers"),
        _held("leader_etcd", "leader", ("etcd",), "the leader cut from etcd"),
        _held("leader_nats", "leader", ("nats",), "the leader cut from NATS"),
        _held("isolate_leader", "leader", (), "a minority: the leader cut from everything"),
        _held("lose_etcd", "etcd-one", (), "one etcd member unreachable (with one: all of etcd)"),
        _held("lose_nats", "nats-one", (), "one NATS server unreachable (with one: the bus)"),
        _flap(),
        _degrade(),
    )
}
SHORT_SCHEDULE = "isolate_leader"  # the one `make test` runs


def longest_unavailable(acks: Iterable[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] with no acknowledgement in it: the partition's
    unavailability as a producer saw it (``acks``: when each successful produce answered)."""
    if end < start:
        raise ValueError(f"window ends ({end}) before it starts ({start})")
    times = sorted(t for t in acks if start <= t <= end)
    edges = [start, *times, end]
    return max(b - a for a, b in itertools.pairwise(edges))


def divergence(committed: dict[int, str], replicas: dict[str, dict[int, str]]) -> list[str]:
    """Where a replica's log disagrees with what the leader served below the high watermark
    (``committed``: offset -> message id): every in-sync replica must hold each of those
    offsets, with the same message; what lies above is uncommitted and may differ."""
    problems: list[str] = []
    for host in sorted(replicas):
        log = replicas[host]
        for offset in sorted(committed):
            held = log.get(offset)
            if held != committed[offset]:
                problems.append(f"{host}@{offset}: holds {held!r}, served {committed[offset]!r}")
    return problems


@dataclass
class RunResult:
    """One run of one schedule: what the history checker found and what the producers saw."""

    schedule: str
    run: int
    acknowledged: int  # distinct messages acknowledged
    lost: int
    conflicting: int
    unavailable_s: float  # the longest, over the partitions
    attempts: int = 0
    errors: int = 0
    timeouts: int = 0
    read_back: int = 0  # offsets read back after healing, all partitions
    diverged: int = 0  # committed offsets some replica's WAL disagrees on (tests/chaos.divergence)
    leaders: list[str] = field(default_factory=list)  # the watched partition's, in order
    notes: str = ""

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.conflicting == 0


def write_result(path: Path, result: RunResult) -> None:
    """Append one run as a JSON line."""
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(asdict(result)) + "\n")


def read_results(path: Path) -> list[RunResult]:
    """The runs ``write_result`` appended."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [RunResult(**json.loads(line)) for line in lines if line.strip()]


def table(results: Sequence[RunResult]) -> str:
    """The results table (Markdown): per schedule, runs, totals and the worst unavailability."""
    rows = [
        "| schedule | runs | acknowledged | lost | conflicting | max unavailability s |",
        "|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r.schedule for r in results):
        runs = [r for r in results if r.schedule == name]
        rows.append(
            f"| {name} | {len(runs)} | {sum(r.acknowledged for r in runs)} "
            f"| {sum(r.lost for r in runs)} | {sum(r.conflicting for r in runs)} "
            f"| {max(r.unavailable_s for r in runs):.1f} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(read_results(Path(sys.argv[1]))))
