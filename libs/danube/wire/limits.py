"""The limits a produce carries to a partition's leader, and the refusals it answers
(docs/policies.md): the wire contract between the front doors and ingest.

A front door resolves a topic's policies (topic over namespace over cluster) and sends,
with every produce request to a partition, that partition's share of them in bus headers::

    Rate-Msgs       messages per second this partition takes (integer >= 1)
    Rate-Bytes      record bytes per second this partition takes (integer >= 1)
    Backlog-Quota   most messages any subscription may have unacknowledged in it
    Backlog-Policy  "refuse" (a produce past the quota is refused); "evict_oldest" is the
                    dispatchers' to apply, so ingest ignores it
    Message-Id-Window-S
                    seconds within which a repeated message id is answered with the first
                    one's offset (danube.ingest.message_ids)

A header that is absent means no limit. The leader of a partition is its only writer, so a
token bucket there holds cluster-wide whatever the number of front doors; a topic's rate is
the sum over its partitions, split evenly (:func:`for_partition`).

The leader refuses with the codes below (retriable); ``rate_limited`` says in its message
how long to wait (:func:`retry_after_ms`), which a front door answers as ``Retry-After``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from danube.meta.records import Policies

RATE_MSGS_HEADER = "Rate-Msgs"
RATE_BYTES_HEADER = "Rate-Bytes"
BACKLOG_QUOTA_HEADER = "Backlog-Quota"
BACKLOG_POLICY_HEADER = "Backlog-Policy"
MESSAGE_ID_WINDOW_HEADER = "Message-Id-Window-S"

RATE_LIMITED = "rate_limited"
BACKLOG_QUOTA_EXCEEDED = "backlog_quota_exceeded"
_RETRY_AFTER = re.compile(r"retry after (\d{1,12}) ms")


@dataclass(frozen=True, slots=True)
class PartitionLimits:
    """One partition's share of its topic's limits (``None``: no limit)."""

    rate_msgs_s: int | None = None
    rate_bytes_s: int | None = None
    backlog_quota: int | None = None
    backlog_refuse: bool = False
    message_id_window_s: int | None = None

    @property
    def empty(self) -> bool:
        """Whether nothing is limited (no header is sent)."""
        return (
            self.rate_msgs_s is None
            and self.rate_bytes_s is None
            and not self.refuses
            and self.message_id_window_s is None
        )

    @property
    def refuses(self) -> bool:
        """Whether a produce past the backlog quota is refused here."""
        return self.backlog_quota is not None and self.backlog_refuse

    def headers(self) -> dict[str, str]:
        """The bus headers carrying these limits."""
        found: dict[str, str] = {}
        if self.rate_msgs_s is not None:
            found[RATE_MSGS_HEADER] = str(self.rate_msgs_s)
        if self.rate_bytes_s is not None:
            found[RATE_BYTES_HEADER] = str(self.rate_bytes_s)
        if self.refuses:
            found[BACKLOG_QUOTA_HEADER] = str(self.backlog_quota)
            found[BACKLOG_POLICY_HEADER] = "refuse"
        if self.message_id_window_s is not None:
            found[MESSAGE_ID_WINDOW_HEADER] = str(self.message_id_window_s)
        return found

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> PartitionLimits:
        """The limits a request carries; a header that is not a positive integer is ignored
        (a malformed limit must not stop produces)."""
        quota = _positive(headers.get(BACKLOG_QUOTA_HEADER))
        return cls(
            rate_msgs_s=_positive(headers.get(RATE_MSGS_HEADER)),
            rate_bytes_s=_positive(headers.get(RATE_BYTES_HEADER)),
            backlog_quota=quota,
            backlog_refuse=quota is not None and headers.get(BACKLOG_POLICY_HEADER) == "refuse",
            message_id_window_s=_positive(headers.get(MESSAGE_ID_WINDOW_HEADER)),
        )


def _positive(raw: str | None) -> int | None:
    if raw is None or not raw.isdigit() or len(raw) > 19:
        return None
    value = int(raw)
    return value if value >= 1 else None


def _share(limit: int | None, partitions: int) -> int | None:
    # At least 1 per partition: a limit below the partition count is rounded up to it.
    return None if limit is None else max(1, math.ceil(limit / partitions))


def for_partition(policies: Policies, partitions: int) -> PartitionLimits:
    """The share of one of ``partitions`` (0: an unpartitioned topic) of a topic's
    effective ``policies``: rates split evenly (rounded up); the backlog quota is per
    subscription and partition, as the backlog a dispatcher counts."""
    count = max(partitions, 1)
    return PartitionLimits(
        rate_msgs_s=_share(policies.publish_rate_msgs_s, count),
        rate_bytes_s=_share(policies.publish_rate_bytes_s, count),
        backlog_quota=policies.backlog_quota_messages,
        # A quota set with no policy refuses (the default).
        backlog_refuse=policies.backlog_quota_messages is not None
        and (policies.backlog_quota_policy or "refuse") == "refuse",
        message_id_window_s=policies.message_id_window_s,
    )


def rate_limited_message(partition: str, retry_after_ms: int) -> str:
    """The message of a ``rate_limited`` refusal (parsed back by :func:`retry_after_ms`)."""
    return f"{partition} is over its publish rate; retry after {retry_after_ms} ms"


def retry_after_ms(message: str) -> int | None:
    """The wait a ``rate_limited`` message names, if any."""
    found = _RETRY_AFTER.search(message)
    return None if found is None else int(found.group(1))


def backlog(next_offset: int, acked_beyond: Iterable[int], end_offset: int | None) -> int | None:
    """Unacked offsets in ``[next_offset, end_offset)`` of a subscription's partition (its
    cursor and the out-of-order acks beyond it); ``None`` when the end is unknown. A cursor
    at or past the end has none. Exact: a partition's offsets are contiguous."""
    if end_offset is None:
        return None
    if end_offset <= next_offset:
        return 0
    acked = sum(1 for offset in acked_beyond if next_offset <= offset < end_offset)
    return end_offset - next_offset - acked


def total(backlogs: Iterable[int | None]) -> int:
    """The sum over partitions whose backlog is known (an unknown one counts as 0: its
    own entry says ``None``)."""
    return sum(b for b in backlogs if b is not None)
