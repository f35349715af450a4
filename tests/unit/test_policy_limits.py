"""Policies without servers: inheritance (topic over namespace), a partition's share of a
topic's limits and its wire headers, the token bucket's admitted rate, the refusal's
Retry-After, and the request models' bounds."""

from __future__ import annotations

import pytest
import typer
from pydantic import ValidationError

from danube.cli.policies import parse_policies
from danube.discovery.doors.bodies.policies import PoliciesSpec, check_message_size
from danube.discovery.errors import BadRequestError
from danube.ingest.ratelimit import BURST_S, PublishRate, TokenBucket
from danube.meta.records import Policies
from danube.wire.limits import (
    PartitionLimits,
    backlog,
    for_partition,
    rate_limited_message,
    retry_after_ms,
)


def test_topic_policies_override_the_namespace_field_by_field() -> None:
    namespace = Policies(max_producers=5, publish_rate_msgs_s=100, max_message_bytes=10)
    topic = Policies(max_producers=2)
    effective = topic.over(namespace)
    assert effective.max_producers == 2
    assert effective.publish_rate_msgs_s == 100
    assert effective.max_message_bytes == 10
    assert effective.max_subscriptions is None
    assert topic.over(None) == topic


def test_a_partition_takes_an_even_share_of_the_rate_rounded_up() -> None:
    policies = Policies(publish_rate_msgs_s=100, publish_rate_bytes_s=1001)
    assert for_partition(policies, 0) == PartitionLimits(rate_msgs_s=100, rate_bytes_s=1001)
    share = for_partition(policies, 4)
    assert (share.rate_msgs_s, share.rate_bytes_s) == (25, 251)
    assert for_partition(Policies(publish_rate_msgs_s=2), 8).rate_msgs_s == 1


def test_limits_travel_in_headers_and_back() -> None:
    limits = for_partition(
        Policies(publish_rate_msgs_s=10, backlog_quota_messages=7, backlog_quota_policy="refuse"),
        0,
    )
    assert limits.headers() == {"Rate-Msgs": "10", "Backlog-Quota": "7", "Backlog-Policy": "refuse"}
    assert PartitionLimits.from_headers(limits.headers()) == limits
    # evict_oldest is the dispatchers' to apply: ingest is told nothing.
    evict = for_partition(
        Policies(backlog_quota_messages=7, backlog_quota_policy="evict_oldest"), 0
    )
    assert evict.empty
    assert evict.headers() == {}
    # A malformed header is no limit rather than a refused produce.
    assert PartitionLimits.from_headers({"Rate-Msgs": "-3", "Rate-Bytes": "x"}).empty


def test_the_refusal_names_how_long_to_wait() -> None:
    assert retry_after_ms(rate_limited_message("/default/t", 250)) == 250
    assert retry_after_ms("something else") is None


def test_a_bucket_admits_its_rate_over_ten_seconds_within_a_few_per_cent() -> None:
    rate = PublishRate()
    admitted, now_s = 0, 0.0
    while now_s < 10.0:  # a producer retrying every millisecond with batches of 3
        if rate.admit(200, None, 3, 30, now_s) == 0:
            admitted += 3
        now_s += 0.001
    assert 2000 <= admitted <= 2000 + 200 * BURST_S + 3


def test_a_refused_produce_takes_nothing_and_says_when_to_come_back() -> None:
    rate = PublishRate()
    assert rate.admit(10, None, 5, 0, 0.0) == 0  # the burst of 1 token, then a debt of 4
    wait_ms = rate.admit(10, None, 1, 0, 0.0)
    assert wait_ms == 400
    assert rate.admit(10, None, 1, 0, 0.399) > 0
    assert rate.admit(10, None, 1, 0, 0.401) == 0


def test_the_bytes_bucket_limits_on_its_own() -> None:
    rate = PublishRate()
    assert rate.admit(None, 1000, 1, 900, 0.0) == 0  # a batch larger than the burst passes
    assert rate.admit(None, 1000, 1, 10, 0.0) > 0
    assert rate.admit(None, 1000, 1, 10, 0.9) == 0


def test_a_lowered_rate_drops_the_tokens_above_its_burst() -> None:
    bucket = TokenBucket(1000.0)
    assert bucket.wait_s(0.0) == 0
    bucket.set_rate(10.0, 0.0)
    assert bucket.tokens == pytest.approx(1.0)


def test_backlog_counts_what_is_unacked_between_cursor_and_end() -> None:
    assert backlog(10, [12, 13, 40], 20) == 8
    assert backlog(20, [], 20) == 0
    assert backlog(5, [], None) is None


def test_policy_bounds_are_checked_and_name_the_field() -> None:
    with pytest.raises(ValidationError, match="max_producers"):
        PoliciesSpec.model_validate({"max_producers": 0})
    with pytest.raises(ValidationError, match="backlog_quota_policy"):
        PoliciesSpec.model_validate({"backlog_quota_policy": "drop"})
    with pytest.raises(BadRequestError, match=r"policies\.max_message_bytes"):
        check_message_size(PoliciesSpec(max_message_bytes=2000), 1000)
    check_message_size(PoliciesSpec(max_message_bytes=1000), 1000)


def test_a_patch_replaces_only_the_fields_it_gives() -> None:
    current = Policies(max_producers=3, publish_rate_msgs_s=50)
    patch = PoliciesSpec.model_validate({"publish_rate_msgs_s": None, "max_subscriptions": 2})
    assert patch.applied_to(current) == Policies(max_producers=3, max_subscriptions=2)


def test_the_cli_reads_policies_as_key_value_pairs() -> None:
    found = parse_policies(["max_producers=3", "backlog_quota_policy=evict_oldest"])
    assert found is not None
    assert found.body() == {"max_producers": 3, "backlog_quota_policy": "evict_oldest"}
    unset = parse_policies(["publish_rate_msgs_s=none"])
    assert unset is not None
    assert unset.body() == {"publish_rate_msgs_s": None}
    assert parse_policies(None) is None
    with pytest.raises(typer.BadParameter, match="max_producer"):
        parse_policies(["max_producer=3"])
    with pytest.raises(typer.BadParameter, match="integer"):
        parse_policies(["max_producers=many"])


def test_retention_mode_is_a_policy_like_the_others() -> None:
    patch = PoliciesSpec.model_validate({"retention_mode": "queue"})
    assert patch.applied_to(Policies(max_producers=3)) == Policies(
        max_producers=3, retention_mode="queue"
    )
    with pytest.raises(ValidationError, match="retention_mode"):
        PoliciesSpec.model_validate({"retention_mode": "acked"})
    # The namespace's mode holds where the topic sets none; a topic may opt out.
    namespace = Policies(retention_mode="queue")
    assert Policies().over(namespace).retention_mode == "queue"
    assert Policies(retention_mode="time_size").over(namespace).retention_mode == "time_size"
    found = parse_policies(["retention_mode=queue"])
    assert found is not None
    assert found.body() == {"retention_mode": "queue"}
