"""Bodies of the dispatcher bus API (subjects: ``subjects.dispatch(topic, sub, op)``).

Control bodies are small JSON documents; a poll reply is a delivery batch
(danube.wire.delivery): the frames as the WAL holds them, unchanged since they were read
and checked there, after a binary head that says where each came from. All integers
little-endian::

    attach request   {"consumer": name, "type": "exclusive"|"shared"|"failover"|"key_shared",
                      "start": S, "key_filters": [glob, ...], "failure_policy": P | null}
                     key_filters: key_shared only
                     S: "latest" | "earliest" | {"offset": N} | {"timestamp_ms": T}
                     P: danube.meta.failure_policy.FailurePolicy (applied when the attach
                     creates the subscription; another one than stored: policy_conflict)
    attach reply     {"consumer_id": id}
    poll request     {"consumer_id": id, "max": n, "wait_ms": ms}
    poll reply       a delivery batch (danube.wire.delivery), partitions by topic segment
    ack / nack       {"consumer_id": id, "ranges": [[partition, first, last], ...],
                      "messages": [{"partition", "offset"}], "delay_ms": ms}
                     ranges: runs of consecutive offsets (what clients send); messages:
                     single refs (older callers); at most REFS_MAX refs in all
    ack reply        {"ok": true, "not_in_flight": [{"partition", "offset"}]}   refs the ack
                     did nothing for (never delivered...; absent from older dispatchers)
    detach request   {"consumer_id": id}
    nack/detach      reply {"ok": true}
    seek request     {"position": S}      S as for attach
    seek reply       {"offsets": {partition: offset}}   what S resolved to, per partition
    skip request     {"partition": name, "to_offset": N | null}   null: past its damage
    skip reply       {"partition", "from_offset", "to_offset"}   the cursor moved from..to
    stats request    {} (or empty)
    stats reply      {"type", "partitions": [{"partition", "next_offset", "read_position",
                     "acked_beyond", "wal_start", "wal_next", "backlog"}],
                     "consumers": [{"consumer_id", "name", "unacked"}],
                     "failure_policy": P (effective), "dropped", "dead_lettered"}
                     a partition blocked by a poison message (policy "block") also has
                     "blocked_offset" and "blocked_redeliveries"
    delete request   {} (or empty)
    delete reply     {"ok": true}
    policy request   {"policy": P} replaces the failure policy; {} (or empty) reads it
    policy reply     {"policy": P | null, "effective": P with every field set}

A body that does not parse is refused with ``bad_request`` (:class:`BadRequestError`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from danube.meta.failure_policy import FailurePolicy
from danube.wire.delivery import (
    BatchFormatError,
    DeliveredMessage,
    batch_size,
    decode_batch,
    encode_batch,
    encode_columns,
)

# The one error of every contract, re-exported: callers raise ``protocol.BadRequestError``.
from danube.wire.errors import BadRequestError as BadRequestError
from danube.wire.opens import ConsumerName, ConsumerOpen

POLL_MAX_MESSAGES = 10_000
POLL_WAIT_MS_MAX = 30_000
NACK_DELAY_MS_MAX = 24 * 3600 * 1000
REFS_MAX = 100_000

_U64_MAX = 2**64 - 1

# Room in a poll reply for its JSON head beyond the entries, and per message for its head
# entry and frame header: a poll takes no more messages than fit one bus message.
REPLY_HEAD_BYTES = 4096
REPLY_BYTES_PER_MESSAGE = 128


def poll_reply_max(requested: int, max_payload_bytes: int, record_bytes_max: int) -> int:
    """How many messages of at most ``record_bytes_max`` bytes a poll reply takes (at least
    one, at most ``requested``) within ``max_payload_bytes``."""
    room = max_payload_bytes - REPLY_HEAD_BYTES
    return max(1, min(requested, room // (record_bytes_max + REPLY_BYTES_PER_MESSAGE)))


StartPosition = Literal["latest", "earliest"] | dict[str, int]
"""Where a new subscription starts, or a seek goes: ``"latest"``, ``"earliest"``,
``{"offset": N}`` (every partition) or ``{"timestamp_ms": T}`` (the first message published
at or after T, in each partition)."""


def check_position(position: StartPosition) -> StartPosition:
    """``position`` if it is one of the shapes of :data:`StartPosition`, else ValueError."""
    if position in ("latest", "earliest"):
        return position
    if isinstance(position, dict) and len(position) == 1:
        ((name, value),) = position.items()
        if name in ("offset", "timestamp_ms") and 0 <= value <= _U64_MAX:
            return position
    raise ValueError(
        f'expected "latest", "earliest", {{"offset": N}} or {{"timestamp_ms": T}}, got {position!r}'
    )


Position = Annotated[StartPosition, AfterValidator(check_position)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AttachRequest(ConsumerOpen):
    """A consumer joins a subscription (created on the first attach with ``type``): the
    consumer's open every door takes (danube.wire.opens: its name, spelled ``consumer`` on
    the bus, its type and key filters, held to the same rules), where a new subscription
    starts and the failure policy it is created with."""

    # Not strict, as every bus body; the name travels as "consumer", the key the layout
    # above gives it (a dispatcher of another version reads that key).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, serialize_by_alias=True)

    name: Annotated[ConsumerName, Field(alias="consumer")]
    start: Position = "latest"
    failure_policy: FailurePolicy | None = None


class PollRequest(_Body):
    """Up to ``max`` messages, waiting at most ``wait_ms`` for the first."""

    consumer_id: Annotated[str, Field(min_length=1, max_length=128)]
    max: Annotated[int, Field(ge=1, le=POLL_MAX_MESSAGES)] = 100
    wait_ms: Annotated[int, Field(ge=0, le=POLL_WAIT_MS_MAX)] = 1000


class MessageRef(_Body):
    """One message of a subscription: its partition (topic segment) and offset."""

    partition: Annotated[str, Field(min_length=1, max_length=256)]
    offset: Annotated[int, Field(ge=0, le=2**64 - 1)]


# A run of offsets of one partition: (partition segment, first offset, last offset).
RefRange = tuple[
    Annotated[str, Field(min_length=1, max_length=256)],
    Annotated[int, Field(ge=0, le=_U64_MAX)],
    Annotated[int, Field(ge=0, le=_U64_MAX)],
]


class AckRequest(_Body):
    """Ack or nack ``messages`` and the offsets of ``ranges`` (runs of consecutive offsets:
    a consumer acks most messages in delivery order, so a batch of acks is a few runs, not
    one object per message); ``delay_ms`` only matters to a nack."""

    consumer_id: Annotated[str, Field(min_length=1, max_length=128)]
    messages: Annotated[list[MessageRef], Field(max_length=REFS_MAX)] = []
    ranges: Annotated[list[RefRange], Field(max_length=REFS_MAX)] = []
    delay_ms: Annotated[int, Field(ge=0, le=NACK_DELAY_MS_MAX)] = 0

    def refs(self) -> list[tuple[str, int]]:
        """Every ``(partition, offset)`` named, ``messages`` first; BadRequestError for a
        range that runs backwards or more than ``REFS_MAX`` refs in all."""
        return [(m.partition, m.offset) for m in self.messages] + expand_ranges(
            self.ranges, REFS_MAX - len(self.messages)
        )

    def partitions(self) -> set[str]:
        """The partitions the request names (one look per message and per range)."""
        return {m.partition for m in self.messages} | {run[0] for run in self.ranges}

    def count(self) -> int:
        """How many refs the request names (a range running backwards counts none)."""
        runs = sum(max(last - first + 1, 0) for _, first, last in self.ranges)
        return len(self.messages) + runs


def expand_ranges(ranges: Sequence[tuple[str, int, int]], refs_max: int) -> list[tuple[str, int]]:
    """The ``(partition, offset)`` refs of ``ranges`` in their order; BadRequestError for a
    range whose last offset is below its first, or past ``refs_max`` refs in all (checked
    before anything is built)."""
    total = 0
    for partition, first, last in ranges:
        if last < first:
            raise BadRequestError(f"range {partition} {first}..{last} runs backwards")
        total += last - first + 1
    if total > refs_max:
        raise BadRequestError(f"{total} refs in one request, at most {refs_max}")
    return [(p, offset) for p, first, last in ranges for offset in range(first, last + 1)]


def ref_ranges(refs: Iterable[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """``refs`` as runs of consecutive offsets of one partition, in their order (a ref that
    does not continue the run before it starts a new one)."""
    runs: list[list[Any]] = []
    last: list[Any] | None = None
    for partition, offset in refs:
        if last is not None and last[0] == partition and last[2] + 1 == offset:
            last[2] = offset
        else:
            last = [partition, offset, offset]
            runs.append(last)
    return [(p, first, end) for p, first, end in runs]


class DetachRequest(_Body):
    """A consumer leaves; its unacked messages go to the others."""

    consumer_id: Annotated[str, Field(min_length=1, max_length=128)]


class SeekRequest(_Body):
    """Move the subscription's cursor in every partition (unacked messages included)."""

    position: Position


