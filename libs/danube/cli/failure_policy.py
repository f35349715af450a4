"""`danube admin subscriptions failure-policy get|set`: a subscription's failure policy
(docs/cli.md), as Danube's ``danube-admin topics set-failure-policy``; the options that
build a policy are shared with ``danube consume`` (a new subscription's policy)."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from danube.cli._common import Json, ServiceAddr, connect, err, out, print_json, run

if TYPE_CHECKING:
    from rich.table import Table

    from danube.client.subscriptions import FailurePolicy, FailurePolicyInfo

app = typer.Typer(help="Show or replace a subscription's failure policy.", no_args_is_help=True)

ADMIN_TIMEOUT_S = 5.0

TopicArg = Annotated[str, typer.Argument(help="/<namespace>/<topic>, or <topic> in default.")]
SubArg = Annotated[str, typer.Argument(help="The subscription.")]


class BackoffKind(StrEnum):
    fixed = "fixed"
    exponential = "exponential"


class Poison(StrEnum):
    block = "block"
    drop = "drop"
    dead_letter = "dead-letter"


_POISON: dict[Poison, Literal["block", "drop", "dead_letter"]] = {
    Poison.block: "block",
    Poison.drop: "drop",
    Poison.dead_letter: "dead_letter",
}

# Bounds as the server's (danube.meta.failure_policy); it answers 400 past them anyway.
MaxRedeliveries = Annotated[
    int | None,
    typer.Option(
        "--max-redeliveries", min=0, max=1000, help="Deliveries after the first, at most."
    ),
]
AckTimeoutMs = Annotated[
    int | None,
    typer.Option("--ack-timeout-ms", min=100, max=3_600_000, help="Unacked this long: taken back."),
]
BackoffOpt = Annotated[
    BackoffKind | None, typer.Option("--backoff", help="Redelivery backoff after an ack timeout.")
]
BackoffBaseMs = Annotated[
    int | None, typer.Option("--backoff-base-ms", min=1, max=86_400_000, help="Its first wait.")
]
BackoffMaxMs = Annotated[
    int | None,
    typer.Option("--backoff-max-ms", min=1, max=86_400_000, help="Its longest wait."),
]
PoisonOpt = Annotated[
    Poison | None,
    typer.Option("--poison", help="A message refused past the maximum: block, drop, dead-letter."),
]
DeadLetterTopic = Annotated[
    str | None,
    typer.Option("--dead-letter-topic", help="/ns/topic for dead letters (default <topic>-dlq)."),
]


def build_policy(
    max_redeliveries: int | None,
    ack_timeout_ms: int | None,
    backoff: BackoffKind | None,
    backoff_base_ms: int | None,
    backoff_max_ms: int | None,
    poison: Poison | None,
    dead_letter_topic: str | None,
) -> FailurePolicy | None:
    """The policy the options name; None when no option was given."""
    from danube.client import Backoff, FailurePolicy

    backoff_set = (backoff, backoff_base_ms, backoff_max_ms) != (None, None, None)
    policy = FailurePolicy(
        max_redeliveries=max_redeliveries,
        ack_timeout_ms=ack_timeout_ms,
        backoff=Backoff(
            kind=(backoff or BackoffKind.exponential).value,
            base_ms=backoff_base_ms,
            max_ms=backoff_max_ms,
        )
        if backoff_set
        else None,
        poison_policy=None if poison is None else _POISON[poison],
        dead_letter_topic=dead_letter_topic,
    )
    return policy if policy.body() else None


def _table(info: FailurePolicyInfo) -> Table:
    from rich.table import Table  # here: `danube consume` imports this module to start

    from danube.client import FailurePolicy

    table = Table("field", "set", "in effect")
    set_ = info.policy or FailurePolicy()
    effect = info.effective

    def shown(value: object) -> str:
        return "(cluster)" if value is None else str(value)

    set_backoff, effect_backoff = set_.backoff, effect.backoff
    rows = [
        ("max_redeliveries", set_.max_redeliveries, effect.max_redeliveries),
        ("ack_timeout_ms", set_.ack_timeout_ms, effect.ack_timeout_ms),
        ("backoff", set_backoff and set_backoff.kind, effect_backoff and effect_backoff.kind),
        (
            "backoff_base_ms",
            set_backoff and set_backoff.base_ms,
            effect_backoff and effect_backoff.base_ms,
        ),
        (
            "backoff_max_ms",
            set_backoff and set_backoff.max_ms,
            effect_backoff and effect_backoff.max_ms,
        ),
        ("poison_policy", set_.poison_policy, effect.poison_policy),
        ("dead_letter_topic", set_.dead_letter_topic, effect.dead_letter_topic),
    ]
    for name, was_set, in_effect in rows:
        table.add_row(name, shown(was_set), shown(in_effect))
    return table


def _show(info: FailurePolicyInfo, json_out: bool) -> None:
    if json_out:
        print_json(info.model_dump())
    else:
        out.print(_table(info))


@app.command("get")
def get(
    topic: TopicArg,
    subscription: SubArg,
    service_addr: ServiceAddr = "http://127.0.0.1:6650",
    json_out: Json = False,
) -> None:
    """A subscription's failure policy: as set and as in effect (unset: the cluster's)."""

    async def main() -> None:
        async with connect(service_addr, timeout_s=ADMIN_TIMEOUT_S) as client:
            _show(await client.admin.failure_policy(topic, subscription), json_out)

    run("admin subscriptions failure-policy get", main())


@app.command("set")
def set_(
    topic: TopicArg,
    subscription: SubArg,
    max_redeliveries: MaxRedeliveries = None,
    ack_timeout_ms: AckTimeoutMs = None,
    backoff: BackoffOpt = None,
    backoff_base_ms: BackoffBaseMs = None,
    backoff_max_ms: BackoffMaxMs = None,
    poison: PoisonOpt = None,
    dead_letter_topic: DeadLetterTopic = None,
    service_addr: ServiceAddr = "http://127.0.0.1:6650",
    json_out: Json = False,
) -> None:
    """Replace a subscription's failure policy: what is not given takes the cluster's
    value. The dispatcher serving it applies it at once."""
    policy = build_policy(
        max_redeliveries,
        ack_timeout_ms,
        backoff,
        backoff_base_ms,
        backoff_max_ms,
        poison,
        dead_letter_topic,
    )

    async def main() -> None:
        from danube.client import FailurePolicy

        async with connect(service_addr, timeout_s=ADMIN_TIMEOUT_S) as client:
            info = await client.admin.set_failure_policy(
                topic, subscription, policy or FailurePolicy()
            )
            err.print(f"failure policy of {subscription} on {topic} replaced")
            _show(info, json_out)

    run("admin subscriptions failure-policy set", main())
