"""The NATS bus every service of the mesh talks over.

::

    bus = await Bus.connect(config.bus, name="ingest")
    await bus.serve(bus.subjects.produce("/default/orders-part-0"), handle_produce)
    reply = await bus.request(bus.subjects.wal_stats(topic), b"", timeout_s=2.0)
    await bus.close()  # drains: requests already taken still get their replies

Bodies are raw bytes end to end. Every request carries its absolute deadline; errors raised by a
remote handler come back as :class:`RemoteError` with the same ``code``. ``docs/bus.md`` lists the
subjects, headers, error codes and limits. :class:`TopicName`, :func:`topic_name` and
:class:`InvalidNameError` are those of :mod:`danube.names`, re-exported for convenience.
"""

from danube.bus.connection import Bus
from danube.bus.errors import (
    BusError,
    BusTimeoutError,
    DeadlineExceededError,
    InvalidSubjectError,
    NoRespondersError,
    NotConnectedError,
    PayloadTooLargeError,
    RemoteError,
)
from danube.bus.messages import Handler, Message, MessageCallback, Reply, Request
from danube.bus.protocol import (
    ERROR_CODE_HEADER,
    ERROR_MESSAGE_HEADER,
    RETRIABLE_HEADER,
    TIMEOUT_HEADER,
)
from danube.bus.rpc import Responder
from danube.bus.subjects import (
    CLOUD_READER_QUEUE,
    DispatchOp,
    Kind,
    ParsedSubject,
    Subjects,
    validate_op,
)
from danube.bus.subscription import Subscription
from danube.names import InvalidNameError, TopicName, topic_name

__all__ = [
    "CLOUD_READER_QUEUE",
    "ERROR_CODE_HEADER",
    "ERROR_MESSAGE_HEADER",
    "RETRIABLE_HEADER",
    "TIMEOUT_HEADER",
    "Bus",
    "BusError",
    "BusTimeoutError",
    "DeadlineExceededError",
    "DispatchOp",
    "Handler",
    "InvalidNameError",
    "InvalidSubjectError",
    "Kind",
    "Message",
    "MessageCallback",
    "NoRespondersError",
    "NotConnectedError",
    "ParsedSubject",
    "PayloadTooLargeError",
    "RemoteError",
    "Reply",
    "Request",
    "Responder",
    "Subjects",
    "Subscription",
    "TopicName",
    "topic_name",
    "validate_op",
]
