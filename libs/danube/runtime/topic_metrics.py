"""Bounded label sets for the per-topic and per-subscription Prometheus series.

A topic name is a label value chosen by clients, so a series per topic is unbounded: a
million topics would be a million series in every scrape. Each process therefore names at
most ``metrics.topics_max`` topics (and ``metrics.subscriptions_max`` subscriptions), the
first it sees, for as long as it lives; everything else is summed under ``_other``. The
totals stay exact (a counter of ``_other`` holds all the rest), only the break-down is cut.
A cap of 0 exports every topic as ``_other``.

Counters take their labels from :func:`topic_label` / :func:`subscription_labels` as they
count. Gauges computed by sampling (a backlog, an upload lag) go through
:class:`GaugeSnapshot`, which sums what falls under one label set and removes the label sets
that went away, so a deleted subscription's gauge does not stay at its last value.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterable

from prometheus_client import Gauge

from danube.config import MetricsConfig
from danube.names import TopicName

OTHER = "_other"

__all__ = [
    "OTHER",
    "GaugeSnapshot",
    "LabelCap",
    "configure",
    "partition_labels",
    "subscription_labels",
    "topic_label",
]


class LabelCap:
    """Admits up to ``max_values`` distinct values, first come; the rest map to OTHER."""

    def __init__(self, max_values: int) -> None:
        self.max_values = max_values
        self._admitted: set[str] = set()
        self._lock = threading.Lock()  # the health server's scrape runs on another thread

    def of(self, value: str) -> str:
        """``value`` itself while there is room (or it was admitted before), else OTHER."""
        if value in self._admitted:
            return value
        with self._lock:
            if len(self._admitted) < self.max_values:
                self._admitted.add(value)
                return value
        return OTHER

    def resize(self, max_values: int) -> None:
        """A new cap; values already admitted keep their label (their series exist)."""
        with self._lock:
            self.max_values = max_values

    @property
    def admitted(self) -> int:
        """How many values have a label of their own."""
        return len(self._admitted)


_TOPICS = LabelCap(MetricsConfig().topics_max)
_SUBSCRIPTIONS = LabelCap(MetricsConfig().subscriptions_max)


def configure(config: MetricsConfig) -> None:
    """Apply the settings' caps (a service's start; the defaults hold until then)."""
    _TOPICS.resize(config.topics_max)
    _SUBSCRIPTIONS.resize(config.subscriptions_max)


def topic_label(name: TopicName | str) -> str:
    """The ``topic`` label of a topic or of one of its partitions: the topic's own name
    (``/ns/orders`` for ``/ns/orders-part-3``), or OTHER past the cap."""
    topic = name if isinstance(name, TopicName) else TopicName.parse(name)
    return _TOPICS.of(str(topic.parent))


def partition_labels(name: TopicName) -> tuple[str, str]:
    """``(topic, partition)`` labels; a partition of a topic past the cap is OTHER too."""
    topic = topic_label(name)
    return topic, str(name) if topic != OTHER else OTHER


def subscription_labels(topic: TopicName | str, subscription: str) -> tuple[str, str]:
    """``(topic, subscription)`` labels; each capped on its own."""
    label = topic_label(topic)
    admitted = _SUBSCRIPTIONS.of(f"{label}\x00{subscription}") != OTHER
    return label, subscription if admitted else OTHER


class GaugeSnapshot:
    """Sets a labelled gauge to a whole sample at once: values under one label set are
    summed, label sets missing from the sample are removed."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._shown: set[tuple[str, ...]] = set()

    def publish(self, sample: Iterable[tuple[tuple[str, ...], float]]) -> None:
        """``sample``: ``(labels, value)`` pairs, labels already capped (so several pairs
        may fall under one label set: their values are summed)."""
        totals: dict[tuple[str, ...], float] = defaultdict(float)
        for labels, value in sample:
            totals[labels] += value
        for labels, value in totals.items():
            self.gauge.labels(*labels).set(value)
        for gone in self._shown - totals.keys():
            with contextlib.suppress(KeyError):  # removed already
                self.gauge.remove(*gone)
        self._shown = set(totals)
