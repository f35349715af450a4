"""The network fault harness's pure half: schedules are valid and end healed, unavailability
is the longest stretch without an acknowledgement, the nft script a fault renders, and the
results table."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tests.chaos import (
    FLAPS,
    HOLD_S,
    SCHEDULES,
    SHORT_SCHEDULE,
    RunResult,
    Schedule,
    Step,
    divergence,
    longest_unavailable,
    read_results,
    table,
    write_result,
)
from tests.netlab import TABLE, Fault, Host, Lab, render_table

pytestmark = pytest.mark.unit


def test_the_issue_asks_for_every_kind_of_schedule() -> None:
    """Item 7's list: leader from followers, from etcd, from NATS, a minority, a lost
    dependency, a flapping link, delay and loss; at least six, each valid."""
    assert {
        "leader_followers",
        "leader_etcd",
        "leader_nats",
        "isolate_leader",
        "lose_etcd",
        "lose_nats",
        "flap_leader_nats",
        "degrade_leader",
    } <= set(SCHEDULES)
    for schedule in SCHEDULES.values():
        assert schedule.validate() is schedule
        assert schedule.steps[-1].op == "heal"
    assert SHORT_SCHEDULE in SCHEDULES


def test_flap_cuts_and_heals_every_second() -> None:
    steps = SCHEDULES["flap_leader_nats"].steps
    assert [s.op for s in steps] == ["cut", "heal"] * FLAPS
    assert [s.at_s for s in steps] == [float(i) for i in range(2 * FLAPS)]


def test_held_cut_lasts_hold() -> None:
    steps = SCHEDULES["leader_etcd"].steps
    assert steps == (Step(0.0, "cut", "leader", ("etcd",)), Step(HOLD_S, "heal", "leader"))
    assert SCHEDULES["leader_etcd"].duration_s == HOLD_S + SCHEDULES["leader_etcd"].settle_s


def test_only_the_delay_schedule_needs_relays() -> None:
    assert [s.name for s in SCHEDULES.values() if s.needs_delay] == ["degrade_leader"]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ((Step(0, "cut", "leader"),), "never healed"),
        ((Step(1, "cut", "leader"), Step(0, "heal", "leader")), "time order"),
        ((Step(0, "cut", "leader", ("moon",)), Step(1, "heal", "leader")), "unknown roles"),
        ((Step(0, "loss", "leader", value=100), Step(1, "heal", "leader")), "loss"),
        ((Step(0, "delay", "leader", value=0), Step(1, "heal", "leader")), "delay"),
        ((), "non-empty"),
    ],
)
def test_bad_schedules_are_refused(steps: tuple[Step, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Schedule("bad", steps).validate()


def test_unavailability_is_the_longest_stretch_without_an_ack() -> None:
    assert longest_unavailable([1.0, 1.5, 4.0, 4.2], 0.0, 5.0) == pytest.approx(2.5)
    # The edges count: nothing acknowledged before 3.0, or after the last ack.
    assert longest_unavailable([3.0, 3.1], 0.0, 4.0) == pytest.approx(3.0)
    assert longest_unavailable([0.5], 0.0, 10.0) == pytest.approx(9.5)
    # Acks outside the window do not shorten it; none at all: the whole window.
    assert longest_unavailable([-1.0, 11.0], 0.0, 10.0) == pytest.approx(10.0)
    assert longest_unavailable([], 2.0, 2.0) == 0.0
    with pytest.raises(ValueError, match="before it starts"):
        longest_unavailable([], 2.0, 1.0)


def test_a_cut_drops_both_ways_and_a_loss_a_random_share() -> None:
    lab = Lab(tag="t")
    lab.hosts = {
        name: Host(name, f"ns-{name}", f"10.77.9.{i}", f"v{i}")
        for i, name in enumerate(["etcd-0", "nats-0", "ingest-0"], start=2)
    }
    lab.subnet = ipaddress.IPv4Network("10.77.9.0/24")
    cut = render_table([lab.rule(Fault(frozenset({"nats-0", "hub"})))])
    assert "ip saddr { 10.77.9.1, 10.77.9.3 } drop" in cut
    assert "ip daddr { 10.77.9.1, 10.77.9.3 } drop" in cut
    assert "hook input" in cut
    assert "hook output" in cut
    isolated = render_table([lab.rule(Fault(frozenset()))])
    assert 'iifname != "lo" drop' in isolated
    assert 'oifname != "lo" drop' in isolated
    lossy = render_table([lab.rule(Fault(frozenset({"etcd-0"}), 7))])
    assert "ip daddr { 10.77.9.2 } numgen random mod 100 < 7 drop" in lossy
    # Healed: the table is replaced by nothing; add-then-delete works whether it existed.
    assert render_table([]) == f"add table inet {TABLE}\ndelete table inet {TABLE}\n"


def test_faults_name_known_hosts_only() -> None:
    lab = Lab(tag="t")
    with pytest.raises(ValueError, match="no such host"):
        lab.cut("ingest-9")
    with pytest.raises(ValueError, match="loss percent"):
        lab.loss("ingest-0", 100)


def test_results_round_trip_and_table(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    rows = [
        RunResult("isolate_leader", 1, 1000, 0, 0, 7.0, leaders=["ingest-1@1", "ingest-0@2"]),
        RunResult("isolate_leader", 2, 900, 0, 0, 6.5),
        RunResult("lose_nats", 1, 800, 1, 2, 9.25),
    ]
    for row in rows:
        write_result(path, row)
    assert read_results(path) == rows
    assert table(rows).splitlines()[2:] == [
        "| isolate_leader | 2 | 1900 | 0 | 0 | 7.0 |",
        "| lose_nats | 1 | 800 | 1 | 2 | 9.2 |",
    ]
    assert not rows[2].ok
    assert rows[0].ok


def test_replicas_must_hold_every_committed_offset_with_the_served_message() -> None:
    committed = {0: "a", 1: "b"}
    agreeing = {"ingest-0": {0: "a", 1: "b", 2: "uncommitted"}, "ingest-1": {0: "a", 1: "b"}}
    assert divergence(committed, agreeing) == []
    wrong = {"ingest-0": {0: "a", 1: "x"}, "ingest-2": {0: "a"}}
    assert divergence(committed, wrong) == [
        "ingest-0@1: holds 'x', served 'b'",
        "ingest-2@1: holds None, served 'b'",
    ]
