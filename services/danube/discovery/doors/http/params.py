"""The path parameters of the public API, with the naming rules (:mod:`danube.names`) given
in the OpenAPI as patterns and lengths.

They are documented here, and checked by the routes with :mod:`danube.names` (so a bad name
is ``400 invalid_name``, a bad consumer id ``400 invalid_consumer_id``, each saying which rule
it breaks). A topic name as a whole (``/<ns>/<topic>``) is at most 255 characters, which no
single parameter's schema can say.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from danube.names import MAX_NAME_CHARS, SEGMENT_CHARS, SEGMENT_PATTERN, USER_TOPIC_PATTERN

# The dispatcher's own id of a consumer: the last part of a public consumer id.
DISPATCHER_ID_CHARS_MAX = 128
_SEGMENT = f"[{SEGMENT_CHARS}]{{1,{MAX_NAME_CHARS}}}"
CONSUMER_ID_PATTERN = (
    f"^{_SEGMENT}\\.{_SEGMENT}\\.{_SEGMENT}\\.[{SEGMENT_CHARS}]{{1,{DISPATCHER_ID_CHARS_MAX}}}$"
)


def _segment(description: str, pattern: str = SEGMENT_PATTERN) -> object:
    schema = {"pattern": pattern, "minLength": 1, "maxLength": MAX_NAME_CHARS}
    return Path(description=description, json_schema_extra=schema)


Namespace = Annotated[str, _segment("A namespace: letters, digits, '_' and '-'.")]
Topic = Annotated[
    str,
    _segment(
        "A topic of the namespace: letters, digits, '_' and '-', not ending in -part-<N> "
        "(the names of a partitioned topic's partitions).",
        USER_TOPIC_PATTERN,
    ),
]
ProduceTopic = Annotated[
    str,
    _segment(
        "A topic of the namespace, or one partition of it (<topic>-part-<N>, an existing "
        "partition: never auto-created); letters, digits, '_' and '-'."
    ),
]
Subscription = Annotated[str, _segment("A subscription: letters, digits, '_' and '-'.")]
Partition = Annotated[
    str,
    _segment(
        "A partition: the topic itself (unpartitioned) or <topic>-part-<N>; letters, digits, "
        "'_' and '-'."
    ),
]
ConsumerId = Annotated[
    str,
    Path(
        description="A consumer id as attach answered it: <ns>.<topic>.<subscription>.<id>.",
        json_schema_extra={"pattern": CONSUMER_ID_PATTERN, "minLength": 7},
    ),
]
ProducerIdParam = Annotated[str, _segment("A producer session's id, as its open answered.")]
ProducerNameParam = Annotated[
    str,
    Path(
        description="A producer's name, as its records carry it (at most 256 UTF-8 bytes; "
        "percent-encoded in the path; a name holding '/' cannot be given here).",
        min_length=1,
        max_length=256,
    ),
]
NodeIdParam = Annotated[
    str,
    Path(
        description="A node's id (NodeRecord.node_id): letters, digits, '.', '_' and '-'.",
        json_schema_extra={"pattern": "^[A-Za-z0-9._-]{1,128}$", "minLength": 1},
    ),
]
