"""Delayed delivery from the SDK: the attributes that make a message due later, to pass as
``send(payload, attributes=...)`` (docs/client.md, "Delayed delivery")::

    await producer.send(b"reminder", attributes=deliver_after(30_000))
    await producer.send(b"report", attributes=deliver_at(1_767_225_600_000, {"kind": "daily"}))

Consumers of a shared or key-shared subscription get such a message no earlier than its
time; exclusive and failover subscriptions get it at once, in order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from danube.client.errors import InvalidMessageError
from danube.wire.delay import DelayError, delay_attributes


def deliver_after(delay_ms: int, attributes: Mapping[str, str] | None = None) -> dict[str, str]:
    """``attributes`` (or none) plus the one that delays the message ``delay_ms`` after its
    publish time (0 … ``DELAY_MS_MAX``); InvalidMessageError otherwise."""
    return _with(attributes, deliver_after_ms=delay_ms)


def deliver_at(unix_ms: int, attributes: Mapping[str, str] | None = None) -> dict[str, str]:
    """``attributes`` (or none) plus the one that holds the message until ``unix_ms``
    (not negative, at most ``DELAY_MS_MAX`` from now); InvalidMessageError otherwise."""
    return _with(attributes, deliver_at_ms=unix_ms)


def _with(
    attributes: Mapping[str, str] | None,
    *,
    deliver_at_ms: int | None = None,
    deliver_after_ms: int | None = None,
) -> dict[str, str]:
    try:
        delay = delay_attributes(
            deliver_at_ms=deliver_at_ms,
            deliver_after_ms=deliver_after_ms,
            now_ms=int(time.time() * 1000),
        )
    except DelayError as exc:
        raise InvalidMessageError(str(exc)) from exc
    return {**(attributes or {}), **delay}
