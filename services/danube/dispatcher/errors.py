"""Errors of the dispatcher, each with the HTTP status the edge answers it with.

::

    DanubeError
    └── DispatcherError              "dispatcher_error"                    500
        ├── SubscriptionTakenError   "subscription_taken"                  409
        ├── ConsumerExistsError      "consumer_exists"                     409
        ├── ConsumerNotFoundError    "consumer_not_found"                  404
        ├── SubscriptionNotFoundError "subscription_not_found"             404
        ├── UnknownPartitionError    "unknown_partition"                   500
        └── AckNotDurableError       "ack_not_durable" (retriable)         503

``SubscriptionTakenError`` is the refusal of a second consumer on an exclusive
subscription; the others are programming or protocol mistakes of the caller.
"""

from __future__ import annotations

from danube.errors import DanubeError


class DispatcherError(DanubeError):
    """Root of the dispatcher errors; ``status`` is the HTTP status it is answered with."""

    code = "dispatcher_error"
    status = 500


class SubscriptionTakenError(DispatcherError):
    """An exclusive subscription already has its consumer; ``holder`` is its id."""

    code = "subscription_taken"
    status = 409

    def __init__(self, message: str, *, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class ConsumerExistsError(DispatcherError):
    """A consumer id attached twice to one subscription."""

    code = "consumer_exists"
    status = 409

    def __init__(self, message: str, *, consumer_id: str) -> None:
        super().__init__(message)
        self.consumer_id = consumer_id


class ConsumerNotFoundError(DispatcherError):
    """A poll, ack or nack by a consumer that is not attached (never was, or detached)."""

    code = "consumer_not_found"
    status = 404

    def __init__(self, message: str, *, consumer_id: str) -> None:
        super().__init__(message)
        self.consumer_id = consumer_id


class SubscriptionNotFoundError(DispatcherError):
    """A seek or stats of a subscription that does not exist (never attached, or deleted)."""

    code = "subscription_not_found"
    status = 404


class UnknownPartitionError(DispatcherError):
    """Messages for a partition the subscription does not read: a wiring bug."""

    code = "unknown_partition"
    status = 500

    def __init__(self, message: str, *, partition: str) -> None:
        super().__init__(message)
        self.partition = partition


class AckNotDurableError(DispatcherError):
    """The cursor write that would make an ack durable did not land in time (etcd slow or
    down). Nothing is lost: the ack is applied in memory and written later, but until then a
    restart may deliver the message again; acking again is safe."""

    code = "ack_not_durable"
    status = 503
    retriable = True
