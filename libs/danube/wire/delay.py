"""Delayed delivery, the producer's side: a message is given to consumers of a shared or
key-shared subscription no earlier than its delivery time (docs/policies.md, "Delayed
delivery"). The time travels in the record as one of two attributes, so every way of
producing (HTTP JSON, the binary body, Danube's gRPC ``attributes`` map, the SDK) carries it
the same way, and the dispatcher alone acts on it:

- ``danube.deliver_at_ms``: Unix milliseconds;
- ``danube.deliver_after_ms``: milliseconds after the record's publish time.

A record with both is judged by ``deliver_at_ms``. The doors that take the time as a field
(HTTP JSON, the SDK's helper, the CLI) refuse a negative one, both at once, or one more than
``DELAY_MS_MAX`` ahead; a dispatcher reading an attribute that is not such a number
delivers the message at once (as it ignores a bad ``danube.ttl_ms``).
"""

from __future__ import annotations

from collections.abc import Mapping

DELIVER_AT_ATTRIBUTE = "danube.deliver_at_ms"
"""The record attribute holding a message's delivery time, Unix ms (a whole number)."""
DELIVER_AFTER_ATTRIBUTE = "danube.deliver_after_ms"
"""The record attribute holding a message's delay after its publish time, ms."""
# How far ahead a delivery time may be: a dispatcher holds each delayed message's place
# (and its copy in the delay index) that long. Ten days, as Pulsar's common setting.
DELAY_MS_MAX = 10 * 86_400_000


class DelayError(ValueError):
    """A delivery time that is refused (negative, both forms, or too far ahead)."""


def delay_attributes(
    *, deliver_at_ms: int | None = None, deliver_after_ms: int | None = None, now_ms: int
) -> dict[str, str]:
    """The attributes that delay a message as asked (empty when neither is given);
    :class:`DelayError` naming the field for a time that is refused. ``now_ms`` is the
    wall clock ``deliver_at_ms`` is judged against (the publish time, near enough)."""
    if deliver_at_ms is not None and deliver_after_ms is not None:
        raise DelayError("give deliver_at_ms or deliver_after_ms, not both")
    if deliver_after_ms is not None:
        if type(deliver_after_ms) is not int or not 0 <= deliver_after_ms <= DELAY_MS_MAX:
            raise DelayError(f"deliver_after_ms must be a whole number in 0 … {DELAY_MS_MAX}")
        return {DELIVER_AFTER_ATTRIBUTE: str(deliver_after_ms)}
    if deliver_at_ms is not None:
        if type(deliver_at_ms) is not int or deliver_at_ms < 0:
            raise DelayError("deliver_at_ms must be a whole number of Unix ms, not negative")
        if deliver_at_ms - now_ms > DELAY_MS_MAX:
            raise DelayError(
                f"deliver_at_ms is {deliver_at_ms - now_ms} ms ahead; at most {DELAY_MS_MAX}"
            )
        return {DELIVER_AT_ATTRIBUTE: str(deliver_at_ms)}
    return {}


def deliver_at_ms(attributes: Mapping[str, str], publish_time_ms: int) -> int | None:
    """When a record with ``attributes`` is due (Unix ms), None when it is not delayed or
    its value is not a whole number in bounds (then it is delivered at once). A time more
    than ``DELAY_MS_MAX`` after the publish time is held to that bound."""
    at = attributes.get(DELIVER_AT_ATTRIBUTE)
    if at is not None:
        if not at.isdigit():
            return None
        return min(int(at), publish_time_ms + DELAY_MS_MAX)
    after = attributes.get(DELIVER_AFTER_ATTRIBUTE)
    if after is None or not after.isdigit():
        return None
    return publish_time_ms + min(int(after), DELAY_MS_MAX)
