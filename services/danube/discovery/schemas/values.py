"""What a registration answers (:mod:`danube.discovery.schemas.registry`), and the checks of the
registry's inputs that need no etcd: policies, metadata sizes. (Versions, bindings and
subject names are danube.admission.schema_reads'.)"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from danube.discovery.errors import BadRequestError
from danube.meta.records import SCHEMA_TAGS_MAX, ValidationPolicy
from danube.schemas import SchemaError

DESCRIPTION_CHARS_MAX = 4096
CREATED_BY_CHARS_MAX = 256
TAG_CHARS_MAX = 128
VALIDATION_POLICIES: tuple[ValidationPolicy, ...] = ("none", "warn", "enforce")


@dataclass(frozen=True, slots=True)
class Registered:
    """What a registration answered: the subject's id, the version, whether this call
    created it, and the definition's fingerprint."""

    schema_id: int
    version: int
    is_new: bool
    fingerprint: str


def now_ms() -> int:
    return int(time.time() * 1000)


def bad_request(exc: SchemaError) -> BadRequestError:
    """``invalid_schema`` (its message says where) or ``invalid_mode``, as a 400."""
    return BadRequestError(exc.message, code=exc.code)


def check_policy(value: str) -> ValidationPolicy:
    for known in VALIDATION_POLICIES:
        if value.lower() == known:  # Danube's protocol takes any case
            return known
    raise BadRequestError(
        f"validation_policy {value!r} is not one of {list(VALIDATION_POLICIES)}",
        code="invalid_policy",
    )


def check_metadata(description: str, created_by: str, tags: Sequence[str]) -> tuple[str, ...]:
    if len(description) > DESCRIPTION_CHARS_MAX:
        raise BadRequestError(
            f"description over {DESCRIPTION_CHARS_MAX} characters", code="bad_request"
        )
    if len(created_by) > CREATED_BY_CHARS_MAX:
        raise BadRequestError(f"created_by over {CREATED_BY_CHARS_MAX} characters")
    if len(tags) > SCHEMA_TAGS_MAX or any(not 0 < len(t) <= TAG_CHARS_MAX for t in tags):
        raise BadRequestError(
            f"at most {SCHEMA_TAGS_MAX} tags of 1..{TAG_CHARS_MAX} characters each"
        )
    return tuple(tags)
