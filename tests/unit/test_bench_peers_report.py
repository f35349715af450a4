"""The pure half of the peer bench (tests/bench/peers_report.py): /proc CPU parsing, per-run
ratios and their medians, and the table's rows."""

from __future__ import annotations

import pytest

from peers_report import (
    Comparison,
    cpu_rows,
    cpu_seconds_of_stat,
    cpu_us_per_message,
    quantile_ms,
    summarize,
    table_rows,
)

pytestmark = pytest.mark.unit

# A real line's shape, the command name with a space and a ")" in it (utime 250, stime 50).
STAT = (
    "4242 (python (x) y) S 1 4242 4242 0 -1 4194560 9182 0 0 0 250 50 0 0 20 0 3 0 "
    "1234 56789 1000 18446744073709551615 1 1 0 0 0 0 0 16781312 17384 0 0 0 17 1 0 0 0 0 0"
)


def test_cpu_seconds_count_from_the_last_parenthesis() -> None:
    assert cpu_seconds_of_stat(STAT, 100) == pytest.approx(3.0)


@pytest.mark.parametrize("text", ["", "4242 (python) S 1 2", "no parenthesis at all"])
def test_cpu_seconds_refuse_what_is_not_a_stat_line(text: str) -> None:
    with pytest.raises(ValueError, match="not a /proc"):
        cpu_seconds_of_stat(text, 100)


def test_cpu_per_message_in_microseconds() -> None:
    assert cpu_us_per_message(1.0, 1.5, 10_000) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="backwards"):
        cpu_us_per_message(2.0, 1.0, 10)  # time going backwards is a wrong pid, not a result
    with pytest.raises(ValueError, match="positive"):
        cpu_us_per_message(1.0, 2.0, 0)


def test_quantile_is_the_nearest_rank_in_milliseconds() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1 ms .. 100 ms
    assert quantile_ms(samples, 0.50) == pytest.approx(50.0)
    assert quantile_ms(samples, 0.99) == pytest.approx(99.0)
    assert quantile_ms([0.003], 0.99) == pytest.approx(3.0)


BATCHED = Comparison("batched", "msg/s", "b.mesh", "Redis", "b.redis")
E2E = Comparison("e2e", "p99 ms", "e.mesh", goal="goal p99 ≤ 10 ms")


def test_ratio_is_the_median_of_ratios_within_each_run() -> None:
    # Run 2 is slow on both sides (a noisy neighbour): its ratio stays 2.0, while the ratio
    # of the medians (200 / 80) would say 2.5.
    runs = [
        {"b.mesh": 200.0, "b.redis": 100.0},
        {"b.mesh": 20.0, "b.redis": 10.0},
        {"b.mesh": 300.0, "b.redis": 80.0},
    ]
    [line] = summarize(runs, [BATCHED])
    assert (line.mesh, line.peer, line.runs) == (200.0, 80.0, 3)
    assert line.ratio == pytest.approx(2.0)


def test_a_run_missing_a_side_gives_no_ratio() -> None:
    runs = [{"b.mesh": 100.0}, {"b.mesh": 300.0, "b.redis": 100.0}, {"e.mesh": 7.0}]
    batched, e2e = summarize(runs, [BATCHED, E2E])
    assert batched.ratio == pytest.approx(3.0)
    assert batched.mesh == 200.0
    assert (e2e.mesh, e2e.peer, e2e.ratio, e2e.runs) == (7.0, None, None, 1)


def test_table_names_a_row_once_and_shows_the_goal_without_a_peer() -> None:
    second = Comparison("batched", "msg/s", "b.mesh", "JetStream", "b.js")
    runs = [{"b.mesh": 1500.0, "b.redis": 1000.0, "b.js": 3000.0, "e.mesh": 12.5}]
    rows = table_rows(summarize(runs, [BATCHED, second, E2E]))
    assert rows == [
        ("batched", "msg/s", "1,500", "Redis", "1,000", "1.50x"),
        ("", "msg/s", "1,500", "JetStream", "3,000", "0.50x"),
        ("e2e", "p99 ms", "12.50", "goal p99 ≤ 10 ms", "—", "—"),
    ]


def test_cpu_rows_take_medians_per_process_in_first_seen_order() -> None:
    runs = [
        {"cpu_us_per_msg.ingest": 30.0, "cpu_us_per_msg.discovery": 20.0, "other": 1.0},
        {"cpu_us_per_msg.ingest": 10.0, "cpu_us_per_msg.discovery": 40.0},
        {"cpu_us_per_msg.ingest": 20.0, "cpu_us_per_msg.redis-server": 5.0},
    ]
    assert cpu_rows(runs) == [("ingest", "20.00"), ("discovery", "30.00"), ("redis-server", "5.00")]
