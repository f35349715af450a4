"""The per-subscription failure policy: its bounds, defaults from the cluster config, the
fixed and exponential backoff schedules, and the machine's poison policies (block, drop,
dead_letter) including a policy changed on a live subscription; a property test of block."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from danube.config import DispatcherConfig
from danube.dispatcher.cursor import PartitionCursor
from danube.dispatcher.delivery import SubscriptionMachine
from danube.dispatcher.events import (
    Ack,
    Action,
    ConsumerAttached,
    DeadLetter,
    Deliver,
    MessagesAvailable,
    Nack,
    Poll,
    Seek,
    Tick,
)
from danube.dispatcher.keyed import KeySharedMachine
from danube.dispatcher.policy_admin import check_attach
from danube.dispatcher.redelivery import DeliverySettings, cluster_policy, resolve_policy
from danube.meta.failure_policy import Backoff, FailurePolicy, FailurePolicyIn
from danube.meta.records import SubscriptionConfig
from danube.wire.dispatcher.errors import PolicyConflictError

pytestmark = pytest.mark.unit


# --- the model ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"max_redeliveries": -1}, "max_redeliveries"),
        ({"max_redeliveries": 1001}, "max_redeliveries"),
        ({"ack_timeout_ms": 99}, "ack_timeout_ms"),
        ({"ack_timeout_ms": 3_600_001}, "ack_timeout_ms"),
        ({"backoff": {"kind": "linear"}}, "backoff.kind"),
        ({"backoff": {"base_ms": 0}}, "backoff.base_ms"),
        ({"backoff": {"base_ms": 500, "max_ms": 100}}, "backoff"),
        ({"poison_policy": "ignore"}, "poison_policy"),
        ({"dead_letter_topic": "no-slash"}, "dead_letter_topic"),
        ({"dead_letter_topic": "/a/b/c"}, "dead_letter_topic"),
        ({"dead_letter_topic": "/default/t-part-1"}, "dead_letter_topic"),
        ({"max_redelivery": 2}, "max_redelivery"),  # misspelt: refused, not ignored
        ({"backoff": {"kind": "fixed", "base": 2}}, "backoff.base"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(body: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError) as refused:
        FailurePolicyIn.model_validate(body)
    first = refused.value.errors()[0]
    assert ".".join(str(p) for p in first["loc"]).startswith(where)


def test_bounds_at_their_edges_are_accepted() -> None:
    policy = FailurePolicyIn.model_validate(
        {
            "max_redeliveries": 1000,
            "ack_timeout_ms": 100,
            "backoff": {"kind": "fixed", "base_ms": 7, "max_ms": 7},
            "poison_policy": "drop",
            "dead_letter_topic": "/ops/poison",
        }
    ).stored()
    assert type(policy) is FailurePolicy
    assert policy.max_redeliveries == 1000
    assert policy.backoff is not None
    assert policy.backoff.base_ms == 7


def test_a_stored_policy_ignores_fields_it_does_not_know() -> None:
    # A newer writer's field must not stop an older dispatcher reading the config.
    config = SubscriptionConfig.model_validate_json(
        b'{"type": "shared", "created_ms": 1, "failure_policy": '
        b'{"max_redeliveries": 3, "future": 1, "backoff": {"jitter": 0.5}}}'
    )
    assert config.failure_policy == FailurePolicy(
        max_redeliveries=3, backoff=Backoff(kind="exponential")
    )


def test_unset_fields_take_the_cluster_config() -> None:
    cluster = DispatcherConfig(
        ack_timeout_s=12.5, redelivery_base_s=0.25, redelivery_max_s=8, max_redeliveries=4
    )
    defaults = resolve_policy(cluster, None)
    assert defaults == cluster_policy(cluster)
    assert (defaults.max_redeliveries, defaults.ack_timeout_ms) == (4, 12_500)
    assert (defaults.backoff_kind, defaults.backoff_base_ms, defaults.backoff_max_ms) == (
        "exponential",
        250,
        8000,
    )
    assert (defaults.poison_policy, defaults.dead_letter_topic) == ("dead_letter", None)
    some = resolve_policy(
        cluster,
        FailurePolicy(max_redeliveries=1, backoff=Backoff(kind="fixed")),
    )
    assert (some.max_redeliveries, some.ack_timeout_ms) == (1, 12_500)
    assert (some.backoff_kind, some.backoff_base_ms) == ("fixed", 250)
    # A base above the cluster's maximum (max unset) raises the maximum to it.
    high = resolve_policy(cluster, FailurePolicy(backoff=Backoff(base_ms=20_000)))
    assert (high.backoff_base_ms, high.backoff_max_ms) == (20_000, 20_000)
    settings = DeliverySettings.from_config(
        cluster, FailurePolicy(ack_timeout_ms=500, poison_policy="block")
    )
    assert (settings.ack_timeout_s, settings.max_redeliveries) == (0.5, 4)
    assert settings.poison_policy == "block"


def test_backoff_schedules_fixed_and_exponential() -> None:
    fixed = DeliverySettings(redelivery_base_s=0.2, redelivery_max_s=5, backoff_kind="fixed")
    assert [fixed.delay_s(n, lambda: 1.0) for n in range(6)] == [0.2] * 6
    exp = DeliverySettings(redelivery_base_s=0.2, redelivery_max_s=1.0)
    # Equal jitter: the ceiling doubles up to the cap; rng 1.0 gives the ceiling itself.
    assert [round(exp.delay_s(n, lambda: 1.0), 6) for n in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert [round(exp.delay_s(n, lambda: 0.0), 6) for n in range(4)] == [0.1, 0.2, 0.4, 0.5]


def test_an_attach_may_repeat_or_omit_the_policy_but_not_change_it() -> None:
    stored = SubscriptionConfig(
        type="shared", created_ms=1, failure_policy=FailurePolicy(max_redeliveries=2)
    )
    check_attach(stored, None)
    check_attach(stored, FailurePolicy(max_redeliveries=2))
    with pytest.raises(PolicyConflictError) as refused:
        check_attach(stored, FailurePolicy(max_redeliveries=3))
    assert refused.value.code == "policy_conflict"
    with pytest.raises(PolicyConflictError):
        check_attach(stored.model_copy(update={"failure_policy": None}), FailurePolicy())


def test_a_policy_conflict_reads_as_a_sentence_not_a_python_dict() -> None:
    stored = SubscriptionConfig(
        type="shared",
        created_ms=1,
        failure_policy=FailurePolicy(max_redeliveries=2, backoff=Backoff(kind="fixed", base_ms=50)),
    )
    asked = FailurePolicy(max_redeliveries=3, poison_policy="drop")
    with pytest.raises(PolicyConflictError) as refused:
        check_attach(stored, asked)
    assert refused.value.message == (
        "the subscription has another failure policy: max_redeliveries 2, not 3; "
        "backoff fixed, base 50 ms, not the cluster's; poison_policy the cluster's, not drop. "
        "Attach without one, or change it first (PUT .../failure-policy, `danube admin "
        "subscriptions failure-policy set`)"
    )
    assert "{" not in refused.value.message


# --- the machine under each poison policy ------------------------------------------------


def _machine(poison: str, max_redeliveries: int = 1) -> SubscriptionMachine:
    settings = DeliverySettings(max_redeliveries=max_redeliveries, poison_policy=poison)  # type: ignore[arg-type]
    m = SubscriptionMachine("exclusive", {"p0": PartitionCursor(0)}, settings)
    m.handle(ConsumerAttached("c", "c"))
    return m


def _poll(m: SubscriptionMachine, now_s: float = 0.0, count: int = 10) -> list[tuple[int, int]]:
    actions = m.handle(Poll("c", count, now_s))
    m.validate()
    return [
        (msg.offset, msg.redelivery_count)
        for a in actions
        if isinstance(a, Deliver)
        for msg in a.messages
    ]


def _refuse(m: SubscriptionMachine, offset: int, times: int) -> list[Action]:
    """Poll and nack ``offset`` ``times`` times (polling one at a time); the last actions."""
    actions: list[Action] = []
    for _ in range(times):
        assert [o for o, _ in _poll(m, count=1)] == [offset]
        actions = m.handle(Nack("c", [("p0", offset)], 0, 0.0))
        m.validate()
    return actions


def _feed(m: SubscriptionMachine, offsets: Sequence[int]) -> None:
    m.handle(MessagesAvailable("p0", [(o, b"m%d" % o) for o in offsets]))


def test_drop_acks_the_poison_message_and_the_next_one_comes() -> None:
    m = _machine("drop")
    _feed(m, [0, 1])
    actions = _refuse(m, 0, 2)
    (letter,) = [a for a in actions if isinstance(a, DeadLetter)]
    assert (letter.dispose, letter.message.offset, letter.message.redelivery_count) == (
        "drop",
        0,
        2,
    )
    assert m.cursor("p0").next_offset == 1
    assert _poll(m) == [(1, 0)]


def test_dead_letter_is_the_default_disposal() -> None:
    m = _machine("dead_letter")
    _feed(m, [0])
    (letter,) = [a for a in _refuse(m, 0, 2) if isinstance(a, DeadLetter)]
    assert letter.dispose == "dead_letter"
    assert m.cursor("p0").next_offset == 1


def test_block_holds_the_partition_until_the_poison_message_is_acked() -> None:
    m = _machine("block")
    _feed(m, [0, 1, 2])
    actions = _refuse(m, 0, 2)
    assert not [a for a in actions if isinstance(a, DeadLetter)]
    assert m.blocked_at("p0") == (0, 2)
    assert m.cursor("p0").next_offset == 0
    assert _poll(m) == []  # neither 0 again nor anything past it
    assert _poll(m, now_s=3600.0) == []
    m.handle(Ack("c", [("p0", 0)]))
    m.validate()
    assert m.blocked_at("p0") is None
    assert m.cursor("p0").next_offset == 1
    assert _poll(m) == [(1, 0), (2, 0)]


def test_block_holds_back_redeliveries_past_it_but_not_before_it() -> None:
    m = _machine("block", max_redeliveries=0)
    _feed(m, [0, 1, 2])
    assert _poll(m) == [(0, 0), (1, 0), (2, 0)]
    m.handle(Nack("c", [("p0", 0), ("p0", 2)], 0, 0.0))  # 0 and 2 exhausted: 0 blocks
    assert m.blocked_at("p0") == (0, 1)
    m.handle(Nack("c", [("p0", 1)], 0, 0.0))
    assert _poll(m) == []
    m.handle(Seek({"p0": 3}, 0.0))  # an operator skips past them
    m.validate()
    assert m.blocked_at("p0") is None
    _feed(m, [3])
    assert _poll(m) == [(3, 0)]


def test_a_policy_change_judges_blocked_messages_again() -> None:
    m = _machine("block")
    _feed(m, [0, 1])
    _refuse(m, 0, 2)
    assert m.blocked_at("p0") == (0, 2)
    # A higher maximum: delivered once more.
    m.apply_settings(DeliverySettings(max_redeliveries=3, poison_policy="block"))
    m.validate()
    assert _poll(m, count=1) == [(0, 2)]
    m.handle(Nack("c", [("p0", 0)], 0, 0.0))
    assert _poll(m, count=1) == [(0, 3)]
    m.handle(Nack("c", [("p0", 0)], 0, 0.0))
    assert m.blocked_at("p0") == (0, 4)
    # No longer blocking: disposed of by the new policy, the partition moves on.
    actions = m.apply_settings(DeliverySettings(max_redeliveries=3, poison_policy="drop"))
    m.validate()
    assert [(a.dispose, a.message.offset) for a in actions if isinstance(a, DeadLetter)] == [
        ("drop", 0)
    ]
    assert _poll(m) == [(1, 0)]


def test_ack_timeouts_follow_the_policy_timeout_and_fixed_backoff() -> None:
    settings = DeliverySettings(
        ack_timeout_s=0.5, redelivery_base_s=2.0, redelivery_max_s=60, backoff_kind="fixed"
    )
    m = SubscriptionMachine("exclusive", {"p0": PartitionCursor(0)}, settings)
    m.handle(ConsumerAttached("c", "c"))
    _feed(m, [0])
    assert _poll(m, now_s=0.0) == [(0, 0)]
    m.handle(Tick(0.49))
    assert m.in_flight("c") == [("p0", 0)]
    m.handle(Tick(0.5))  # timed out, back in 2 s (fixed)
    assert _poll(m, now_s=2.49) == []
    assert _poll(m, now_s=2.5) == [(0, 1)]
    m.handle(Tick(3.0))  # timed out again: fixed, again 2 s
    assert _poll(m, now_s=4.99) == []
    assert _poll(m, now_s=5.0) == [(0, 2)]


_block_ops = st.lists(
    st.tuples(
        st.sampled_from(["feed", "poll", "poll", "nack", "nack", "ack", "tick"]),
        st.integers(0, 1),  # consumer
        st.integers(0, 11),  # offset (ack) or how many to feed
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(script=_block_ops)
def test_nothing_at_or_past_a_block_is_delivered_and_acks_lift_it(
    script: list[tuple[str, int, int]],
) -> None:
    settings_ = DeliverySettings(
        max_redeliveries=0, poison_policy="block", ack_timeout_s=1.0, redelivery_base_s=0.5
    )
    m = SubscriptionMachine(
        "shared", {"p0": PartitionCursor(0), "p1": PartitionCursor(0)}, settings_
    )
    for cid in ("c0", "c1"):
        m.handle(ConsumerAttached(cid, cid))
    fed = {"p0": 0, "p1": 0}
    now_s = 0.0
    for op, who, n in script:
        cid = f"c{who}"
        before = {p: m.blocked_at(p) for p in fed}
        if op == "feed":
            for partition in fed:
                start = fed[partition]
                offsets = range(start, start + n % 4)
                m.handle(MessagesAvailable(partition, [(o, b"x") for o in offsets]))
                fed[partition] = start + n % 4
        elif op == "poll":
            for action in m.handle(Poll(cid, 3, now_s)):
                for msg in action.messages if isinstance(action, Deliver) else ():
                    blocked = before[msg.partition]
                    assert blocked is None or msg.offset < blocked[0], (msg, blocked)
        elif op == "nack":
            held = m.in_flight(cid)
            if held:
                m.handle(Nack(cid, held[:1], 0, now_s))
        elif op == "ack":
            poison = [(p, at[0]) for p, at in before.items() if at is not None]
            if poison and n % 2 == 0:  # an operator acks the poison message itself
                m.handle(Ack(cid, poison[:1]))
                event("an ack lifted a block")
                assert m.blocked_at(poison[0][0]) != before[poison[0][0]]
            else:
                m.handle(Ack(cid, [("p0", n), ("p1", n)]))
        else:
            now_s += 0.6
            m.handle(Tick(now_s))
        m.validate()
        for partition in fed:
            at = m.blocked_at(partition)
            if at is not None:
                event("a partition blocked")
                assert at[1] == 1  # blocked after 1 + max_redeliveries refusals
                assert m.cursor(partition).next_offset <= at[0]  # the cursor never passes it


def test_under_key_shared_a_poison_message_blocks_only_its_key() -> None:
    settings_ = DeliverySettings(max_redeliveries=0, poison_policy="block")
    m = KeySharedMachine(
        {"p0": PartitionCursor(0)},
        settings_,
        key_of=lambda payload: payload[0] if isinstance(payload, tuple) else None,
    )
    m.handle(ConsumerAttached("c", "c"))
    keys = ["a", "b", "a", "b", None]
    m.handle(MessagesAvailable("p0", [(i, (k, i)) for i, k in enumerate(keys)]))

    def take(count: int) -> list[int]:
        actions = m.handle(Poll("c", count, 0.0))
        m.validate()
        return [msg.offset for a in actions if isinstance(a, Deliver) for msg in a.messages]

    assert take(1) == [0]  # key a's first
    m.handle(Nack("c", [("p0", 0)], 0, 0.0))  # refused once past the maximum: blocks key a
    m.validate()
    assert m.blocked_at("p0") == (0, 1)
    # Key a waits behind its poison message; key b and the keyless one go on.
    assert sorted(take(10)) == [1, 3, 4]
    m.handle(Ack("c", [("p0", 1), ("p0", 3), ("p0", 4)]))
    assert take(10) == []
    m.handle(Ack("c", [("p0", 0)]))  # handled out of band: key a goes on
    m.validate()
    assert m.blocked_at("p0") is None
    assert take(10) == [2]
