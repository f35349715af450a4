"""The ``--policy KEY=VALUE`` option of ``danube admin namespaces|topics`` (docs/policies.md):
one option for every policy, so a new policy needs no new flag. The server checks names and
bounds (400 naming the field)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from danube.client.admin import Policies

PolicyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--policy",
        help=(
            "KEY=VALUE, repeatable: max_producers, max_subscriptions, "
            "max_consumers_per_subscription, publish_rate_msgs_s, publish_rate_bytes_s, "
            "max_message_bytes, backlog_quota_messages, message_id_window_s, message_ttl_s, "
            "max_chunked_message_bytes "
            "(integers), "
            "backlog_quota_policy (refuse|evict_oldest), retention_mode (time_size|queue); "
            "VALUE 'none' unsets it (inherited)."
        ),
    ),
]

_TEXT_FIELDS = frozenset({"backlog_quota_policy", "retention_mode"})


def parse_policies(given: list[str] | None) -> Policies | None:
    """The policies given as ``KEY=VALUE``; None when none is given. BadParameter names
    the malformed one."""
    from danube.client import Policies

    if not given:
        return None
    fields: dict[str, Any] = {}
    for item in given:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in Policies.model_fields:
            known = ", ".join(Policies.model_fields)
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE with KEY one of {known}")
        raw = raw.strip()
        if raw.lower() in ("none", "null", ""):
            fields[key] = None
        elif key in _TEXT_FIELDS:
            fields[key] = raw
        else:
            try:
                fields[key] = int(raw)
            except ValueError as exc:
                raise typer.BadParameter(f"{item!r}: {key} takes an integer") from exc
    return Policies.model_validate(fields)


def policies_text(policies: Policies) -> str:
    """The policies set, ``key value`` comma-separated (``none`` when none is)."""
    set_ = policies.model_dump(exclude_none=True)
    return ", ".join(f"{k} {v}" for k, v in set_.items()) or "none"
