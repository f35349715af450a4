"""A history checker for fault tests: record produce requests, their answers and every delivery,
then look for anomalies per partition. Pure Python, no servers.

What counts as wrong (`Report.ok` is False): an acked message never delivered (lost), one offset
of a partition holding two different messages (conflict), a consumer receiving an offset for the
first time below one it already received for the first time (order violation), offsets
missing between the first and last delivered of a partition (gap), and — when asked, for
idempotent producers — one message stored at two offsets (stored twice). What is allowed
and counted: redeliveries (at-least-once) and delivered messages whose produce was not acked
(an error or a timeout says nothing about whether the broker stored the message).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# How many examples of each kind `Report.summary` prints: enough to start debugging, short
# enough for an assert message.
SUMMARY_EXAMPLES_MAX = 3


@dataclass(frozen=True)
class Produce:
    """One message a producer sent, and what the broker answered."""

    msg_id: str  # unique payload id the test put into the message
    partition: str | None  # known once acked
    offset: int | None  # None unless acked
    acked: bool  # True: answered with an offset; False: error or timeout (stored or not)


@dataclass(frozen=True)
class Delivery:
    """One message a consumer received."""

    msg_id: str
    partition: str
    offset: int
    consumer: str = ""


Event = Produce | Delivery


@dataclass
class Report:
    """What `History.check` found; `ok` is False on any anomaly that breaks the guarantees."""

    lost: list[Produce] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    duplicates: int = 0
    order_violations: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    unacked_delivered: int = 0
    stored_twice: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No lost messages, conflicts, order violations, gaps or messages stored twice."""
        return not (
            self.lost or self.conflicts or self.order_violations or self.gaps or self.stored_twice
        )

    def summary(self) -> str:
        """A few lines for a failing assert: counts and the first few examples of each kind."""
        lines = [
            f"ok={self.ok} lost={len(self.lost)} conflicts={len(self.conflicts)} "
            f"order_violations={len(self.order_violations)} gaps={len(self.gaps)} "
            f"duplicates={self.duplicates} unacked_delivered={self.unacked_delivered} "
            f"stored_twice={len(self.stored_twice)}"
        ]
        lost = [f"{p.msg_id} at {p.partition}@{p.offset}" for p in self.lost]
        kinds = [
            ("lost", lost),
            ("conflict", self.conflicts),
            ("order", self.order_violations),
            ("gap", self.gaps),
            ("stored twice", self.stored_twice),
        ]
        for name, examples in kinds:
            for example in examples[:SUMMARY_EXAMPLES_MAX]:
                lines.append(f"  {name}: {example}")
            if len(examples) > SUMMARY_EXAMPLES_MAX:
                lines.append(f"  {name}: ... {len(examples) - SUMMARY_EXAMPLES_MAX} more")
        return "\n".join(lines)