class SkipRequest(_Body):
    """Move one partition's cursor forward past offsets on purpose (damaged ones): to
    ``to_offset``, or, when None, past the damage that stops the partition."""

    partition: Annotated[str, Field(min_length=1, max_length=256)]
    to_offset: Annotated[int | None, Field(ge=0, le=2**64 - 1)] = None


class PolicyRequest(_Body):
    """Replace the subscription's failure policy with ``policy``; ``None``: read it."""

    policy: FailurePolicy | None = None


class EmptyRequest(_Body):
    """A request with nothing to say (stats, delete): ``{}`` or an empty body."""


class _Reply(BaseModel):
    # Replies ignore fields they do not know: an older caller reads a newer dispatcher.
    model_config = ConfigDict(extra="ignore", frozen=True)


class SkipReply(_Reply):
    """What a skip did: the partition's cursor moved from ``from_offset`` to ``to_offset``;
    the offsets between were never delivered."""

    partition: str
    from_offset: int
    to_offset: int


class PolicyReply(_Reply):
    """A subscription's failure policy as stored (``None``: never set, all the cluster's)
    and as in effect (every field set)."""

    policy: FailurePolicy | None
    effective: FailurePolicy


class PartitionStats(_Reply):
    """One partition of a subscription: its cursor, the WAL's ends (``None`` when its ingest
    owner did not answer) and the backlog between them (danube.dispatcher.backlog)."""

    partition: str
    next_offset: int
    read_position: int
    acked_beyond: int
    wal_start: int | None
    wal_next: int | None
    backlog: int | None
    damaged: str | None = None  # offsets no copy holds intact stop this partition (which)
    # A poison message holds the partition (failure policy "block"): its offset and count.
    blocked_offset: int | None = None
    blocked_redeliveries: int | None = None


