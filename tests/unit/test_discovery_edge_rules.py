"""The discovery edge without servers: the Host header's name, the hosts allowed by default,
strict and bounded request models, and the OpenAPI's name patterns agreeing with the code."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from danube.config import DiscoveryConfig
from danube.discovery.doors.bodies.api import TopicSpec
from danube.discovery.doors.bodies.consume import AttachRequest
from danube.discovery.doors.http.middleware import host_name
from danube.discovery.doors.http.params import CONSUMER_ID_PATTERN
from danube.discovery.errors import BadRequestError, http_status
from danube.names import (
    SEGMENT_PATTERN,
    USER_TOPIC_PATTERN,
    InvalidNameError,
    user_topic,
    validate_segment,
)
from danube.wire.consume.models import INT64_MAX, FlowFrame

pytestmark = pytest.mark.unit

NAMEISH = st.text(alphabet="ab-_09.-part/ é\n", max_size=20)


@pytest.mark.parametrize(
    ("header", "name"),
    [
        (b"127.0.0.1:8080", "127.0.0.1"),
        (b"LocalHost", "localhost"),
        (b"[::1]:6650", "::1"),
        (b"[::1]", "::1"),
        (b"example.com:80", "example.com"),
        (b" discovery ", "discovery"),
    ],
)
def test_host_name_drops_the_port_and_the_brackets(header: bytes, name: str) -> None:
    assert host_name(header) == name


def test_hosts_allowed_by_default_are_the_loopback_names_and_the_bind_host() -> None:
    loopback = frozenset({"localhost", "127.0.0.1", "::1"})
    assert DiscoveryConfig().hosts_allowed() == loopback
    assert DiscoveryConfig(host="10.1.2.3").hosts_allowed() == loopback | {"10.1.2.3"}
    assert DiscoveryConfig(host="0.0.0.0").hosts_allowed() == loopback  # every address: no name
    assert DiscoveryConfig(allowed_hosts=["Discovery"]).hosts_allowed() == frozenset({"discovery"})
    assert DiscoveryConfig(allowed_hosts=["*"]).hosts_allowed() is None
    with pytest.raises(ValidationError):
        DiscoveryConfig(allowed_hosts=["http://discovery:8080/"])


@pytest.mark.parametrize("value", [True, "3", 3.0, 3.5, None])
def test_an_integer_field_takes_only_a_json_integer(value: object) -> None:
    with pytest.raises(ValidationError) as refused:
        TopicSpec.model_validate({"partitions": value})
    assert refused.value.errors()[0]["loc"] == ("partitions",)
    with pytest.raises(ValidationError):
        FlowFrame.model_validate_json(f'{{"type": "flow", "credits": {value!r}}}'.replace("'", '"'))


def test_a_position_past_its_range_names_its_own_field() -> None:
    with pytest.raises(ValidationError) as refused:
        AttachRequest.model_validate({"name": "c", "start": {"timestamp_ms": INT64_MAX + 1}})
    (error,) = refused.value.errors()
    assert error["type"] == "less_than_equal"  # not extra_forbidden from the offset shape
    assert [p for p in error["loc"] if not str(p).startswith("~")] == ["start", "timestamp_ms"]
    assert AttachRequest.model_validate({"name": "c", "start": {"offset": INT64_MAX}})


def test_an_unsupported_operation_is_a_400() -> None:
    assert http_status(BadRequestError("x", code="unsupported_operation")) == 400


def _valid(check: object, *args: str) -> bool:
    try:
        check(*args)  # type: ignore[operator]
    except InvalidNameError:
        return False
    return True


@given(NAMEISH)
def test_the_documented_segment_pattern_is_the_rule(value: str) -> None:
    documented = re.search(SEGMENT_PATTERN.replace("$", r"\Z"), value) is not None
    assert documented == _valid(validate_segment, "namespace", value)


@given(NAMEISH)
def test_the_documented_topic_pattern_is_the_rule(value: str) -> None:
    documented = re.search(USER_TOPIC_PATTERN.replace("$", r"\Z"), value) is not None
    assert documented == _valid(user_topic, "default", value)


def test_the_consumer_id_pattern_takes_the_ids_attach_answers() -> None:
    assert re.fullmatch(CONSUMER_ID_PATTERN, "default.orders.s.3f9c0a")
    for bad in ("default.orders.s", "a.b.c.d.e", "a.b c.d.e", "a..c.d"):
        assert not re.fullmatch(CONSUMER_ID_PATTERN, bad)