class History:
    """Collects produce and delivery events in the order they happened.

    Appending to a list is atomic, so tasks of one event loop (or threads) may record freely.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []

    def produced(
        self,
        msg_id: str,
        *,
        partition: str | None = None,
        offset: int | None = None,
        acked: bool,
    ) -> None:
        """Record a produce request and its outcome; an acked one must name partition and offset."""
        self.events.append(_checked(Produce(msg_id, partition, offset, acked)))

    def delivered(self, msg_id: str, *, partition: str, offset: int, consumer: str = "") -> None:
        """Record one message a consumer received."""
        self.events.append(_checked(Delivery(msg_id, partition, offset, consumer)))

    @property
    def produces(self) -> list[Produce]:
        """The produce events, in order."""
        return [e for e in self.events if isinstance(e, Produce)]

    @property
    def deliveries(self) -> list[Delivery]:
        """The delivery events, in order."""
        return [e for e in self.events if isinstance(e, Delivery)]

    def dump(self, path: Path) -> None:
        """Write the events as JSON lines: {"kind": "produce"|"delivery", ...fields}."""
        with path.open("w", encoding="utf-8") as out:
            for event in self.events:
                kind = "produce" if isinstance(event, Produce) else "delivery"
                out.write(json.dumps({"kind": kind, **asdict(event)}) + "\n")

    @classmethod
    def load(cls, path: Path) -> History:
        """Read what `dump` wrote; a malformed line raises ValueError naming its number."""
        history = cls()
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    history.events.append(_checked(_parse(json.loads(line))))
                except (ValueError, TypeError, KeyError) as exc:
                    raise ValueError(f"{path}:{number}: bad history event: {exc}") from exc
        return history

    def check(
        self,
        *,
        expect_contiguous_from: dict[str, int] | None = None,
        exactly_once: bool = False,
    ) -> Report:
        """Look for anomalies; `expect_contiguous_from` gives a partition's first offset that
        must be delivered, so a missing head counts as a gap; `exactly_once` (idempotent
        producers): a message acknowledged or delivered at two offsets was stored twice."""
        report = Report()
        acked_at = self._acked_offsets(report)
        delivered_at = self._delivered_offsets(report, acked_at)
        # Lost: its own delivery never came (another message at that offset is a conflict and does
        # not stand in for it). Sets, because a failing fault test may lose many thousands.
        lost = {p for p in self.produces if p.acked} - {
            Produce(d.msg_id, d.partition, d.offset, True) for d in self.deliveries
        }
        report.lost = [p for p in dict.fromkeys(self.produces) if p in lost]
        acked_ids = {p.msg_id for p in self.produces if p.acked}
        unacked_ids = {p.msg_id for p in self.produces if not p.acked} - acked_ids
        report.unacked_delivered = len(unacked_ids & {d.msg_id for d in self.deliveries})
        report.order_violations = self._order_violations()
        report.gaps = _gaps(delivered_at, expect_contiguous_from or {})
        if exactly_once:
            report.stored_twice = self._stored_twice()
        return report

    def _stored_twice(self) -> list[str]:
        places: dict[str, set[tuple[str, int]]] = defaultdict(set)
        for p in self.produces:
            if p.acked and p.partition is not None and p.offset is not None:
                places[p.msg_id].add((p.partition, p.offset))
        for d in self.deliveries:
            places[d.msg_id].add((d.partition, d.offset))
        return [
            f"{msg_id} at {', '.join(_at(place) for place in sorted(found))}"
            for msg_id, found in places.items()
            if len(found) > 1
        ]

    def _acked_offsets(self, report: Report) -> dict[tuple[str, int], str]:
        """The message each acked offset holds; a second message acked there is a conflict."""
        acked_at: dict[tuple[str, int], str] = {}
        for p in self.produces:
            if p.acked and p.partition is not None and p.offset is not None:
                key = (p.partition, p.offset)
                held = acked_at.setdefault(key, p.msg_id)
                if held != p.msg_id:
                    report.conflicts.append(f"{_at(key)} acked for both {held} and {p.msg_id}")
        return acked_at

    def _delivered_offsets(
        self, report: Report, acked_at: dict[tuple[str, int], str]
    ) -> dict[tuple[str, int], str]:
        """The message first delivered at each offset; counts redeliveries, notes conflicts."""
        delivered_at: dict[tuple[str, int], str] = {}
        for d in self.deliveries:
            key = (d.partition, d.offset)
            first = delivered_at.get(key)
            if first is None:
                delivered_at[key] = d.msg_id
                acked = acked_at.get(key)
                if acked is not None and acked != d.msg_id:
                    report.conflicts.append(f"{_at(key)} acked for {acked}, delivered {d.msg_id}")
            elif first == d.msg_id:
                report.duplicates += 1
            else:
                report.conflicts.append(f"{_at(key)} delivered both {first} and {d.msg_id}")
        return delivered_at

    def _order_violations(self) -> list[str]:
        seen: dict[tuple[str, str], set[int]] = defaultdict(set)
        last_new: dict[tuple[str, str], int] = {}
        violations: list[str] = []
        for d in self.deliveries:
            stream = (d.consumer, d.partition)
            if d.offset in seen[stream]:
                continue  # a redelivery: at-least-once allows it anywhere
            seen[stream].add(d.offset)
            previous = last_new.get(stream)
            if previous is not None and d.offset < previous:
                violations.append(
                    f"consumer {d.consumer!r} got {_at((d.partition, d.offset))} "
                    f"after offset {previous}"
                )
            last_new[stream] = d.offset
        return violations


def _gaps(delivered_at: dict[tuple[str, int], str], expect_from: dict[str, int]) -> list[str]:
    """Missing offset ranges per partition, from sorted offsets, so the cost follows the
    number of deliveries and not the width of the range."""
    offsets: dict[str, list[int]] = defaultdict(list)
    for partition, offset in delivered_at:
        offsets[partition].append(offset)
    gaps: list[str] = []
    for partition in sorted(offsets):
        ordered = sorted(offsets[partition])
        start = expect_from.get(partition, ordered[0])
        previous = start - 1
        for offset in ordered:
            if offset > previous + 1:
                gaps.append(f"{partition}: offsets {previous + 1}..{offset - 1} missing")
            previous = max(previous, offset)
    return gaps


def _at(key: tuple[str, int]) -> str:
    return f"{key[0]}@{key[1]}"


def _checked(event: Event) -> Event:
    """Check an event before it enters the history: a wrong one would skew every report."""
    if not isinstance(event.msg_id, str) or not event.msg_id:
        raise ValueError(f"msg_id must be a non-empty string: {event!r}")
    if isinstance(event, Produce):
        if not isinstance(event.acked, bool):
            raise ValueError(f"acked must be a bool: {event!r}")
        if event.acked and (event.partition is None or event.offset is None):
            raise ValueError(f"an acked produce needs partition and offset: {event!r}")
    elif event.partition is None or event.offset is None:  # typed so, but loaded from JSON
        raise ValueError(f"a delivery needs partition and offset: {event!r}")
    if not isinstance(event.partition, str | None):
        raise ValueError(f"partition must be a string: {event!r}")
    if event.offset is not None and not _is_offset(event.offset):
        raise ValueError(f"offset must be an int >= 0: {event!r}")
    return event


def _is_offset(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse(record: Any) -> Event:
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    kind = record.pop("kind", None)
    if kind == "produce":
        return Produce(**record)
    if kind == "delivery":
        return Delivery(**record)
    raise ValueError(f"unknown kind {kind!r}")
