"""Many topics in one subscription over HTTP (``GET /v1/namespaces/{ns}/subscriptions/{sub}/
stream``, docs/http-api.md "Consume many topics") without any I/O: which topics a stream
takes (:class:`TopicSelector`), how the credits its client grants are lent to the polls of
its topics in turn (:class:`Lender`), and to which topic each ref of an ack belongs
(:func:`runs_by_topic`). :mod:`danube.discovery.doors.http.multi_stream` does the I/O around it.

A selector is a list of topic names or a regular expression matched against a whole topic
name within the namespace, as the SDK's ``multi_consumer`` (``re.fullmatch``). The pattern
comes from any client and runs in the event loop, so it is matched with the ``regex``
module under a deadline (:data:`PATTERN_MATCH_TIMEOUT_S`): a pattern that backtracks
catastrophically is refused, not run for minutes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import regex

from danube.discovery.errors import BadRequestError, StreamProtocolError
from danube.names import InvalidNameError, TopicName
from danube.wire.consume.models import FLOW_CREDITS_CAP, AckRequest

__all__ = [
    "INVALID_PATTERN",
    "PATTERN_CHARS_MAX",
    "TOO_MANY_TOPICS",
    "Lender",
    "Loan",
    "TopicSelector",
    "runs_by_topic",
]

INVALID_PATTERN = "invalid_pattern"  # 400: topics_pattern is not a regex, or too slow to match
TOO_MANY_TOPICS = "too_many_topics"  # 409: a pattern matches more than the stream may join
PATTERN_CHARS_MAX = 512  # as the SDK's multi_consumer
# One match of the pattern against one name (at most 255 characters) takes microseconds;
# one that takes this long backtracks without end and the pattern is refused.
PATTERN_MATCH_TIMEOUT_S = 0.05
# Messages asked of one topic's dispatcher in one poll at most.
POLL_BATCH_MAX = 1000


class TopicSelector:
    """The topics of ``namespace`` a stream takes: those ``topics`` names, or those
    ``pattern`` matches whole (exactly one of the two). BadRequestError ``invalid_name``,
    ``invalid_request`` or ``invalid_pattern`` when they are not valid."""

    def __init__(
        self,
        namespace: str,
        *,
        topics: Sequence[str] | None = None,
        pattern: str | None = None,
        topics_max: int,
    ) -> None:
        if (topics is None) == (pattern is None):
            raise BadRequestError(
                "give either topics (a comma-separated list) or topics_pattern",
                code="invalid_request",
            )
        self.namespace = namespace
        self.listed: frozenset[str] | None = None
        self._pattern: regex.Pattern[str] | None = None
        if topics is not None:
            self.listed = frozenset(_listed(namespace, topics, topics_max))
        else:
            assert pattern is not None
            self._pattern = _compiled(pattern)

    def matches(self, name: str) -> bool:
        """Whether the topic ``name`` (within the namespace) is one of the stream's;
        BadRequestError ``invalid_pattern`` when the pattern takes too long on it."""
        if self.listed is not None:
            return name in self.listed
        assert self._pattern is not None
        try:
            return self._pattern.fullmatch(name, timeout=PATTERN_MATCH_TIMEOUT_S) is not None
        except TimeoutError:
            raise BadRequestError(
                f"topics_pattern took over {PATTERN_MATCH_TIMEOUT_S} s to match {name!r}:"
                " it backtracks without end; write it without nested repetition",
                code=INVALID_PATTERN,
            ) from None

    def select(self, names: Iterable[str]) -> list[str]:
        """The names of ``names`` the stream takes, sorted."""
        return sorted(name for name in names if self.matches(name))


def _listed(namespace: str, topics: Sequence[str], topics_max: int) -> list[str]:
    if not 1 <= len(topics) <= topics_max:
        raise BadRequestError(
            f"topics: 1 … {topics_max} names (discovery.stream_topics_max), not {len(topics)}",
            code="invalid_request",
        )
    for name in topics:
        try:
            topic = TopicName(namespace, name)
        except InvalidNameError as exc:
            raise BadRequestError(f"topics: {exc.message}", code="invalid_name") from exc
        if topic.partition is not None:
            raise BadRequestError(
                f"topics: {name!r} is a partition; name its topic", code="invalid_name"
            )
    return list(topics)


def _compiled(pattern: str) -> regex.Pattern[str]:
    if not 1 <= len(pattern) <= PATTERN_CHARS_MAX:
        raise BadRequestError(
            f"topics_pattern: 1 … {PATTERN_CHARS_MAX} characters, not {len(pattern)}",
            code=INVALID_PATTERN,
        )
    try:
        # VERSION0: the syntax and meaning of Python's re, as the SDK matches.
        return regex.compile(pattern, flags=regex.VERSION0)
    except (regex.error, ValueError, OverflowError) as exc:
        message = f"topics_pattern {pattern[:100]!r}: {exc}"
        raise BadRequestError(message, code=INVALID_PATTERN) from exc


@dataclass(frozen=True, slots=True)
class Loan:
    """``credits`` lent to the poll of ``topic``: it may ask its dispatcher for that many."""

    topic: str
    credits: int


class Lender:
    """The credits a stream's client granted, lent to its topics' polls in turn.

    Every topic asks (:meth:`ask`) and waits in one first-in first-out line; credits go to
    the head of the line while any remain. A topic whose last poll brought nothing is
    *idle* and borrows one credit (its poll waits for its first message). A *busy* one (its
    last poll brought messages) borrows an equal share of the credits outstanding (lent or
    available) that the idle topics leave, split over every busy topic, in line or not: a
    topic with a deep backlog at the head of the line cannot take what the next busy ones
    will need. At most :data:`POLL_BATCH_MAX`. A poll gives back what it did not use
    (:meth:`settle`) and its topic asks again at the back of the line, so every topic gets
    its turn. Credits outstanding (granted, not yet spent) never pass ``limit``.

    Every method that may lend returns the loans it made; the caller hands them over.
    """

    def __init__(self, limit: int = FLOW_CREDITS_CAP, batch_max: int = POLL_BATCH_MAX) -> None:
        self.limit = limit
        self.batch_max = batch_max
        self.available = 0  # granted, neither lent nor spent
        self.lent = 0  # lent to polls under way
        self.spent = 0  # messages sent, over the stream's life
        self._line: OrderedDict[str, None] = OrderedDict()  # topics waiting, in asking order
        self._busy: dict[str, bool] = {}  # every topic of the stream: busy at its last ask

    @property
    def waiting(self) -> list[str]:
        """The topics in line, head first."""
        return list(self._line)

    def grant(self, credits: int) -> list[Loan]:
        """Add ``credits`` (a flow frame); StreamProtocolError ``too_many_credits`` (nothing
        added) when more than ``limit`` would be outstanding."""
        if credits < 1:
            raise StreamProtocolError(f"a flow frame grants at least 1 credit, not {credits}")
        outstanding = self.available + self.lent
        if outstanding + credits > self.limit:
            raise StreamProtocolError(
                f"granting {credits} credits would put {outstanding + credits} outstanding,"
                f" over the limit of {self.limit}",
                code="too_many_credits",
            )
        self.available += credits
        return self._lend()

    def ask(self, topic: str, *, busy: bool) -> list[Loan]:
        """Put ``topic`` in line for a loan (``busy``: its last poll brought messages)."""
        if topic in self._line:
            raise ValueError(f"{topic} is in line already")
        self._line[topic] = None
        self._busy[topic] = busy
        return self._lend()

    def withdraw(self, topic: str) -> None:
        """Take ``topic`` out of the line and out of the stream (it left, or stopped
        waiting); no-op when not in it."""
        self._line.pop(topic, None)
        self._busy.pop(topic, None)

    def settle(self, loan: Loan, used: int) -> list[Loan]:
        """A poll under ``loan`` is over and ``used`` of its credits went to messages sent;
        the rest come back."""
        if not 0 <= used <= loan.credits <= self.lent:
            raise ValueError(f"settling {used} of {loan} with {self.lent} lent")
        self.lent -= loan.credits
        self.spent += used
        self.available += loan.credits - used
        return self._lend()

    def _lend(self) -> list[Loan]:
        loans: list[Loan] = []
        while self._line and self.available > 0:
            topic = next(iter(self._line))
            size = self._share() if self._busy[topic] else 1
            del self._line[topic]
            self.available -= size
            self.lent += size
            loans.append(Loan(topic, size))
        return loans

    def _share(self) -> int:
        busy = sum(self._busy.values())
        idle = len(self._busy) - busy
        fair = max(self.available + self.lent - idle, 0) // max(busy, 1)
        return max(1, min(fair, self.batch_max, self.available))


def runs_by_topic(namespace: str, body: AckRequest) -> dict[str, list[tuple[str, int, int]]]:
    """The ``(partition segment, first, last)`` runs of an ack or nack frame by topic (its
    name within ``namespace``), in the order they came; BadRequestError
    ``invalid_partition`` when a ref names no partition of the namespace."""
    runs: dict[str, list[tuple[str, int, int]]] = {}
    parents: dict[str, TopicName] = {}  # each name parsed once, however many refs name it

    def add(name: str, first: int, last: int, where: str) -> None:
        partition = parents.get(name)
        if partition is None:
            try:
                partition = parents[name] = TopicName.parse(name)
            except InvalidNameError as exc:
                raise BadRequestError(
                    f"{where}.partition: {exc.message}", code="invalid_partition"
                ) from exc
        if partition.namespace != namespace:
            raise BadRequestError(
                f"{where}.partition {partition} is not of namespace {namespace}",
                code="invalid_partition",
            )
        runs.setdefault(partition.parent.topic, []).append((partition.topic, first, last))

    for i, ref in enumerate(body.messages):
        add(ref.partition, ref.offset, ref.offset, f"messages[{i}]")
    for i, run in enumerate(body.ranges):
        add(run.partition, run.first, run.last, f"ranges[{i}]")
    return runs
