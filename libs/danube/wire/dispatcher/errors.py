"""Errors of the dispatcher: what it refuses, by code (they travel over the bus as codes).

::

    DanubeError
    └── DispatcherError              "dispatcher_error"
        ├── SubscriptionTakenError   "subscription_taken"
        ├── ConsumerExistsError      "consumer_exists"
        ├── PolicyConflictError      "policy_conflict"
        ├── ConsumerNotFoundError    "consumer_not_found"
        │   └── ConsumerDetachedError "consumer_detached" (detached for never acking)
        ├── SubscriptionNotFoundError "subscription_not_found"
        ├── UnknownPartitionError    "unknown_partition"
        ├── OffsetOutOfRangeError    "offset_out_of_range"
        ├── PositionUnavailableError "position_unavailable" (retriable)
        ├── AckNotDurableError       "ack_not_durable" (retriable)
        ├── ClaimRefusedError        "claim_refused" (retriable)
        ├── DataDamagedError         "data_damaged"
        └── PolicyLimitError         "too_many_subscriptions", "too_many_consumers"

A body that breaks its layout is :class:`danube.wire.errors.BadRequestError`, the error of
every contract. These carry no HTTP status: each states its kind (danube.errors.ErrorKind),
which travels with its code over the bus and which every door answers with its own status.

``SubscriptionTakenError`` is the refusal of a second consumer on an exclusive
subscription; ``OffsetOutOfRangeError`` refuses a seek or start past a partition's end,
and ``PositionUnavailableError`` one that cannot be checked or resolved now (the partition's
ingest owner, or the cloud tier, did not answer); the others are programming or protocol
mistakes of the caller.
"""

from __future__ import annotations

from danube.errors import DanubeError, ErrorKind


class DispatcherError(DanubeError):
    """Root of the dispatcher errors."""

    code = "dispatcher_error"


class SubscriptionTakenError(DispatcherError):
    """An exclusive subscription already has its consumer; ``holder`` is its id."""

    code = "subscription_taken"
    kind = ErrorKind.CONFLICT

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class ConsumerExistsError(DispatcherError):
    """A consumer id attached twice to one subscription."""

    code = "consumer_exists"
    kind = ErrorKind.CONFLICT

    def __init__(self, message: str, *, consumer_id: str) -> None:
        super().__init__(message)
        self.consumer_id = consumer_id


class PolicyConflictError(DispatcherError):
    """An attach names another failure policy than the existing subscription's (an attach
    never changes it: the admin route does)."""

    code = "policy_conflict"
    kind = ErrorKind.CONFLICT


class ConsumerNotFoundError(DispatcherError):
    """A poll, ack or nack by a consumer that is not attached (never was, or detached)."""

    code = "consumer_not_found"
    kind = ErrorKind.NOT_FOUND

    def __init__(self, message: str, *, consumer_id: str) -> None:
        super().__init__(message)
        self.consumer_id = consumer_id


class ConsumerDetachedError(ConsumerNotFoundError):
    """A request of a consumer the dispatcher detached because its messages kept timing out
    unacknowledged (docs/dispatcher.md, "Fair redelivery"); ``reason`` says how. Not
    retriable, and unlike ``consumer_not_found`` not a cue to attach again at once: the
    consumer's unacked messages went to the others, and a new attach starts a new consumer
    with a full window."""

    code = "consumer_detached"
    kind = ErrorKind.GONE

    def __init__(self, message: str, *, consumer_id: str, reason: str) -> None:
        super().__init__(message, consumer_id=consumer_id)
        self.reason = reason


class SubscriptionNotFoundError(DispatcherError):
    """A seek or stats of a subscription that does not exist (never attached, or deleted)."""

    code = "subscription_not_found"
    kind = ErrorKind.NOT_FOUND


class UnknownPartitionError(DispatcherError):
    """Messages for a partition the subscription does not read: a wiring bug."""

    code = "unknown_partition"

    def __init__(self, message: str, *, partition: str) -> None:
        super().__init__(message)
        self.partition = partition


class OffsetOutOfRangeError(DispatcherError):
    """A seek or start ``{"offset": N}`` past the end of ``partition``: N > ``end`` (the
    first offset not yet readable; N == end is fine, "the next message"). ``wal_start`` is
    where the WAL begins (offsets below it are read from the cloud tier, so they are fine)."""

    code = "offset_out_of_range"
    kind = ErrorKind.INVALID

    def __init__(
        self, message: str, *, partition: str, offset: int, wal_start: int, end: int
    ) -> None:
        super().__init__(message)
        self.partition = partition
        self.offset = offset
        self.wal_start = wal_start
        self.end = end


class PositionUnavailableError(DispatcherError):
    """A seek or start position that cannot be checked or resolved now: the partition's
    ingest owner did not tell its end, or the cloud tier did not answer a time search below
    the WAL. Nothing changed; the same request may succeed later."""

    code = "position_unavailable"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class AckNotDurableError(DispatcherError):
    """The cursor write that would make an ack durable did not land in time (etcd slow or
    down). Nothing is lost: the ack is applied in memory and written later, but until then a
    restart may deliver the message again; acking again is safe."""

    code = "ack_not_durable"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class ClaimRefusedError(DispatcherError):
    """A dispatcher of the queue group will not claim the subscription now (it holds its
    fair share, is drained, or just handed it over: docs/dispatcher.md, Balancing); the
    claimant retries and the queue group picks another member."""

    code = "claim_refused"
    kind = ErrorKind.UNAVAILABLE
    retriable = True


class DataDamagedError(DispatcherError):
    """A partition of the subscription stopped at offsets that no copy holds intact: the
    WAL and the cloud tier both failed their checks (or one is damaged and the other never
    had them). Nothing later of that partition is delivered until the range is repaired or
    an operator skips it (``danube admin subscriptions skip``). ``files`` names the damaged
    WAL segment and/or object."""

    code = "data_damaged"  # not retriable: polling again gives the same until someone acts

    def __init__(
        self, message: str, *, partition: str, from_offset: int, to_offset: int, files: list[str]
    ) -> None:
        super().__init__(message)
        self.partition = partition
        self.from_offset = from_offset
        self.to_offset = to_offset
        self.files = files


class PolicyLimitError(DispatcherError):
    """A topic's policy refuses the attach (docs/policies.md): ``too_many_subscriptions``,
    ``too_many_consumers`` (409)."""

    code = "policy_limit"
    kind = ErrorKind.CONFLICT
