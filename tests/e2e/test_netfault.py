"""Network faults between the mesh's parts (issue 31, item 7; docs/chaos.md): etcd, NATS and
3 ingest nodes (factor 3, min in-sync 2) each in a network namespace, producers recording
every attempt, a fault schedule applied then healed, every partition read back and judged by
the history checker: no acknowledged message lost, no offset acknowledged for two messages,
offsets dense. `make test` runs two short schedules (the leader isolated, the leader cut from
NATS); `make chaos` every schedule 3 times."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from danube.bus import TopicName
from tests.chaos import SCHEDULES, SHORT_SCHEDULE, divergence, write_result
from tests.netlab import Lab, missing_tools, unavailable_reason

from chaosrun import NetMesh, RunOutcome, Topology, run_schedule

pytestmark = [pytest.mark.e2e, pytest.mark.fault]

RUNS = 3
# 150 ms each way on the leader's links: a produce crosses them at least twice (client to
# leader, leader to client), the followers' fetches twice more before the commit.
DELAYED_PRODUCE_MIN_S = 0.3
RESULTS_ENV = "DANUBE_CHAOS_RESULTS"
# A failover after a cut: the 2 s lease (or the bus watch's 2 s grace), the claim, the
# followers' first requests to the new leader (1 s each at worst). Before the fixes of
# docs/chaos.md a leader cut from NATS was unavailable for the whole 6 s cut, an isolated
# one for 6.7-7.0 s (a follower's 5 s repl.epochs request); 2.4-3.2 s measured since.
FAILOVER_S_MAX = 5.0  # a JSON-lines file each run appends its row to


@pytest.fixture
def net_mesh(tmp_path: Path) -> Iterator[Callable[..., NetMesh]]:
    """``net_mesh(topology, delay_relays=)``: the mesh started in a lab of its own; every
    process stopped, then every namespace, veth and the bridge deleted, also on failure."""
    missing = missing_tools()
    if missing:  # a setup error, not a reason to skip: CI runs `make test`, which installs them
        pytest.fail(f"{missing} not installed: `make setup-net` installs iproute2 and nftables")
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    made: list[tuple[Lab, NetMesh]] = []

    def make(topology: Topology, *, delay_relays: bool = False) -> NetMesh:
        lab = Lab()
        mesh = NetMesh(lab, topology.validate(), tmp_path, delay_relays=delay_relays)
        made.append((lab, mesh))  # before anything exists: a half-made lab is deleted too
        lab.open()
        mesh.start()
        return mesh

    try:
        yield make
    finally:
        left: list[str] = []
        for lab, mesh in made:
            try:
                mesh.stop()
            finally:
                left += lab.close()
        assert not left, f"the lab left behind {left}"


def _record(outcome: RunOutcome) -> None:
    """Print the run's row; with $DANUBE_CHAOS_RESULTS, append it there and keep the run's
    history, attempts and process logs in ``<results>.runs/<schedule>-<run>/``."""
    print(f"\n{outcome.result}")
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    write_result(Path(path), outcome.result)
    keep = Path(f"{path}.runs") / f"{outcome.result.schedule}-{outcome.result.run}"
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    run_dir = outcome.history_path.parent
    for name in ("history-*.jsonl", "attempts-*.jsonl", "*.log"):
        for found in run_dir.glob(name):
            shutil.copy2(found, keep / found.name)


def _judge(mesh: NetMesh, outcome: RunOutcome) -> None:
    """What every run must show, whatever its schedule; stops the mesh to read every
    replica's WAL: each must hold every committed offset with the message the leader served."""
    mesh.stop()
    result, report = outcome.result, outcome.report
    diverged: list[str] = []
    for name, committed in outcome.served.items():
        partition = TopicName.parse(name)
        logs = {h: mesh.replica_log(h, partition) for h in mesh.topology.ingest_hosts}
        diverged += divergence(committed, logs)
    result.diverged = len(diverged)
    _record(outcome)
    assert report.ok, f"{report.summary()}\nhistory: {outcome.history_path}"
    assert result.lost == 0
    assert result.conflicting == 0
    assert outcome.isr_whole, f"ISR not whole after healing; leaders {result.leaders}"
    for name, offsets in outcome.read_back.items():
        assert offsets == list(range(len(offsets))), f"{name} not dense from 0"
    assert result.acknowledged > 0
    assert result.read_back >= result.acknowledged
    assert not diverged, f"{len(diverged)} replica disagreements, first {diverged[:3]}"


async def test_isolated_leader_fails_over_and_loses_nothing(
    net_mesh: Callable[..., NetMesh],
) -> None:
    """The short schedule: the watched partition's leader cut from everything (a minority
    of one) for 6 s under load, then healed. A follower takes over (a new leader is seen),
    the old leader comes back as a follower, nothing acknowledged is lost or doubled, and
    producing serves again before the end (the last seconds of the run acknowledge)."""
    mesh = net_mesh(Topology())
    outcome = await run_schedule(mesh, SCHEDULES[SHORT_SCHEDULE])
    _judge(mesh, outcome)
    leaders = outcome.result.leaders
    assert len({leader.split("@")[0] for leader in leaders}) >= 2, leaders
    # A failover, not the whole cut: the follower's first request to the new leader is
    # not held up by the isolated leader's stale subscription (docs/chaos.md, finding 3).
    assert outcome.result.unavailable_s < FAILOVER_S_MAX, outcome.result


async def test_leader_cut_from_nats_gives_way(net_mesh: Callable[..., NetMesh]) -> None:
    """The watched partition's leader cut from NATS alone for 6 s (etcd still reachable: it
    keeps its lease). It gives way once it made no bus round trip for the lease TTL: a
    follower leads within a failover, not after the cut, and nothing is lost or doubled."""
    mesh = net_mesh(Topology())
    outcome = await run_schedule(mesh, SCHEDULES["leader_nats"])
    _judge(mesh, outcome)
    leaders = outcome.result.leaders
    assert len({leader.split("@")[0] for leader in leaders}) >= 2, leaders
    assert outcome.result.unavailable_s < FAILOVER_S_MAX, outcome.result


@pytest.mark.soak
@pytest.mark.chaos
@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", range(1, RUNS + 1))
@pytest.mark.parametrize("name", list(SCHEDULES))
async def test_schedule(net_mesh: Callable[..., NetMesh], name: str, run: int) -> None:
    """Every schedule, 3 runs each (`make chaos`): the history checker's verdict per run,
    the run's row appended to $DANUBE_CHAOS_RESULTS for the table."""
    schedule = SCHEDULES[name]
    mesh = net_mesh(Topology.from_env(os.environ), delay_relays=schedule.needs_delay)
    outcome = await run_schedule(mesh, schedule, run=run)
    _judge(mesh, outcome)
    if schedule.needs_delay:  # the relays did delay: a produce crosses the leader's links
        assert outcome.latency_p50_s >= DELAYED_PRODUCE_MIN_S, outcome.result