class ConsumerStats(_Reply):
    """One attached consumer and how many messages it holds unacked."""

    consumer_id: str
    name: str
    unacked: int


class SubscriptionStats(_Reply):
    """The live state of a served subscription."""

    type: str
    partitions: list[PartitionStats]
    consumers: list[ConsumerStats]
    failure_policy: FailurePolicy | None = None  # in effect (None from older dispatchers)
    dropped: int = 0  # poison messages dropped since this dispatcher serves it
    dead_lettered: int = 0  # and dead-lettered
    expired: int = 0  # messages let go past their TTL (danube.dispatcher.expiring), likewise
    delayed: int = 0  # delayed messages held, not yet acked (danube.dispatcher.delayed)


_M = TypeVar("_M", bound=BaseModel)


def parse(body: bytes, model: type[_M]) -> _M:
    """``body`` decoded as ``model`` (an empty body as ``{}``); BadRequestError naming the
    first bad field."""
    try:
        return model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        raise _refusal(model, exc) from exc


def validated(fields: dict[str, object], model: type[_M]) -> _M:
    """``fields`` checked as :func:`parse` checks a body of ``model`` (the same
    BadRequestError), for a caller in the same process that holds them as values."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise _refusal(model, exc) from exc


def _refusal(model: type[BaseModel], exc: ValidationError) -> BadRequestError:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    return BadRequestError(f"{model.__name__}: {where}: {first['msg']}")


def encode(model: BaseModel) -> bytes:
    """A request body as JSON."""
    return model.model_dump_json().encode()


def encode_ack_reply(not_in_flight: Sequence[tuple[str, int]]) -> bytes:
    """The reply to an ack: ok, and the refs that were not in flight."""
    refs = [{"partition": p, "offset": o} for p, o in not_in_flight]
    return orjson.dumps({"ok": True, "not_in_flight": refs})


def decode_ack_reply(body: bytes) -> list[tuple[str, int]]:
    """The refs an ack reply names as not in flight (none in an older dispatcher's reply);
    BadRequestError when it is not an ack reply."""
    try:
        refs = orjson.loads(body).get("not_in_flight", [])
        return [(str(ref["partition"]), int(ref["offset"])) for ref in refs]
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise BadRequestError(f"ack reply is not one: {body[:200]!r}") from exc


PolledMessage = DeliveredMessage
"""One message of a poll reply: its ``frame`` as the WAL holds it, ``record`` checks it."""


def encode_poll_reply(messages: Sequence[PolledMessage]) -> bytes:
    """A delivery batch of ``messages`` (their frames as they are)."""
    return encode_batch(messages)


def encode_poll_columns(
    partitions: Sequence[str],
    redelivery_counts: Sequence[int],
    frames: Sequence[bytes | memoryview],
) -> bytes:
    """The poll reply of message ``i`` = ``frames[i]`` of ``partitions[i]`` (redelivered
    ``redelivery_counts[i]`` times): what :func:`encode_poll_reply` gives for the same
    messages, without a :data:`PolledMessage` built per message."""
    return encode_columns(partitions, redelivery_counts, frames)


class PollBatch(list[PolledMessage]):
    """A poll reply: its messages (views of the body), in order, and its ``body`` (a
    delivery batch, to pass on as it is)."""

    def __init__(self, body: bytes, messages: list[PolledMessage]) -> None:
        super().__init__(messages)
        self.body = body

    @property
    def messages(self) -> list[PolledMessage]:
        """The messages (the batch itself)."""
        return self


def decode_poll_reply(body: bytes) -> PollBatch:
    """The messages of a poll reply; BadRequestError if it is not a delivery batch."""
    try:
        return PollBatch(body, decode_batch(body))
    except BatchFormatError as exc:
        raise BadRequestError(f"poll reply: {exc.message}") from exc


class PolledFrames(NamedTuple):
    """A poll reply to pass on as it is: its ``body`` (a delivery batch) and how many
    messages it holds, its layout checked but not split into messages."""

    body: bytes
    size: int


def check_poll_reply(body: bytes) -> PolledFrames:
    """The poll reply in ``body``, checked as :func:`decode_poll_reply` checks it (without a
    message built per frame: a hop that passes it on never needs them); BadRequestError if
    it is not a delivery batch."""
    try:
        return PolledFrames(body, batch_size(body))
    except BatchFormatError as exc:
        raise BadRequestError(f"poll reply: {exc.message}") from exc
