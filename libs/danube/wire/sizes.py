"""The sizes every contract shares, and the one check that the largest message travels.

Every body between services is one NATS message, at most the server's ``max_payload``
(1 MiB by default). A body never takes all of it: its headers (trace id, deadline, the
partition's limits) and a reply's own fields travel in the same message. Each service used to
keep its own margin for them; :data:`BUS_HEADROOM_BYTES` is the one margin, and
:func:`check_message_fits` checks once, when a service connects, that the largest record a
cluster accepts (``ingest.max_message_bytes`` of payload, its fields, its frame header) still
fits with it — a cluster configured otherwise would accept messages it can never carry.
"""

from __future__ import annotations

from danube.config.errors import ConfigError
from danube.frame import FRAME_HEADER_BYTES

BUS_HEADROOM_BYTES = 4096
"""Room kept in every bus message for its headers and a body's own fields."""

RECORD_OVERHEAD_BYTES = 64 * 1024
"""What a record's fields around its payload (producer, key, attributes) may add."""


def body_limit(max_payload_bytes: int) -> int:
    """The most bytes a body may take in a bus message of ``max_payload_bytes``."""
    return max_payload_bytes - BUS_HEADROOM_BYTES


def largest_message_bytes(max_message_bytes: int) -> int:
    """The bus bytes of the largest message a cluster accepts: its payload, its record's
    fields, its frame header and the headroom."""
    return max_message_bytes + RECORD_OVERHEAD_BYTES + FRAME_HEADER_BYTES + BUS_HEADROOM_BYTES


def check_message_fits(max_payload_bytes: int, max_message_bytes: int) -> None:
    """Raise :class:`ConfigError` (``bad_config``) when the largest message does not fit in
    one bus message."""
    needed = largest_message_bytes(max_message_bytes)
    if needed > max_payload_bytes:
        raise ConfigError(
            f"ingest.max_message_bytes of {max_message_bytes} does not fit the bus: the largest "
            f"message takes {needed} bytes with its record fields and headers, over the NATS "
            f"server's max_payload of {max_payload_bytes}; lower ingest.max_message_bytes to "
            f"{max(0, max_payload_bytes - (needed - max_message_bytes))} or raise the server's "
            "max_payload"
        )
