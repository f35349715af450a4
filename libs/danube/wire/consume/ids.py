"""The public consumer id, ``<ns>.<topic>.<sub>.<dispatcher consumer id>``: what is needed
to find a consumer's subscription again on any door (name segments never contain dots)."""

from __future__ import annotations

import re

from danube.errors import BadRequestError
from danube.meta import TopicName
from danube.names import SEGMENT_CHARS, InvalidNameError, user_topic, validate_segment

# The dispatcher's own id of a consumer: the last part of a public consumer id.
DISPATCHER_ID_CHARS_MAX = 128
_DISPATCHER_ID = re.compile(f"[{SEGMENT_CHARS}]{{1,{DISPATCHER_ID_CHARS_MAX}}}")
INVALID_CONSUMER_ID = "invalid_consumer_id"


def consumer_id(topic: TopicName, sub: str, dispatcher_id: str) -> str:
    """The public id of a consumer the dispatcher knows as ``dispatcher_id``."""
    return f"{topic.namespace}.{topic.topic}.{sub}.{dispatcher_id}"


def parse_consumer_id(value: str) -> tuple[TopicName, str, str]:
    """``(topic, subscription, dispatcher id)`` of a public consumer id; BadRequestError
    ``invalid_consumer_id`` when it is not one."""
    parts = value.split(".")
    if len(parts) != 4 or not _DISPATCHER_ID.fullmatch(parts[3]):
        raise BadRequestError(f"{value[:200]!r} is not a consumer id", code=INVALID_CONSUMER_ID)
    ns, topic, sub, dispatcher_id = parts
    try:
        name = user_topic(ns, topic)
        validate_segment("subscription", sub)
    except InvalidNameError as exc:
        raise BadRequestError(
            f"{value[:200]!r} is not a consumer id: {exc.message}", code=INVALID_CONSUMER_ID
        ) from exc
    return name, sub, dispatcher_id
